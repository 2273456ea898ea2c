"""needle's top-k arm: questions answered from their top-k routed pages composed side by side."""

import json

import pytest

from graftjax.studies import needle

_ARMS = dict(
  model_name='tiny',
  dtype='float32',
  needles=3,
  page_tokens=128,
  pages_per_window=2,
  answer_tokens=2,
  chunk_size=64,
  question_chunk=8,
  progress=False,
)


@pytest.mark.slow
def test_the_top_k_arm_runs_exactly_on_the_xla_split_attention():
  result = needle.experiment(**_ARMS, impl='xla_split', position_scheme='rope_relative', top_k=2)
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
    needle.experiment(**_ARMS, impl='xla', position_scheme='rope_relative', top_k=2)
  with pytest.raises(needle.NeedleError, match="needs 'rope_relative'"):
    needle.experiment(**_ARMS, impl='xla_split', top_k=2)
