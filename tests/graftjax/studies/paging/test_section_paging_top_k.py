"""The paging section shows a needle result's top-1 and top-k arms side by side."""

from graftjax.studies.common import results_page
from graftjax.studies.paging import section_paging as paging


def _rate(successes, trials, low, high):
  return {'successes': successes, 'trials': trials, 'low': low, 'high': high}


def _needle(top_k: bool) -> results_page.Result:
  summary = {
    'needles': 24,
    'stored_pages': 26,
    'stored_tokens': 13312,
    'base_window_tokens': 2045,
    'page_access_median_s': 0.07,
    'paged_first_logits_equal_fresh_prefill': True,
  }
  rates = {
    'paged': _rate(20, 24, 0.64, 0.93),
    'base': _rate(18, 24, 0.55, 0.88),
    'routing': _rate(22, 24, 0.74, 0.98),
  }
  if top_k:
    summary.update(topk_k=4, topk_access_median_s=0.5, topk_first_logits_equal_fresh_prefill=True)
    rates.update(topk=_rate(19, 24, 0.6, 0.91), routing_topk=_rate(24, 24, 0.86, 1.0))
  data = {
    'experiment': 'needle',
    'result_sha256': '0' * 64,
    'position_scheme': 'rope_relative',
    'impl': 'xla_split',
    'summary': summary,
    'rates': rates,
  }
  return results_page.Result(name='paging/needle.json', data=data)


def test_top_1_and_top_k_side_by_side_with_wilson_intervals():
  text = '\n'.join(paging.render([_needle(top_k=True)]))
  for figure in (
    'Top-1 and top-4 side by side (rope_relative, impl xla_split)',
    '| top-1 page, own position | 20/24 [64.0%, 93.0%] | 22/24 [74.0%, 98.0%] | 0.07 | yes |',
    '| top-4 pages composed | 19/24 [60.0%, 91.0%] | 24/24 [86.0%, 100.0%] | 0.5 | yes |',
    '| base, whole window | 18/24 [55.0%, 88.0%] | - | - | - |',
  ):
    assert figure in text, figure
  assert 'side by side' not in '\n'.join(paging.render([_needle(top_k=False)]))
