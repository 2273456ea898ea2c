"""bench_paging_recall: overlap against boundary facts, routing over mixed page sizes."""

import json

import numpy as np

from graftjax.studies import bench_paging_recall


def _filler(count: int) -> list[str]:
  rng = np.random.default_rng(0)
  words = [f'w{i}' for i in range(300)]
  return ['\n'.join(' '.join(rng.choice(words, 10)) for _ in range(20)) for _ in range(count)]


def test_experiment_measures_overlap_and_routing():
  result = bench_paging_recall.experiment(
    model_name='tiny',
    page_tokens=128,
    overlaps=[0, 64],
    boundary_facts=3,
    facts=8,
    absent=4,
    short_pages=20,
    thresholds=[0.0, 0.5],
    chunk_size=64,
    seed=0,
    filler=_filler(16),
    command='test',
  )
  plain, overlapped = result['overlap']
  assert plain['stored_tokens_per_document_token'] == 1.0
  assert overlapped['stored_tokens_per_document_token'] > 1.0
  assert overlapped['stored_bytes_per_document_token'] > plain['stored_bytes_per_document_token']
  assert plain['boundary_facts_whole_in_routed_page']['successes'] == 0  # cut by construction
  assert overlapped['pages'] > plain['pages'] and overlapped['access_median_s'] > 0
  assert [r['overlap'] for r in result['gemma3_270m_bfloat16_bytes']] == [0, 64]
  routers = result['routing']['routers']
  assert set(routers) == set(bench_paging_recall.ROUTERS)
  assert routers['bm25_units']['direct']['questions'] == 8
  assert bench_paging_recall.format_rows(result).count('\n') == 1 + 2 * len(routers)
  json.dumps(result)
