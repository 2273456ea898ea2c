"""experiments/bench_graft.py on the tiny model: runs, and its graft reproduces the recompute bits."""

import pytest
import pathlib
import subprocess
import sys

from graftjax import ledger

SCRIPT = pathlib.Path(__file__).parents[4] / 'experiments' / 'bench_graft.py'


@pytest.mark.slow
@pytest.mark.parametrize('local_cache', ['full', 'ring'])
def test_bench_graft_smoke(tmp_path, local_cache):
  out = tmp_path / 'bench.json'
  proc = subprocess.run(
    [
      sys.executable,
      str(SCRIPT),
      '--model=tiny',
      '--prefix_tokens=40,96',
      '--chunk_size=32',
      '--repeats=1',
      '--recompute_chunks=16,0',
      f'--local_cache={local_cache}',
      f'--out={out}',
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = ledger.verify_result(out)
  assert [row['prefix_tokens'] for row in result['rows']] == [40, 96]
  assert result['local_cache'] == local_cache
  assert result['bf16_dense_peak_flops'] is None and 'CPU' in result['mfu_note']
  for row in result['rows']:
    assert row['graft_logits_equal_recompute']
    stages = row['graft_stages_median_s']
    assert row['restore_s'] == stages['read_s'] + stages['install_s']
    assert row['restore_over_floor'] > 0 and row['speedup'] > 0
    assert row['restore_first_read_over_floor'] > 0
    assert 0 < row['restore_best_s'] <= row['restore_s']
    assert row['restore_best_over_floor'] == row['restore_best_s'] / row['floor_s']
    assert set(row['stages_s']) == {
      'floor_read',
      'floor_copy',
      'hash',
      'verified_read',
      'restore_read',
      'restore_copy_dispatch',
      'restore_install',
    }
    # the floor and the restore timed in turns: medians of each stage, set side by side
    side = row['side_by_side']
    median = side['median_s']
    assert side['rounds'] == 3 and row['restore_over_floor_side_by_side'] == (
      median['restore'] / median['floor']
    )
    assert {'restore_read', 'restore_install', 'floor_hash_one_thread', 'floor_xla_write'} <= set(
      median
    )
    assert all(rate > 0 for rate in side['rates_Bps'].values())
    # the prefix in chunks of 16, then in one call; the fastest is the recompute
    sweep = row['recompute_sweep']
    assert [(r['chunk_size'], r['one_call']) for r in sweep] == [
      (16, False),
      (row['prefix_tokens'], True),
    ]
    best = min(sweep, key=lambda r: r['median_s'])
    assert row['recompute_chunk_size'] == best['chunk_size']
    assert row['recompute_first_token_s'] == best['median_s']
    assert row['graft_over_recompute'] == row['graft_first_token_s'] / best['median_s']
    assert row['prefill_tokens_per_s'] == row['prefix_tokens'] / best['median_s']
    assert row['model_flops'] > 0 and row['mfu'] is None
