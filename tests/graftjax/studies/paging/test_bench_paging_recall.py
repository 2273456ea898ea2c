"""bench_paging_recall: overlap against boundary facts, routing over mixed page sizes."""

import json

import numpy as np
import pytest

from graftjax.routing import units as units_lib
from graftjax.studies.paging import bench_paging_recall
from graftjax.studies.paging import needle


def _filler(count: int, words_per_line: int = 10) -> list[str]:
  rng = np.random.default_rng(0)
  words = [f'w{i}' for i in range(300)]
  return [
    '\n'.join(' '.join(rng.choice(words, words_per_line)) for _ in range(20)) for _ in range(count)
  ]


def test_experiment_measures_overlap_and_routing():
  result = bench_paging_recall.experiment(
    bench_paging_recall.Settings(
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
    ),
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
  recall = result['routing']['candidate_recall']
  assert recall['router'] == 'bm25_units' and list(recall['direct']) == ['1', '4', '16', '64']
  assert recall['direct']['4'] == routers['bm25_units']['direct']['top4']  # the same first stage
  lines = 1 + 3 * len(routers) + 2 * len(bench_paging_recall.WORDINGS)
  assert bench_paging_recall.format_rows(result).count('\n') == lines
  json.dumps(result)


def test_candidate_recall_grows_with_the_candidates_and_reaches_every_page():
  entries, questions = bench_paging_recall.mixed_store(
    _filler(12), facts=12, absent=2, short_pages=200, seed=0
  )
  recall = bench_paging_recall.candidate_recall(
    entries, questions, router=units_lib.UnitRouter(threshold=0.0), sizes=[1, 4, 256]
  )
  for wording in bench_paging_recall.WORDINGS:
    found = [recall[wording][c]['successes'] for c in ('1', '4', '256')]
    assert found == sorted(found) and recall[wording]['1']['trials'] == 12
    plus = [recall[f'{wording}_plus_rare'][c]['successes'] for c in ('1', '4', '256')]
    assert all(p >= f for p, f in zip(plus, found))  # a union holds what its part does
  # every question names its person, whose page holds both names: the whole store finds it
  assert recall['direct']['256']['successes'] == 12
  alone = bench_paging_recall.candidate_recall(
    entries, questions, router=units_lib.UnitRouter(threshold=0.0), sizes=[4], rare=0
  )
  assert alone['reworded_plus_rare'] == alone['reworded']  # no rare-word candidates
  for sizes in ([], [0, 4]):
    with pytest.raises(ValueError, match='candidate counts must be integers >= 1'):
      bench_paging_recall.candidate_recall(
        entries, questions, router=units_lib.UnitRouter(threshold=0.0), sizes=sizes
      )


def test_routing_rows_fit_a_threshold_on_half_and_report_on_the_other():
  entries, questions = bench_paging_recall.mixed_store(
    _filler(8), facts=8, absent=4, short_pages=10, seed=0
  )
  rows = bench_paging_recall.routing_rows(
    entries, questions, router=units_lib.UnitRouter(threshold=0.0), thresholds=[0.0]
  )
  fit = rows['calibrated']
  assert fit['sizes']['calibration'] == {'deposited': 4, 'reworded': 4, 'unrelated': 4}
  assert fit['sizes']['report'] == fit['sizes']['calibration']
  assert fit['report']['false_hit']['trials'] == 4 and fit['report']['reworded']['trials'] == 4


def test_mixed_store_takes_a_needle_set():
  entries, questions = bench_paging_recall.mixed_store(
    _filler(4), facts=4, absent=1, short_pages=6, seed=0, needle_set='unseen'
  )
  templates, notes = bench_paging_recall.NEEDLE_SETS['unseen']
  names = [name for name, _ in needle.make_needles(5, 0)]
  for i, (q, name) in enumerate(zip(questions, names)):
    assert q.reworded == templates[i % 4].reworded.format(name=name)
    assert q.key == (f'long/{i}' if i < 4 else None)
  assert all(text.startswith(notes) for key, text in entries if key.startswith('short/'))
  with pytest.raises(ValueError, match="needle_set must be one of .*got 'five'"):
    bench_paging_recall.mixed_store(
      _filler(4), facts=4, absent=1, short_pages=6, seed=0, needle_set='five'
    )


@pytest.mark.slow  # ~20-60 s on two shared cores: the tiny model's rerank forwards
def test_hybrid_arms_fit_the_weight_and_rerank(tiny_model):
  entries, questions = bench_paging_recall.mixed_store(
    _filler(4, words_per_line=1), facts=4, absent=2, short_pages=6, seed=0
  )
  encode = lambda text: [3 + b % 253 for b in text.encode()]
  arms = bench_paging_recall.model_routers(
    entries,
    questions,
    model=tiny_model,
    weights=[1.0, 0.5],
    rerank=bench_paging_recall.Rerank(pages=2),
    thresholds=[0.0],
    seed=0,
    encode=encode,
  )
  mix, reranked = arms['hybrid_mix'], arms['hybrid_rerank']
  assert [f['weight'] for f in mix['weight_fit']] == [1.0, 0.5]
  assert mix['weight'] == reranked['weight'] in (1.0, 0.5) and reranked['rerank'] == 2
  for wording in ('direct', 'reworded'):
    assert reranked[wording]['questions'] == 4
    assert reranked[wording]['top4']['successes'] <= mix[wording]['top4']['successes']  # 2 kept


def test_routing_rows_route_the_wordings_asked_and_calibrate_only_with_both():
  entries, questions = bench_paging_recall.mixed_store(
    _filler(8), facts=8, absent=4, short_pages=10, seed=0
  )
  rows = bench_paging_recall.routing_rows(
    entries,
    questions,
    router=units_lib.UnitRouter(threshold=0.0),
    thresholds=[0.0],
    wordings=['reworded'],
  )
  assert set(rows) == {'reworded'} and rows['reworded']['questions'] == 8
  both = bench_paging_recall.routing_rows(
    entries, questions, router=units_lib.UnitRouter(threshold=0.0), thresholds=[0.0]
  )
  assert rows['reworded'] == both['reworded'] and 'calibrated' in both
  for wordings in ([], ['paraphrased']):
    with pytest.raises(ValueError, match='wordings must be some of'):
      bench_paging_recall.routing_rows(
        entries, questions, router=units_lib.UnitRouter(threshold=0.0), thresholds=[0.0],
        wordings=wordings,
      )  # fmt: skip


@pytest.mark.slow  # ~20-60 s on two shared cores: the tiny model's rerank forwards
def test_the_rerank_arm_takes_rare_word_candidates_and_one_wording(tiny_model):
  entries, questions = bench_paging_recall.mixed_store(
    _filler(4, words_per_line=1), facts=4, absent=2, short_pages=6, seed=0, needle_set='unseen'
  )
  arms = bench_paging_recall.model_routers(
    entries,
    questions,
    model=tiny_model,
    weights=[1.0],
    rerank=bench_paging_recall.Rerank(pages=1, rare=1, wordings=['reworded']),
    thresholds=[0.0],
    seed=0,
    encode=lambda text: [3 + b % 253 for b in text.encode()],
  )
  reranked = arms['hybrid_rerank']
  assert (reranked['rerank'], reranked['rerank_rare'], reranked['rerank_weighting']) == (
    1,
    1,
    'idf',
  )
  assert 'direct' not in reranked and 'calibrated' not in reranked
  assert reranked['reworded']['questions'] == 4 and reranked['rerank_seconds_per_query'] > 0
  assert 'hybrid_rerank_reworded' in bench_paging_recall._summary([], arms)
