"""The paging section's routing table: a router run on one wording, the first stage's recall."""

from graftjax.studies.common import results_page
from graftjax.studies.paging import section_paging as paging


def _rate(successes, trials=80):
  return {'successes': successes, 'trials': trials, 'low': 0.5, 'high': 0.9}


def _recall(with_candidates: bool) -> results_page.Result:
  rows = lambda n: {'top1': _rate(n), 'top4': _rate(n + 1)}
  routing = {
    'long_pages': 80,
    'short_pages': 1517,
    'absent_questions': 2,
    'templates': [{}] * 4,
    'routers': {
      'bm25_units': {'direct': rows(70), 'reworded': rows(31)},
      'hybrid_rerank': {'reworded': rows(77)},  # the rerank run on reworded questions only
    },
  }
  if with_candidates:
    by_size = lambda *found: {c: _rate(n) for c, n in zip(('1', '16', '4'), found)}
    routing['candidate_recall'] = {
      'router': 'bm25_units',
      'rare': 4,
      'direct': by_size(61, 80, 79),
      'direct_plus_rare': by_size(78, 80, 80),
      'reworded': by_size(31, 68, 37),
      'reworded_plus_rare': by_size(80, 80, 80),
    }
  data = {'experiment': 'bench_paging_recall', 'result_sha256': '0' * 64, 'routing': routing}
  return results_page.Result(name='paging/recall.json', data=data)


def test_a_router_run_on_one_wording_shows_the_other_as_not_applicable():
  text = '\n'.join(paging._paging_recall(_recall(False)))
  (row,) = [line for line in text.splitlines() if line.startswith('| hybrid_rerank')]
  assert row.count('n/a') == 2 + 1 + 3  # direct top-1/top-4, threshold, three rates at it
  assert '77/80' in row and 'top 16' not in text  # no candidate table before it was measured


def test_the_first_stage_recall_by_candidate_count_in_numeric_order():
  text = '\n'.join(paging._paging_recall(_recall(True)))
  assert '| questions | top 1 | top 4 | top 16 |' in text
  (row,) = [line for line in text.splitlines() if line.startswith('| reworded |')]
  assert row.split('|')[2:5] == [
    ' 31/80 [50.0%, 90.0%] ',
    ' 37/80 [50.0%, 90.0%] ',
    ' 68/80 [50.0%, 90.0%] ',
  ]
  assert '| reworded + top 4 by rare words | 80/80' in text
