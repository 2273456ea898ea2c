"""A resumed flywheel run checks every journaled step before it uses it.

A journal is forged with a valid chain (as a hostile or mistaken edit that
recomputes the digests would be), one step changed; the resumed run must
refuse it with an error naming the journal line, the step and both sides.
"""

import types

import pytest

from graftjax.flywheel import library as library_lib
from graftjax.studies.common import journal as journal_lib
from tests.graftjax.flywheel import test_loop

SHAPE = library_lib.Shape(capacity=256, chunk_size=16)
CONFIG = {'run': 'toy_qa'}


@pytest.fixture(scope='module')
def first_run(text_model, tmp_path_factory):
  """(library root, the finished journal's steps) of one journaled run."""
  root = tmp_path_factory.mktemp('resume')
  library = library_lib.Library(root / 'lib', shape=SHAPE)
  journal = journal_lib.Journal(root / 'journal.jsonl', config=CONFIG)
  test_loop._run_qa(text_model, library, journal=journal)
  library.close()
  return root / 'lib', dict(journal.done)


def _flywheel_step(done):
  return next(
    n for n, v in done.items() if isinstance(v, dict) and v.get('answered_by') == 'flywheel'
  )


def _set(field, value):
  return lambda v: {**v, field: value}


def _base_attempt(field, value):
  return lambda v: [{**v[0], field: value}] + v[1:]


FORGED = [  # (case, which step, how it is changed, what the error says)
  ('block not in the catalog', _flywheel_step, _set('block_key', 'f' * 64), 'does not hold'),
  ('block key of another type', _flywheel_step, _set('block_key', [1]), 'does not hold'),
  ('context tokens', _flywheel_step, _set('context_tokens', 999), "block's own metadata"),
  ('answered by base yet a block', _flywheel_step, _set('answered_by', 'base'), 'yet names'),
  ('record of another item', _flywheel_step, _set('item_id', 'f1'), "not one of this run's"),
  ('text as a number', _flywheel_step, _set('text', 7), 'wrong type'),
  ('base not a list', lambda d: 'base', lambda v: {'a': v}, 'not a list of attempts'),
  ('base item unknown', lambda d: 'base', _base_attempt('item_id', 'zz'), "not one of this run's"),
  ('base count as text', lambda d: 'base', _base_attempt('decode_tokens', '3'), 'wrong type'),
  ('base verdict', lambda d: 'base', _base_attempt('verdict', {}), 'boolean verdict'),
  ('transfer base', lambda d: 'transfer_base', lambda v: v[:1] + [3], 'attempt 1 is a JSON int'),
]


def _forge(root, done, name, change):
  """A journal of `done` with step `name` changed, its chain valid; its path and the line."""
  path = root / 'forged.jsonl'
  path.unlink(missing_ok=True)
  forged = journal_lib.Journal(path, config=CONFIG)
  for step, value in done.items():
    forged.step(step, lambda step=step, value=value: change(value) if step == name else value)
  return path, list(done).index(name) + 2


def _resume(model, lib, path):
  library = library_lib.Library(lib, shape=SHAPE)
  try:
    return test_loop._run_qa(model, library, journal=journal_lib.Journal(path, config=CONFIG))
  finally:
    library.close()


def test_the_unchanged_journal_resumes_without_the_model(first_run, tmp_path):
  lib, done = first_run
  path, _ = _forge(tmp_path, done, 'base', lambda v: v)
  assert _resume(None, lib, path)['attempts']


@pytest.mark.parametrize('pick, change, cause', [c[1:] for c in FORGED], ids=[c[0] for c in FORGED])
def test_a_forged_step_is_refused_naming_line_step_and_cause(
  first_run, tmp_path, pick, change, cause
):
  lib, done = first_run
  name = pick(done)
  path, line = _forge(tmp_path, done, name, change)
  with pytest.raises(journal_lib.JournalError, match=f"line {line}: step '{name}' .*{cause}"):
    _resume(None, lib, path)


def test_a_block_gone_from_the_store_is_refused(first_run, tmp_path):
  lib, done = first_run
  name = _flywheel_step(done)
  path, line = _forge(tmp_path, done, name, lambda v: v)
  copy = tmp_path / 'lib'
  copy.mkdir()
  for f in lib.rglob('*'):  # a copy of the library, one block deleted from its store
    target = copy / f.relative_to(lib)
    target.mkdir(exist_ok=True) if f.is_dir() else target.write_bytes(f.read_bytes())
  library_lib.Library(copy, shape=SHAPE).store.delete(done[name]['block_key'])
  with pytest.raises(journal_lib.JournalError, match=f'line {line}: .*store cannot give'):
    _resume(None, copy, path)


def test_a_block_of_another_model_is_refused(first_run, tmp_path):
  lib, done = first_run
  path, _ = _forge(tmp_path, done, 'base', lambda v: v)
  other = types.SimpleNamespace(fingerprint='0' * 64)
  with pytest.raises(journal_lib.JournalError, match=f"of model .*this run's model is {'0' * 64}"):
    _resume(other, lib, path)
