"""Deposit (verified, idempotent, resumable) and graft -> answer (== the same text prompted)."""

import dataclasses
import errno
import os
import sqlite3

import pytest

from graftjax import blocks
from graftjax import restore as restore_lib
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# --- every row bound to its block; the catalog rebuilt from the store -------------------------

OTHER = tasks.Item(
  task='toy', id='q2', question='What is four minus one?', answer='3', source='test', split='test'
)


def _two(model, library):
  first = deposit(model, library)
  second = library.deposit(
    model, item=OTHER, verifier=last_word, solution='4 - 1 = 3', source='reference', tokens_spent=0
  )
  return first, second


def _answer(model, library, entry):
  return answer_lib.answer(model, library, entry, ITEM.question, mode='recall', max_new_tokens=2)


def _sql(library, statement, *args):
  db = sqlite3.connect(library.root / 'catalog.db')
  with db:
    db.execute(statement, args)
  db.close()


@pytest.fixture
def no_graft(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError('a block was grafted from an entry that should have been refused')

  monkeypatch.setattr(answer_lib.restore_lib, 'restore', refuse)


def test_a_row_naming_another_items_block_is_refused_before_grafting(text_model, library, no_graft):
  """A row pointing at another item's block was grafted and answered."""
  first, second = _two(text_model, library)
  with pytest.raises(library_lib.BindingError, match='toy/q1.*tokens_sha256') as raised:
    _answer(text_model, library, dataclasses.replace(first, key=second.key))
  assert second.key[:12] in str(raised.value)
  _sql(library, 'UPDATE deposits SET key = ? WHERE item_id = ?', second.key, 'q1')
  with pytest.raises(library_lib.DamagedLibraryError, match='toy/q1.*own digest'):
    library.find('toy', 'q1')


@pytest.mark.parametrize('lie', [1, -1])
def test_a_lying_block_tokens_is_refused_before_grafting(text_model, library, no_graft, lie):
  """A row's block_tokens put the query at the wrong positions."""
  entry = deposit(text_model, library)
  with pytest.raises(library_lib.BindingError, match='n_tokens'):
    _answer(text_model, library, dataclasses.replace(entry, block_tokens=entry.block_tokens + lie))
  _sql(library, 'UPDATE deposits SET block_tokens = block_tokens + ?', lie)
  with pytest.raises(library_lib.DamagedLibraryError, match='own digest'):
    library.entries()


def test_a_row_whose_text_or_answer_is_not_its_blocks_is_refused(text_model, library, no_graft):
  first, _ = _two(text_model, library)
  with pytest.raises(library_lib.BindingError, match='does not tokenize'):
    _answer(
      text_model, library, dataclasses.replace(first, text=first.text.replace('2 + 3', '3 + 2'))
    )
  with pytest.raises(library_lib.BindingError, match='not the deposit of its question'):
    _answer(text_model, library, dataclasses.replace(first, question=OTHER.question))
  with pytest.raises(library_lib.BindingError, match='verdict'):
    _answer(
      text_model, library, dataclasses.replace(first, verdict={**first.verdict, 'verdict': False})
    )
  _sql(library, "UPDATE deposits SET text = replace(text, 'two', 'tw0')")
  with pytest.raises(library_lib.DamagedLibraryError, match='own digest'):
    library.entries()


@pytest.mark.parametrize('damage', ['missing', 'empty', 'garbage'])
def test_a_damaged_catalog_beside_deposits_is_an_error_then_rebuilt(
  text_model, library, tmp_path, damage
):
  before = list(_two(text_model, library))
  library.close()
  path = tmp_path / 'catalog.db'
  path.unlink()
  if damage != 'missing':
    path.write_bytes(b'' if damage == 'empty' else b'not a database, ' * 512)
  error, match = (
    (library_lib.CatalogFileError, 'corrupt')
    if damage == 'garbage'
    else (
      library_lib.DamagedLibraryError,
      f'{"is missing" if damage == "missing" else "0 bytes"}.*rebuild',
    )
  )
  with pytest.raises(error, match=match):
    library_lib.Library(tmp_path, shape=SHAPE)
  rebuilt = library_lib.Library.rebuild(tmp_path, shape=SHAPE)
  assert rebuilt.entries() == before
  assert rebuilt.rebuilt == {'rows': 2, 'blocks_without_record': [], 'records_without_block': []}
  rebuilt.close()
  assert library_lib.Library(tmp_path, shape=SHAPE).entries() == before


def test_rebuild_refuses_an_altered_record(text_model, library, tmp_path):
  deposit(text_model, library)
  (record,) = (tmp_path / 'records').glob('*.json')
  record.write_text(record.read_text().replace('What is two', 'What is tw0'))
  with pytest.raises(library_lib.DamagedLibraryError, match='own digest'):
    library_lib.Library.rebuild(tmp_path, shape=SHAPE)


def test_an_older_catalog_schema_is_named(tmp_path):
  db = sqlite3.connect(tmp_path / 'catalog.db')
  db.execute('CREATE TABLE deposits (key TEXT, task TEXT)')
  db.close()
  with pytest.raises(library_lib.DamagedLibraryError, match='schema version 0'):
    library_lib.Library(tmp_path, shape=SHAPE)


def test_a_locked_catalog_is_named(library):
  locked = library_lib.Library(library.root, shape=SHAPE, timeout=0.05)
  other = sqlite3.connect(library.root / 'catalog.db', isolation_level=None)
  other.execute('BEGIN EXCLUSIVE')
  try:
    with pytest.raises(library_lib.CatalogFileError, match='locked by another connection'):
      locked.sync()
    assert locked.entries() == []  # a reader is not held up by the writer (WAL journal)
  finally:
    other.execute('ROLLBACK')
    other.close()
  assert locked.sync().added == ()  # free again


class _FullDisk:
  """A connection whose INSERTs fail as sqlite fails on a full disk, rolling back first."""

  def __init__(self, db):
    self._db = db

  def __getattr__(self, name):
    return getattr(self._db, name)

  def execute(self, statement, *args):
    if statement.startswith('INSERT'):
      self._db.execute('ROLLBACK')  # sqlite may roll the transaction back itself on SQLITE_FULL
      raise sqlite3.OperationalError('database or disk is full')
    return self._db.execute(statement, *args)


def test_a_full_disk_is_named_not_hidden_by_the_rollback(text_model, library):
  library._db = _FullDisk(library._db)
  with pytest.raises(library_lib.CatalogFileError, match='disk is full') as raised:
    deposit(text_model, library)
  assert 'rollback' not in str(raised.value).lower()
  library._db = library._db._db
  assert library.entries() == []
  assert deposit(text_model, library) == library.find(ITEM.task, ITEM.id)  # room again: resumes


def test_a_deposit_record_that_cannot_be_written_is_named(text_model, library, monkeypatch):
  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(library_lib.tempfile, 'mkstemp', full)
  with pytest.raises(library_lib.CatalogFileError, match='deposit record.*No space left'):
    deposit(text_model, library)
  assert library.entries() == []


def test_rebuild_adopts_a_catalog_of_the_earlier_schema(text_model, library, tmp_path):
  """Catalogs written before rows carried token digests (and deposits wrote records)."""
  first, second = _two(text_model, library)
  library.close()
  for record in (tmp_path / 'records').glob('*.json'):
    record.unlink()
  (tmp_path / 'catalog.db').unlink()
  db = sqlite3.connect(tmp_path / 'catalog.db')
  with db:
    db.execute(
      'CREATE TABLE deposits (key TEXT NOT NULL, task TEXT NOT NULL, item_id TEXT NOT NULL,'
      ' question TEXT NOT NULL, text TEXT NOT NULL, answer TEXT NOT NULL, source TEXT NOT NULL,'
      ' verdict TEXT NOT NULL, tokens_spent INTEGER NOT NULL, block_tokens INTEGER NOT NULL,'
      ' PRIMARY KEY (task, item_id))'
    )
    for entry in (first, second):
      db.execute(f'INSERT INTO deposits VALUES ({",".join("?" * 10)})', entry.row()[:10])
  db.close()
  with pytest.raises(library_lib.DamagedLibraryError, match='schema version 0'):
    library_lib.Library(tmp_path, shape=SHAPE)
  rebuilt = library_lib.Library.rebuild(tmp_path, shape=SHAPE)
  assert rebuilt.entries() == [first, second] and rebuilt.rebuilt['rows'] == 2
  assert len(list((tmp_path / 'records').glob('*.json'))) == 2


def _whole_code(text, gold):
  """A code task's verifier: the answer is the whole program (several lines)."""
  code = text.strip()
  return verifiers.Verdict(code in gold, code, tuple(gold), 'whole_code', 1)


def test_a_code_deposit_holds_the_solution_once(text_model, library):
  code = 'def add(a, b):\n  return a + b'
  item = dataclasses.replace(ITEM, id='code1', question='Write add.', answer=code)
  entry = library.deposit(
    text_model, item=item, verifier=_whole_code, solution=code, source='reference', tokens_spent=0
  )
  assert entry.text == f'Question: Write add.\nFinal answer:\n```python\n{code}\n```\n\n'
  assert entry.text.count('return a + b') == 1 and entry.answer == code
  assert entry.text.startswith(library_lib.CODE_QUERY.format(question=item.question))
  library.check(entry, text_model)  # still a deposit of its question, bound to its block


def test_a_deposit_records_the_library_chunk_size_and_is_restored_only_at_it(text_model, library):
  """Fails on the code before: a deposit recorded no chunk size, so a restore in force with
  other chunks passed."""
  entry = deposit(text_model, library)
  meta = library.store.get(entry.key).meta
  assert (meta.chunk_size, meta.layout_version) == (SHAPE.chunk_size, blocks.LAYOUT_VERSION)
  cache = text_model.init_cache(capacity=SHAPE.capacity)
  with pytest.raises(blocks.GraftError, match=f'chunks of {SHAPE.chunk_size} tokens; this cache'):
    restore_lib.restore(
      library.store, entry.key, cache, target=text_model.graft_target, chunk_size=8
    )
