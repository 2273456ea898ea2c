"""needle's top-k arm: questions answered from their top-k routed pages composed side by side."""

import functools
import json

import pytest

from graftjax.studies.paging import needle

_ARMS = dict(
  model_name='tiny',
  dtype='float32',
  needles=3,
  page_tokens=128,
  pages_per_window=2,
  answer_tokens=2,
  chunk_size=64,
  question_chunk=8,
)


@functools.cache
def _top_2(threshold):
  """The top-2 arm's result on the XLA split attention (threshold None: compose both pages)."""
  return needle.experiment(
    needle.Settings(
      **_ARMS,
      impl='xla_split',
      position_scheme='rope_relative',
      top_k=2,
      topk_threshold=threshold,
    ),
    progress=False,
  )


@pytest.mark.slow
def test_the_top_k_arm_runs_exactly_on_the_xla_split_attention():
  result = _top_2(None)
  s = result['summary']
  assert result['top_k'] == 2 and result['position_scheme'] == 'rope_relative'
  assert s['topk_k'] == 2 and result['window_capacity'] % 256 == 0
  assert result['window_capacity'] >= 2 * 256 + 1  # two whole pages and the question
  for key in ('topk_accuracy', 'routing_topk'):
    low, high = s[f'{key}_wilson95']['low'], s[f'{key}_wilson95']['high']
    assert 0 <= low <= s[key] <= high <= 1
  assert s['routing_topk'] >= s['routing_top1']
  assert s['topk_first_logits_equal_fresh_prefill'] is True
  assert s['paged_first_logits_equal_fresh_prefill'] is True
  assert result['rates']['topk']['trials'] == 3
  assert all(len(r['topk_routed_pages']) == 2 for r in result['rows'])
  assert 'top-2 composed' in needle.format_summary(result)
  json.dumps(result)


def test_the_top_k_arm_refuses_a_model_that_cannot_compose():
  with pytest.raises(needle.NeedleError, match='top-2 arm cannot compose'):
    needle.experiment(
      needle.Settings(**_ARMS, impl='xla', position_scheme='rope_relative', top_k=2), progress=False
    )
  with pytest.raises(needle.NeedleError, match="needs 'rope_relative'"):
    needle.experiment(needle.Settings(**_ARMS, impl='xla_split', top_k=2), progress=False)


def _pages_of(rows):
  """{needle page source: planted name} of the rows."""
  return {f'{needle.NEEDLE_SOURCE} {r["page"]}': r['name'] for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize('threshold', [None, float('inf')])
def test_the_top_k_arm_composes_only_pages_above_its_threshold_and_counts_interference(
  threshold,
):
  result = _top_2(threshold)
  rows, s = result['rows'], result['summary']
  assert result['topk_threshold'] == threshold
  composed = 1 if threshold else 2  # above an infinite threshold: the best page alone
  assert all(r['topk_composed'] == len(r['topk_routed_pages']) == composed for r in rows)
  assert s['topk_pages_composed_mean'] == composed
  holder = _pages_of(rows)
  for r in rows:  # one template: every other needle composed beside is a same-template fact
    beside = {holder.get(p) for p in r['topk_routed_pages']} - {None, r['name']}
    assert r['topk_same_template_composed'] == len(beside)
    assert r['topk_confused_with_composed'] == (r['topk_confused_with'] in beside)
  with_, without = (
    s['topk_accuracy_same_template_composed'],
    s['topk_accuracy_no_same_template_composed'],
  )
  assert sum(x['n'] for x in (with_, without) if x) == len(rows)
  assert (with_ is None) == (threshold is not None)  # a single page holds one fact
  assert s['topk_confusions_with_composed'] == sum(r['topk_confused_with_composed'] for r in rows)
  assert 'composed beside a same-template fact' in needle.format_summary(result)
