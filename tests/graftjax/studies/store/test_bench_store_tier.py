"""bench_store_tier on a tiny config: restore from S3 against file and the raw GET floor."""

import pathlib

import pytest
from graftjax.models.gemma import config as config_lib

from graftjax import ledger
from graftjax.studies.store import bench_store_tier
from graftjax.studies.store import local_s3
from graftjax.studies.common import results_page
from graftjax.studies.store import section_store_tier as section

RESULT = (
  pathlib.Path(__file__).parents[4]
  / 'experiments'
  / 'results'
  / 'store_tier'
  / 'store_tier_cpu.json'
)


def test_the_bench_times_restore_floor_and_file_side_by_side():
  pytest.importorskip('moto.server')
  settings = bench_store_tier.Settings(
    config='tiny', tokens=(8, 16), pages=3, page_tokens=4, repeats=1, page_repeats=1, sweep=(2,)
  )

  result = bench_store_tier.experiment(settings, log=None, command='python bench')

  assert [row['tokens'] for row in result['rows']] == [8, 16]
  assert [row['concurrency'] for row in result['concurrency_sweep']] == [2]
  assert result['concurrency_sweep'][0]['tokens'] == 16
  for row in [*result['rows'], result['pages'], *result['concurrency_sweep']]:
    for column in ('s3_restore', 'file_restore', 'floor', 'verified_floor', 'small_files'):
      assert row[column]['best_s'] > 0
    assert row['restore_over_floor_best'] == row['s3_restore']['best_s'] / row['floor']['best_s']
    assert len(row['s3_restore']['times_s']) == len(row['floor']['times_s']) == 1
    assert row['restore_over_floor_paired'] == (
      row['s3_restore']['times_s'][0] / row['floor']['times_s'][0]
    )
  layers = config_lib.get_config('tiny').num_layers  # a chunk of k and of v per layer
  assert result['pages']['blocks'] == 3
  assert result['pages']['objects'] == 3 * (2 * layers + 1 + 3 + 1)  # positions, zarr, manifest
  assert {row['concurrency'] for row in result['rows']} == {settings.concurrency}
  assert result['rows'][1]['bytes'] > result['rows'][0]['bytes']
  rendered = dict(result, result_sha256='0' * 64)
  lines = section.render([results_page.Result('store_tier/x.json', rendered)])
  assert any(line.startswith('| 2 |') for line in lines)  # the sweep's row
  assert set(result['inputs']) == {
    'blocks_sha256_8_tokens',
    'blocks_sha256_16_tokens',
    'blocks_sha256_pages',
  }
  assert result['summary']['goal_met_from_4k'] is None  # no size of 4k tokens or more
  assert 'CPU-local-server' in result['timing']
  for secret in (local_s3.AWS_ENV['AWS_ACCESS_KEY_ID'], 'secret'):
    assert secret not in str(result)  # the credentials are never recorded


def test_the_committed_result_renders_and_keeps_its_goal():
  if not RESULT.is_file():
    pytest.skip(f'{RESULT} is not committed')
  data = ledger.verify_result(RESULT)
  lines = section.render([results_page.Result('store_tier/store_tier_cpu.json', data)])

  assert any('restore / floor' in line for line in lines)
  goal = [r['restore_over_floor_paired'] <= 1.5 for r in data['rows'] if r['tokens'] >= 4096]
  assert data['summary']['goal_met_from_4k'] == all(goal)
