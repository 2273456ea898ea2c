"""Answer latency at a repeated length against unseen lengths, in a bucket and across buckets.

The library of experiments/bench_answer.py. Items are arithmetic questions padded with words to
chosen query lengths (tokens of 'Question: ...\\nFinal answer:'), each deposited as the flywheel
deposits a short answer (`form='answer'`: the block is the query and its answer). Then, in one
process:

  bucketed    `answer.answer` as the flywheel calls it: the query padded to the library's chunk
              bucket, the block installed in `restore`'s buckets. First an item at the base
              length (it compiles the programs), then the same item again (`repeated`), then
              items of unseen lengths in the same bucket (`unseen_in_bucket`, each answered
              once), then items whose block and query reach the next bucket (`unseen_across`).
  unbucketed  the same items answered with the query prefilled unpadded (one program per
              query length modulo the chunk), as answers were computed before bucketing: the
              base item first, repeated, then the unseen lengths in the bucket.

Every figure is one wall time of one answer (restore + query + decode), medians over the
items of a group; the CPU is shared with other work, so only ratios within one run are read.
"""

from __future__ import annotations

import hashlib
import statistics
import tempfile
import time

from graftjax import restore as restore_lib
from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers
from graftjax.studies.common import results

GOAL = 1.5  # an unseen length in a bucket costs at most this many repeated answers


def question_of_length(model, target: int, index: int) -> str:
  """An arithmetic question whose recall query is `target` tokens (words added to reach it).

  Raises:
    ValueError: no number of added words gives exactly `target` tokens.
  """
  base = f'What is {index + 11} plus {index + 30}'
  for words in range(4 * target):
    question = base + ' please' * words + '?'
    n = len(answer_lib.query_ids(model, question, mode='recall', after_block=True))
    if n == target:
      return question
    if n > target:
      break
  raise ValueError(f'no question of {target} query tokens from {base!r}')


def _item(model, target: int, index: int) -> tasks.Item:
  return tasks.Item(
    task='bench',
    id=f'q{target}',
    question=question_of_length(model, target, index),
    answer=str(2 * index + 41),
    source='bench_answer',
    split='bench',
  )


def _unbucketed(model, library, entry, question: str, max_new_tokens: int) -> float:
  """Seconds of one answer with the query prefilled unpadded (one program per length)."""
  start = time.perf_counter()
  context = len(library.check(entry, model).token_ids)
  cache = model.init_cache(capacity=library.shape.capacity)
  cache = restore_lib.restore(
    library.store,
    entry.key,
    cache,
    target=model.graft_target,
    chunk_size=library.shape.chunk_size,
    donate=True,
  )
  ids = answer_lib.query_ids(model, question, mode='recall', after_block=True)
  last, cache = model.prefill(
    ids, cache=cache, chunk_size=library.shape.chunk_size, start_position=context
  )
  answer_lib.greedy(
    model, last, cache, context + len(ids), mode='recall', max_new_tokens=max_new_tokens
  )
  return time.perf_counter() - start


def _median(rows: list[dict]) -> float:
  return statistics.median(r['seconds'] for r in rows)


def experiment(
  model,
  *,
  model_name: str,
  base_length: int,
  in_bucket: list[int],
  across: list[int],
  repeats: int,
  capacity: int,
  chunk_size: int,
  max_new_tokens: int,
  command: str | None = None,
) -> dict:
  """Both arms over items of the given query lengths; the result.

  Args:
    model: a `Gemma` (the bench answers with it).
    model_name: its name, for the record.
    base_length: query tokens of the item answered first and then `repeats` times.
    in_bucket: query lengths of unseen items in `base_length`'s chunk bucket.
    across: query lengths of unseen items in later buckets (their blocks too).
    repeats: answers of the base item after its first.
    capacity, chunk_size: the library's shape.
    max_new_tokens: decode budget of every answer.
  """
  lengths = [base_length, *in_bucket, *across]
  if len(set(lengths)) != len(lengths) or any(n % chunk_size == 0 for n in lengths):
    raise ValueError(f'query lengths must be distinct and not multiples of {chunk_size}: {lengths}')
  bucket = lambda n: (n - 1) // chunk_size
  if any(bucket(n) != bucket(base_length) for n in in_bucket):
    raise ValueError(f'{in_bucket} are not all in the bucket of {base_length}')
  if any(bucket(n) == bucket(base_length) for n in across):
    raise ValueError(f'{across} must lie beyond the bucket of {base_length}')
  items = [_item(model, n, i) for i, n in enumerate(lengths)]
  shape = library_lib.Shape(capacity=capacity, chunk_size=chunk_size)
  query_tokens = {
    it.id: len(answer_lib.query_ids(model, it.question, mode='recall', after_block=True))
    for it in items
  }
  with tempfile.TemporaryDirectory() as root:
    library = library_lib.Library(root, shape=shape)
    entries = {}

    def row(it, seconds):
      return {
        'query_tokens': query_tokens[it.id],
        'block_tokens': entries[it.id].block_tokens,
        'seconds': seconds,
      }

    deposits = []
    for it in items:
      start = time.perf_counter()
      entries[it.id] = library.deposit(
        model,
        item=it,
        verifier=verifiers.NUMERIC,
        solution=it.answer,
        source='reference',
        tokens_spent=0,
        form='answer',
      )
      deposits.append(row(it, time.perf_counter() - start))

    def bucketed(it):
      out = answer_lib.answer(
        model, library, entries[it.id], it.question, mode='recall', max_new_tokens=max_new_tokens
      )
      return row(it, out.seconds)

    def unbucketed(it):
      return row(it, _unbucketed(model, library, entries[it.id], it.question, max_new_tokens))

    base, rest = items[0], items[1:]
    unseen, beyond = rest[: len(in_bucket)], rest[len(in_bucket) :]
    arms = {}
    for name, run, groups in (
      ('bucketed', bucketed, {'unseen_in_bucket': unseen, 'unseen_across': beyond}),
      ('unbucketed', unbucketed, {'unseen_in_bucket': unseen}),
    ):
      arm = {'first': run(base), 'repeated': [run(base) for _ in range(repeats)]}
      arm.update({group: [run(it) for it in its] for group, its in groups.items()})
      arm['repeated_median_s'] = _median(arm['repeated'])
      for group in groups:
        arm[f'{group}_median_s'] = _median(arm[group])
        arm[f'{group}_over_repeated'] = arm[f'{group}_median_s'] / arm['repeated_median_s']
      arms[name] = arm
    library.close()
  texts = '\0'.join(it.question for it in items).encode()
  ratio = arms['bucketed']['unseen_in_bucket_over_repeated']
  return {
    **results.header(
      'bench_answer',
      inputs={
        **results.model_inputs(model, model_name),
        'questions_sha256': hashlib.sha256(texts).hexdigest(),
      },
      command=command,
    ),
    'model': model_name,
    'library_shape': {'capacity': capacity, 'chunk_size': chunk_size},
    'max_new_tokens': max_new_tokens,
    'timing': 'wall seconds of one answer each (restore + query + decode); CPU shared with other work',
    'deposits': deposits,
    'arms': arms,
    'summary': {
      'goal': f'unseen length in a bucket within {GOAL}x of a repeated one',
      'unseen_in_bucket_over_repeated': ratio,
      'unbucketed_unseen_in_bucket_over_repeated': arms['unbucketed'][
        'unseen_in_bucket_over_repeated'
      ],
      'unseen_across_over_repeated': arms['bucketed']['unseen_across_over_repeated'],
      'met': ratio <= GOAL,
    },
  }


def format_rows(result: dict) -> str:
  """One line per arm and group: median seconds and the ratio to a repeated answer."""
  out = []
  for name, arm in result['arms'].items():
    out.append(
      f'{name:>10} first {arm["first"]["seconds"]:.3f}s  repeated {arm["repeated_median_s"]:.3f}s'
    )
    for group in ('unseen_in_bucket', 'unseen_across'):
      if group in arm:
        seconds = ' '.join(f'{r["seconds"]:.2f}' for r in arm[group])
        out.append(
          f'{"":>10} {group} median {arm[f"{group}_median_s"]:.3f}s'
          f' ({arm[f"{group}_over_repeated"]:.2f}x repeated; each: {seconds})'
        )
  return '\n'.join(out)
