"""Deposit (verified, idempotent, resumable) and graft -> answer (== the same text prompted)."""

import dataclasses

import pytest

from graftjax import store as store_lib
from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers

SHAPE = library_lib.Shape(capacity=256, chunk_size=16)


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return verifiers.Verdict(
    bool(words) and words[-1] in gold, words[-1] if words else None, tuple(gold), 'last_word', 1
  )


ITEM = tasks.Item(
  task='toy', id='q1', question='What is two plus three?', answer='5', source='test', split='test'
)


@pytest.fixture
def library(tmp_path):
  return library_lib.Library(tmp_path, shape=SHAPE)


def deposit(model, library, solution='2 + 3 = 5', source='reference', tokens_spent=0, **kwargs):
  """Deposits ITEM's `solution` under the last-word verifier."""
  return library.deposit(
    model,
    item=ITEM,
    verifier=last_word,
    solution=solution,
    source=source,
    tokens_spent=tokens_spent,
    **kwargs,
  )


def test_a_solution_that_does_not_verify_is_not_deposited(text_model, library):
  with pytest.raises(library_lib.DepositError, match='does not verify'):
    deposit(text_model, library, solution='It is 6.', source='self', tokens_spent=9)
  assert library.entries() == [] and library.store.list() == []


def test_deposits_are_idempotent_and_survive_a_restart(text_model, library, tmp_path):
  first = deposit(text_model, library)
  again = deposit(text_model, library)
  assert again == first and library.store.list() == [first.key]
  library.close()
  reopened = library_lib.Library(tmp_path, shape=SHAPE)
  assert reopened.entries() == [first]
  assert first.verdict['verdict'] and first.verdict['extracted'] == '5'
  assert first.source == 'reference'


def test_unknown_source_is_refused(text_model, library):
  with pytest.raises(library_lib.DepositError, match='source'):
    deposit(text_model, library, solution='5', source='guess')


@pytest.mark.parametrize('mode', ['recall', 'solve'])
def test_grafted_answer_is_byte_equal_to_the_prompted_one(text_model, library, mode):
  entry = deposit(text_model, library)
  grafted = answer_lib.answer(
    text_model, library, entry, ITEM.question, mode=mode, max_new_tokens=6
  )
  prompted = answer_lib.answer_prompted(
    text_model, library, entry, ITEM.question, mode=mode, max_new_tokens=6
  )
  assert grafted.first_logits.tobytes() == prompted.first_logits.tobytes()
  assert grafted.token_ids == prompted.token_ids
  assert (
    grafted.context_tokens == entry.block_tokens == len(text_model.tokenizer.encode(entry.text))
  )
  base = answer_lib.answer(text_model, library, None, ITEM.question, mode=mode, max_new_tokens=6)
  assert base.context_tokens == 0
  assert base.first_logits.tobytes() != grafted.first_logits.tobytes()  # the block is seen


def test_a_corrupted_block_is_never_grafted(text_model, library, tmp_path):
  entry = deposit(text_model, library)
  chunk = next(
    p
    for p in (tmp_path / 'blocks' / entry.key / 'k').rglob('*')
    if p.is_file() and p.name != 'zarr.json'
  )
  data = bytearray(chunk.read_bytes())
  data[0] ^= 1
  chunk.write_bytes(bytes(data))
  with pytest.raises(store_lib.StoreError):
    answer_lib.answer(text_model, library, entry, ITEM.question, mode='recall', max_new_tokens=4)


def test_the_answer_budget_must_fit_the_library_shape(text_model, library):
  with pytest.raises(ValueError, match='exceed'):
    answer_lib.answer(
      text_model, library, None, ITEM.question, mode='recall', max_new_tokens=SHAPE.capacity
    )


def test_a_verdict_record_that_does_not_re_verify_is_refused(text_model, library):
  with pytest.raises(library_lib.DepositError, match='re-verify'):
    deposit(
      text_model,
      library,
      source='self',
      tokens_spent=3,
      record={**last_word('6', ('5',)).to_json(), 'verdict': True},
    )
  assert library.entries() == []


def test_the_template_carries_the_verified_answer_once(text_model, library):
  entry = deposit(
    text_model, library, solution='2 + 3 = 5\nFinal answer: 5', source='self', tokens_spent=3
  )
  assert entry.text == 'Question: What is two plus three?\nFinal answer: 5\nSolution: 2 + 3 = 5\n\n'


def test_items_of_identical_text_in_two_tasks_are_both_deposited(text_model, library):
  """Same template text means the same content key; the catalog is keyed by (task, item)."""
  first = deposit(text_model, library)
  other = dataclasses.replace(ITEM, task='other')
  second = library.deposit(
    text_model,
    item=other,
    verifier=last_word,
    solution='2 + 3 = 5',
    source='reference',
    tokens_spent=0,
  )
  assert second.key == first.key and second.task == 'other'
  assert library.find('other', ITEM.id) == second and library.find('toy', ITEM.id) == first


def test_the_answer_form_holds_the_answer_line_alone(text_model, library):
  """QA: the dataset's answer (or the model's first line) is the whole block."""
  entry = deposit(text_model, library, solution=' 5\n', form='answer')
  assert entry.text == 'Question: What is two plus three?\nFinal answer: 5\n\n'
  assert entry.block_tokens == len(text_model.tokenizer.encode(entry.text))


def test_the_answer_form_refuses_a_first_line_that_does_not_verify_alone(text_model, library):
  with pytest.raises(library_lib.DepositError, match='does not verify alone'):
    deposit(text_model, library, solution='2 + 3 makes\n5', form='answer')
  with pytest.raises(library_lib.DepositError, match='form'):
    deposit(text_model, library, form='essay')
  assert library.entries() == [] and library.store.list() == []


def test_a_preamble_between_block_and_query_keeps_graft_equal_to_prompt(text_model, library):
  entry = deposit(text_model, library)
  preamble = 'Question: What is one plus one?\nFinal answer: 2\n\n'
  kwargs = {'mode': 'recall', 'max_new_tokens': 4, 'preamble': preamble}
  grafted = answer_lib.answer(text_model, library, entry, ITEM.question, **kwargs)
  prompted = answer_lib.answer_prompted(text_model, library, entry, ITEM.question, **kwargs)
  plain = answer_lib.answer(
    text_model, library, entry, ITEM.question, mode='recall', max_new_tokens=4
  )
  assert grafted.first_logits.tobytes() == prompted.first_logits.tobytes()
  assert grafted.token_ids == prompted.token_ids
  query = text_model.tokenizer.encode(f'Question: {ITEM.question}\nFinal answer:', add_bos=False)
  assert grafted.query_tokens == len(text_model.tokenizer.encode(preamble, add_bos=False)) + len(
    query
  )
  assert plain.query_tokens == len(query)
  assert plain.first_logits.tobytes() != grafted.first_logits.tobytes()
