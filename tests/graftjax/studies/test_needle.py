"""needle: facts planted at known places, answered paged and by the base model."""

import pytest
import json

from graftjax.studies import corpus
from graftjax.studies import needle
from graftjax.studies import paging_scale


def test_facts_are_planted_whole_at_their_offsets():
  tokenizer = corpus.ByteTokenizer()
  page_ids, planted = needle.plant(
    tokenizer, needles=5, page_tokens=160, pages_per_window=2, margin=16, seed=0
  )
  assert page_ids.shape == (6, 160) and len(planted) == 5
  assert len({n.name for n in planted}) == 5 and len({n.number for n in planted}) == 5
  for n in planted:
    text = paging_scale.decode(tokenizer, page_ids[n.page][n.offset :])
    assert text.startswith(n.fact), (text[:60], n.fact)
  assert needle.first_number(' 4821.') == 4821 and needle.first_number('none') is None


@pytest.mark.slow
def test_experiment_runs_both_arms_with_wilson_intervals():
  result = needle.experiment(
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
  s = result['summary']
  assert s['needles'] == 3 and s['stored_pages'] == 4 and s['base_window_tokens'] == 255
  for arm in ('paged', 'base', 'routing_top1'):
    key = arm if arm == 'routing_top1' else f'{arm}_accuracy'
    low, high = s[f'{key}_wilson95']['low'], s[f'{key}_wilson95']['high']
    assert 0 <= low <= s[key] <= high <= 1
  assert s['routing_top1'] == 1.0  # the names are distinct words in a 4-page catalog
  assert s['paged_first_logits_equal_fresh_prefill'] is True
  assert all({'paged_right', 'base_right', 'access_s'} <= set(r) for r in result['rows'])
  json.dumps(result)


@pytest.mark.slow
def test_needles_join_a_grown_store_and_route_over_all_of_it(tmp_path):
  kwargs = dict(model_name='tiny', dtype='float32', progress=False)
  grown = paging_scale.experiment(
    **kwargs,
    impl='xla',
    store_dir=tmp_path,
    page_tokens=128,
    local_rows=0,
    window_slots=512,
    sizes=[6],
    queries=2,
    chunk_size=64,
    threads=2,
  )
  result = needle.experiment(
    **kwargs,
    store_dir=str(tmp_path),
    needles=2,
    page_tokens=128,
    pages_per_window=2,
    answer_tokens=1,
    chunk_size=64,
    question_chunk=8,
  )
  s = result['summary']
  assert s['needle_pages'] == 2 and s['stored_pages'] == 6 + 2
  assert s['stored_tokens'] == grown['summary']['stored_tokens'] + 2 * 128
  assert result['routed_over'] == f'the store at {tmp_path}'
  assert all('routed_right' in r for r in result['rows'])
