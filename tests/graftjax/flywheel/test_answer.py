"""Shape-stable answers: queries of any length in one bucket run the programs already compiled."""

import contextlib

import jax
import numpy as np
import pytest

from graftjax import blocks
from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers

SHAPE = library_lib.Shape(capacity=256, chunk_size=16)
_COMPILE = '/jax/core/compile/backend_compile_duration'


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return verifiers.Verdict(
    bool(words) and words[-1] in gold, words[-1] if words else None, tuple(gold), 'last_word', 1
  )


def item(index: int, question: str, answer: str) -> tasks.Item:
  return tasks.Item(
    task='toy', id=f'q{index}', question=question, answer=answer, source='test', split='test'
  )


# Byte tokens: queries of 47 and 45 tokens (one 16-slot bucket: 48), blocks of 69 and 67.
LONGER = item(1, 'What is two plus three?', '5')
SHORTER = item(2, 'What is two plus two?', '4')


@contextlib.contextmanager
def compilations():
  """A list that counts the XLA compilations run inside the block (one entry each). A program
  read from the persistent compilation cache (`make test` keeps one) counts too: jax records
  this event for it as well."""
  seen = []

  def listen(event, duration, **kwargs):
    del duration, kwargs
    if event == _COMPILE:
      seen.append(event)

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield seen
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


@pytest.fixture
def library(tmp_path):
  return library_lib.Library(tmp_path, shape=SHAPE)


def deposit(model, library, it):
  return library.deposit(
    model,
    item=it,
    verifier=last_word,
    solution=f'it is {it.answer}',
    source='reference',
    tokens_spent=0,
  )


def ask(model, library, entry, it, **kwargs):
  return answer_lib.answer(model, library, entry, it.question, mode='recall', **kwargs)


def base(model, library, it, **kwargs):
  return answer_lib.answer(model, library, None, it.question, mode='recall', **kwargs)


def test_a_new_length_in_the_same_bucket_compiles_nothing(text_model, library):
  longer, shorter = deposit(text_model, library, LONGER), deposit(text_model, library, SHORTER)
  assert longer.block_tokens != shorter.block_tokens
  first = ask(text_model, library, longer, LONGER, max_new_tokens=3)
  base(text_model, library, LONGER, max_new_tokens=3)
  with compilations() as seen:
    second = ask(text_model, library, shorter, SHORTER, max_new_tokens=3)
    alone = base(text_model, library, SHORTER, max_new_tokens=3)
  assert first.query_tokens != second.query_tokens
  assert (first.query_tokens - 1) // SHAPE.chunk_size == (second.query_tokens - 1) // 16
  assert seen == []
  assert alone.context_tokens == 0 and alone.first_logits.tobytes() != second.first_logits.tobytes()


def test_a_query_a_bucket_longer_compiles_nothing(text_model, library):
  """It runs one more chunk of the programs compiled before."""
  entry = deposit(text_model, library, LONGER)
  ask(text_model, library, entry, LONGER, max_new_tokens=3)
  preamble = 'Question: What is one plus one?\nFinal answer: 2\n\n'  # 49 tokens more
  with compilations() as seen:
    ask(text_model, library, entry, LONGER, max_new_tokens=3, preamble=preamble)
  assert seen == []


def test_a_padded_query_keeps_graft_equal_to_prompt(text_model, library):
  """The padding slots change the slots the query lands in, the same in both paths."""
  for it in (LONGER, SHORTER):
    entry = deposit(text_model, library, it)
    grafted = ask(text_model, library, entry, it, max_new_tokens=4)
    prompted = answer_lib.answer_prompted(
      text_model, library, entry, it.question, mode='recall', max_new_tokens=4
    )
    assert grafted.first_logits.tobytes() == prompted.first_logits.tobytes()
    assert grafted.token_ids == prompted.token_ids
    assert np.isfinite(grafted.first_logits).all()


def test_the_padded_query_computes_what_the_plain_one_does(text_model, library):
  """Padding at position -1 is never attended to: the logits are those of the query
  prefilled unpadded (to float rounding: the shapes differ)."""
  entry = deposit(text_model, library, LONGER)
  padded = ask(text_model, library, entry, LONGER, max_new_tokens=1)
  ids = answer_lib.query_ids(text_model, LONGER.question, mode='recall', after_block=True)
  cache = text_model.init_cache(capacity=SHAPE.capacity)
  context = text_model.tokenizer.encode(entry.text)
  _, cache = text_model.prefill(context, cache=cache, chunk_size=SHAPE.chunk_size, logits='none')
  plain, _ = text_model.prefill(
    ids, cache=cache, chunk_size=SHAPE.chunk_size, start_position=len(context)
  )
  np.testing.assert_allclose(padded.first_logits, np.asarray(plain[0]), rtol=1e-4, atol=1e-4)


def test_padding_stays_within_the_library_capacity(text_model, library):
  """A query whose bucket would not fit is padded only as far as the capacity allows."""
  # 206 + 47 + 3 = 256 slots: room for the query's 47 tokens, not for its bucket of 48.
  it = item(3, LONGER.question, LONGER.answer)
  entry = library.deposit(
    text_model,
    item=it,
    verifier=last_word,
    solution='x' * 136 + ' it is 5',
    source='reference',
    tokens_spent=0,
  )
  assert entry.block_tokens + 47 + 3 == SHAPE.capacity
  out = ask(text_model, library, entry, it, max_new_tokens=3)
  assert out.query_tokens == 47
  prompted = answer_lib.answer_prompted(
    text_model, library, entry, it.question, mode='recall', max_new_tokens=3
  )
  assert out.first_logits.tobytes() == prompted.first_logits.tobytes()
  with pytest.raises(ValueError, match='exceed'):
    ask(text_model, library, entry, it, max_new_tokens=5)


def test_a_deposit_of_a_new_length_in_the_same_bucket_compiles_nothing(text_model, library):
  deposit(text_model, library, LONGER)
  with compilations() as seen:
    entry = deposit(text_model, library, SHORTER)
  assert entry.block_tokens == 67 and seen == []


def test_the_padded_deposit_holds_the_rows_of_the_plain_prefill(text_model, library):
  """Padding after the text at position -1 changes no row's meaning (to float rounding)."""
  entry = deposit(text_model, library, LONGER)
  block = library.store.get(entry.key)
  ids = text_model.tokenizer.encode(entry.text)
  cache = text_model.init_cache(capacity=SHAPE.capacity)
  _, cache = text_model.prefill(ids, cache=cache, chunk_size=SHAPE.chunk_size, logits='none')
  plain = blocks.capture(
    cache,
    blocks.Span(0, len(ids)),
    token_ids=ids,
    target=text_model.graft_target,
    chunk_size=SHAPE.chunk_size,
  )
  kept, expected = block.arrays(), plain.arrays()  # the same compact rows of every layer
  assert kept.keys() == expected.keys()
  for name in ('k', 'v', 'k_tail', 'v_tail'):
    if name in kept:
      np.testing.assert_allclose(kept[name], expected[name], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(kept['positions'], np.arange(len(ids)))


def test_query_chunks_near_capacity_take_few_widths():
  """Whole chunks where they fit; else power-of-two pieces: every width in a small set."""
  shape = library_lib.Shape(capacity=256, chunk_size=16)
  assert answer_lib.query_chunks(20, context=10, max_new_tokens=4, shape=shape) == (16, 16)
  widths = set()
  for context in range(150, 256 - 40):
    for n in range(1, 256 - context - 4 + 1):
      chunks = answer_lib.query_chunks(n, context=context, max_new_tokens=4, shape=shape)
      assert n <= sum(chunks) <= 256 - context - 4
      assert sum(chunks) - n < 16  # padding never reaches a whole chunk
      widths |= set(chunks)
  assert widths == {1, 2, 4, 8, 16}


def test_a_sweep_of_rooms_near_capacity_compiles_a_few_shapes(text_model, tmp_path):
  """Blocks one token apart leave 16 different rooms for the same query, 15 of them too small
  for its last whole chunk: the query runs in chunks of a few widths, so the sweep compiles
  those widths, not a program per room."""
  plain = answer_lib.query_ids(text_model, LONGER.question, mode='recall', after_block=True)
  preamble = 'x' * ((1 - len(plain)) % 16)  # byte tokens: n = 1 more than a whole chunk
  n = len(plain) + len(preamble)
  assert n % 16 == 1
  probe = library_lib.Library(tmp_path / 'probe', shape=SHAPE)
  start = deposit(text_model, probe, LONGER).block_tokens
  # Block k holds start + 1 + extra + k tokens, so rooms run from n + 15 down to n. The
  # capacity is the other tests': the sweep shares their compiled programs.
  shape = SHAPE
  library = library_lib.Library(tmp_path / 'near', shape=shape)
  extra = shape.capacity - (start + n + 19)
  assert extra >= 0
  entries = []
  for k in range(16):
    it = item(100 + k, LONGER.question, '5')
    entries.append(
      library.deposit(
        text_model,
        item=it,
        verifier=last_word,
        solution='x' * (k + extra) + ' it is 5',
        source='reference',
        tokens_spent=0,
      )
    )
  ask(text_model, library, entries[0], LONGER, max_new_tokens=3, preamble=preamble)
  with compilations() as seen:
    for entry in entries[1:]:
      ask(text_model, library, entry, LONGER, max_new_tokens=3, preamble=preamble)
  rooms = {shape.capacity - e.block_tokens - 3 for e in entries}
  assert rooms == set(range(n, n + 16))
  assert len(seen) <= 2 * 4  # at most the widths 1, 2, 4, 8, each with and without logits
