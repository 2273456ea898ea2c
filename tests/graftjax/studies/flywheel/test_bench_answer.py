"""The answer bench: both arms over items of the asked query lengths, on the tiny model."""

import pytest

from graftjax.studies.flywheel import bench_answer

# Byte tokens: 'Question: What is 11 plus 30?\nFinal answer:' is 43; each ' please' adds 7.
KW = {'repeats': 1, 'capacity': 256, 'chunk_size': 64, 'max_new_tokens': 2}


@pytest.mark.slow
def test_the_bench_answers_every_group_at_its_asked_length(text_model):
  result = bench_answer.experiment(
    text_model, model_name='tiny', base_length=43, in_bucket=[50], across=[71], **KW
  )
  bucketed, unbucketed = result['arms']['bucketed'], result['arms']['unbucketed']
  lengths = lambda rows: [r['query_tokens'] for r in rows]
  assert lengths(bucketed['repeated']) == [43] and lengths(unbucketed['repeated']) == [43]
  assert lengths(bucketed['unseen_in_bucket']) == lengths(unbucketed['unseen_in_bucket']) == [50]
  assert lengths(bucketed['unseen_across']) == [71] and 'unseen_across' not in unbucketed
  blocks = [d['block_tokens'] for d in result['deposits']]
  assert blocks == [48, 55, 76]  # BOS, the query, ' 4x', a blank line
  summary = result['summary']
  assert summary['met'] == (summary['unseen_in_bucket_over_repeated'] <= bench_answer.GOAL)
  assert result['experiment'] == 'bench_answer' and result['inputs']['model_fingerprint']
  assert 'bucketed' in bench_answer.format_rows(result)


@pytest.mark.parametrize(
  'in_bucket, across, match',
  [
    ([43], [71], 'distinct'),
    ([64], [71], 'multiples'),
    ([71], [78], 'bucket of'),
    ([50], [57], 'beyond'),
  ],
)
def test_lengths_that_do_not_test_the_claim_are_refused(text_model, in_bucket, across, match):
  with pytest.raises(ValueError, match=match):
    bench_answer.experiment(
      text_model, model_name='tiny', base_length=43, in_bucket=in_bucket, across=across, **KW
    )


def test_a_length_no_words_reach_is_refused(text_model):
  with pytest.raises(ValueError, match='no question of 44 query tokens'):
    bench_answer.question_of_length(text_model, 44, 0)
