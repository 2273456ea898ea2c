"""paging_scale: a store grown from real text, measured at each size, resumable."""

import dataclasses
import json

import numpy as np
import pytest

from graftjax import store as store_lib
from graftjax.paging import catalog as catalog_lib
from graftjax.studies.common import corpus
from graftjax.studies.paging import figures
from graftjax.studies.paging import paging_scale


@pytest.mark.slow
def test_plan_cuts_real_text_into_pages_of_bos_and_one_file():
  plan = paging_scale.plan_pages(corpus.ByteTokenizer(), page_tokens=16, num_pages=20, seed=0)
  assert plan.ids.shape == (20, 16) and len(set(plan.sources)) == 20
  assert (plan.ids[:, 0] == 2).all()
  assert len({row.tobytes() for row in plan.ids}) == 20  # no page twice (one key per page)
  path, offset = plan.sources[0].rsplit('@', 1)
  text = (corpus.stdlib_root() / path).read_bytes()
  assert bytes(plan.ids[0, 1:].tolist()) == text[int(offset) : int(offset) + 15]
  again = paging_scale.plan_pages(corpus.ByteTokenizer(), page_tokens=16, num_pages=20, seed=0)
  assert again.digest() == plan.digest()


@pytest.fixture(scope='module')
def grown(tmp_path_factory):
  folder = tmp_path_factory.mktemp('scale') / 'store'
  settings = paging_scale.Settings(
    model_name='tiny',
    dtype='float32',
    impl='xla',
    store_dir=folder,
    page_tokens=32,  # one chunk: one prefill shape per batch size
    local_rows=0,
    window_slots=256,
    sizes=[8, 3],  # measured smallest first, whatever the order given
    queries=4,
    chunk_size=32,
    threads=2,
  )
  return folder, settings, paging_scale.experiment(settings, progress=False)


def _run(settings, **changes):
  return paging_scale.experiment(dataclasses.replace(settings, **changes), progress=False)


@pytest.mark.slow
def test_result_holds_the_summary_the_results_page_reads(grown):
  _, _, result = grown
  s = result['summary']
  assert s['complete'] and s['window_slots'] == 256
  assert s['stored_tokens'] == 8 * 32 and set(s['access_latency_s']) == {'3', '8'}
  assert all(v > 0 for v in s['access_latency_s'].values())
  assert s['install_byte_exact'] is False  # xla: the install crosses cache shapes
  assert s['bytes_on_disk'] > 0 and s['live_array_bytes']['8'] > 0
  assert [r['pages'] for r in result['rows']] == [3, 8]
  # Which stdlib files the plan picks varies by Python build: routing quality is measured, not tested.
  assert all(0.0 <= r['top1_own_page'] <= 1.0 for r in result['rows'])
  json.dumps(result)


def test_a_second_run_resumes_without_adding_or_remeasuring(grown):
  folder, settings, first = grown
  again = _run(settings)
  assert again['builds'] == [] and again['rows'] == first['rows']
  with catalog_lib.Catalog(folder / catalog_lib.FILENAME) as catalog:
    assert len(catalog) == 8
    key = catalog.keys()[0]
  meta = store_lib.BlockStore(folder).get(key).meta  # local_rows=0: a global-layers-only page
  assert meta.compact and meta.tail_layers and meta.tail_rows == 0


def test_a_run_past_its_deadline_stops_and_says_so(tmp_path, grown):
  _, settings, _ = grown
  result = _run(settings, store_dir=tmp_path / 's', deadline_s=0.0)
  assert not result['summary']['complete'] and result['rows'] == []
  assert result['stored_pages_now'] == 0


def test_a_plan_for_other_arguments_is_refused(tmp_path, grown):
  _, settings, _ = grown
  _run(settings, store_dir=tmp_path / 's', sizes=[2], queries=1)
  with pytest.raises(ValueError, match='holds a plan'):
    _run(settings, store_dir=tmp_path / 's', page_tokens=40)


def test_figure_is_written_beside_the_result(tmp_path, grown):
  _, _, result = grown
  (path,) = figures.write_figure(result, tmp_path / 'r.json')
  assert path == tmp_path / 'r.png' and path.read_bytes()[:4] == b'\x89PNG'
  assert figures.write_figure({**result, 'rows': []}, tmp_path / 'e.json') == []
  assert np.isfinite(result['summary']['access_max_deviation_from_smallest'])


@pytest.mark.slow
def test_batched_pages_are_byte_equal_to_pages_made_alone_under_invariant_kernels():
  model = paging_scale.load_model('tiny', dtype='float32', impl='pallas')
  # Two chunks of one width: the second reads the cache the first wrote, one shape per batch.
  plan = paging_scale.plan_pages(corpus.ByteTokenizer(), page_tokens=32, num_pages=2, seed=0)
  kwargs = dict(capacity=paging_scale.prefill_capacity(32), chunk_size=16, local_rows=0)
  together = paging_scale.make_pages(model, plan.ids, **kwargs)
  for row, page in zip(plan.ids, together):
    (alone,) = paging_scale.make_pages(model, row[None], **kwargs)
    assert page.layout == alone.layout
    assert np.asarray(page.block.k).tobytes() == np.asarray(alone.block.k).tobytes()
    assert np.asarray(page.block.v).tobytes() == np.asarray(alone.block.v).tobytes()
    assert page.block.meta.token_ids == tuple(int(t) for t in row)
  # The comparison can fail: another row's page differs.
  assert np.asarray(together[0].block.k).tobytes() != np.asarray(together[1].block.k).tobytes()


@pytest.mark.slow
def test_batched_growth_stores_each_planned_page_once(tmp_path, grown):
  _, settings, first = grown
  result = _run(settings, store_dir=tmp_path / 's', batch=3)
  assert result['prefill_batch'] == 3 and result['summary']['complete']
  assert [b['pages_added'] for b in result['builds']] == [3, 5]  # 8 = 3 + 5, padded batches
  assert result['inputs']['sha256_page_ids'] == first['inputs']['sha256_page_ids']


def test_a_plan_made_alone_is_the_plan_the_run_uses(tmp_path, grown):
  _, settings, first = grown
  plan = paging_scale.plan_only(
    model_name='tiny',
    dtype='float32',
    impl='xla',
    store_dir=tmp_path / 's',
    page_tokens=32,
    num_pages=8,
    seed=0,
  )
  assert (
    plan.made_with.startswith('Python ') and plan.digest() == first['inputs']['sha256_page_ids']
  )
  result = _run(settings, store_dir=tmp_path / 's', sizes=[8])
  assert plan.made_with in result['corpus']


def test_summary_gives_each_stage_and_the_uncontended_latency_by_size(grown):
  _, _, result = grown
  s = result['summary']
  assert set(s['stage_median_s']) == set(s['access_p10_s']) == {'3', '8'}
  for size, stages in s['stage_median_s'].items():
    assert set(stages) == {'route', 'read_verify', 'install'} and all(
      v > 0 for v in stages.values()
    )
    assert s['access_p10_s'][size] <= s['access_latency_s'][size]
  assert s['access_p10_max_deviation_from_smallest'] >= 0.0
