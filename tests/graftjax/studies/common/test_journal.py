"""The run journal: finished steps are kept, a torn line is dropped, a journal of another run
is refused, and so is a second writer of an open journal."""

import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest

from graftjax.studies.common import journal as journal_lib


def _counting():
  calls = []

  def compute(value):
    def run():
      calls.append(value)
      return value

    return run

  return calls, compute


def test_a_reopened_journal_skips_finished_steps(tmp_path):
  path = tmp_path / 'run' / 'journal.jsonl'
  calls, compute = _counting()
  first = journal_lib.Journal(path, config={'items': [1, 2]})
  assert first.step('a', compute({'x': 1.5, 'ids': (1, 2)})) == {'x': 1.5, 'ids': [1, 2]}
  assert first.step('a', compute('again')) == {'x': 1.5, 'ids': [1, 2]}
  first.close()
  again = journal_lib.Journal(path, config={'items': [1, 2]})
  assert again.resumed == 1
  assert again.step('a', compute('not run')) == {'x': 1.5, 'ids': [1, 2]}
  assert again.step('b', compute([3])) == [3]
  assert calls == [{'x': 1.5, 'ids': (1, 2)}, [3]]
  again.close()
  assert journal_lib.Journal(path, config={'items': [1, 2]}).done == {
    'a': {'x': 1.5, 'ids': [1, 2]},
    'b': [3],
  }


def test_a_torn_last_line_is_dropped_and_its_step_runs_again(tmp_path):
  path = tmp_path / 'journal.jsonl'
  journal = journal_lib.Journal(path, config={})
  journal.step('a', lambda: 1)
  with path.open('a') as f:
    f.write('{"step": "b", "val')  # an interrupted write
  journal.close()
  reopened = journal_lib.Journal(path, config={})
  assert reopened.done == {'a': 1}
  assert reopened.step('b', lambda: 2) == 2
  reopened.close()
  assert journal_lib.Journal(path, config={}).done == {'a': 1, 'b': 2}


def test_a_journal_of_another_config_is_refused(tmp_path):
  path = tmp_path / 'journal.jsonl'
  journal_lib.Journal(path, config={'items': [1]}).step('a', lambda: 1)
  with pytest.raises(journal_lib.JournalError, match='another journal path'):
    journal_lib.Journal(path, config={'items': [2]})


def test_without_a_path_every_step_runs_and_nothing_is_written(tmp_path):
  calls, compute = _counting()
  journal = journal_lib.Journal(None, config={})
  assert journal.step('a', compute(1)) == 1 and journal.step('a', compute(2)) == 1
  assert calls == [1] and list(tmp_path.iterdir()) == []


# Hostile journals: every damaged line is an error naming the file, the line and the cause -------


def _journal_lines(path):
  journal = journal_lib.Journal(path, config={'items': [1]})
  for name, value in (('a', 1), ('b', {'x': [2.5]}), ('c', 'three')):
    journal.step(name, lambda value=value: value)
  return path.read_bytes().split(b'\n')[:-1]  # header, a, b, c


def _set(i, line):
  return lambda lines: lines[:i] + [line] + lines[i + 1 :]


HOSTILE = [  # (case, lines -> damaged lines, line number named, cause)
  ('edited value', lambda ls: _set(2, ls[2].replace(b'2.5', b'3.5'))(ls), 3, 'digest'),
  ('duplicated line', lambda ls: ls[:3] + ls[2:], 4, 'reordered, duplicated'),
  ('reordered lines', lambda ls: [ls[0], ls[2], ls[1], ls[3]], 2, 'reordered, duplicated'),
  ('removed line', lambda ls: [ls[0], ls[1], ls[3]], 3, 'reordered, duplicated'),
  ('torn middle line', _set(2, b'{"step": "b", "val'), 3, 'not JSON'),
  ('empty middle line', _set(2, b''), 3, 'not JSON'),
  ('not UTF-8', _set(2, b'{"step": "\xff\xfe"}'), 3, 'not UTF-8'),
  ('deeply nested', _set(2, b'[' * 100_000 + b']' * 100_000), 3, 'nested too deeply'),
  ('an array', _set(2, b'[1, 2]'), 3, 'not a step line'),
  ('no value', _set(2, b'{"step": "b", "prev": "", "sha256": ""}'), 3, 'not a step line'),
  ('a number name', _set(2, b'{"step": 7, "value": 1, "prev": "", "sha256": ""}'), 3, 'not a str'),
  ('NaN value', _set(2, b'{"step": "b", "value": NaN, "prev": "", "sha256": ""}'), 3, 'NaN'),
  ('huge float', _set(2, b'{"step": "b", "value": 1e999, "prev": "", "sha256": ""}'), 3, 'float'),
  ('huge integer', _set(2, b'{"step": "b", "value": ' + b'9' * 5000 + b'}'), 3, 'not JSON'),
  ('garbage header', _set(0, b'not a journal'), 1, 'not JSON'),
  ('header of no journal', _set(0, b'{"x": 1}'), 1, 'not a journal header'),
  ('unversioned header', _set(0, b'{"config_sha256": "00"}'), 1, 'format None'),
]


@pytest.mark.parametrize(
  'damage, number, cause', [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_a_damaged_line_is_an_error_naming_file_line_and_cause(tmp_path, damage, number, cause):
  path = tmp_path / 'journal.jsonl'
  path.write_bytes(b'\n'.join(damage(_journal_lines(path))) + b'\n')
  with pytest.raises(journal_lib.JournalError, match=f'line {number}: .*{cause}') as raised:
    journal_lib.Journal(path, config={'items': [1]})
  assert str(path) in str(raised.value)


def test_an_edited_header_digest_is_refused(tmp_path):
  path = tmp_path / 'journal.jsonl'
  lines = _journal_lines(path)
  header = json.loads(lines[0])
  header['config_sha256'] = journal_lib.Journal(None, config={'items': [2]}).config_sha256
  path.write_bytes(b'\n'.join([json.dumps(header).encode()] + lines[1:]) + b'\n')
  with pytest.raises(journal_lib.JournalError, match='line 1: the header does not match'):
    journal_lib.Journal(path, config={'items': [2]})


def test_a_torn_last_line_is_cut_and_the_chain_goes_on(tmp_path):
  path = tmp_path / 'journal.jsonl'
  lines = _journal_lines(path)
  path.write_bytes(b'\n'.join(lines) + b'\n' + lines[3][:-5])  # 'c' rewritten, interrupted
  again = journal_lib.Journal(path, config={'items': [1]})
  assert path.read_bytes() == b'\n'.join(lines) + b'\n'
  assert again.done == {'a': 1, 'b': {'x': [2.5]}, 'c': 'three'}
  again.step('d', lambda: 4)
  again.close()
  assert journal_lib.Journal(path, config={'items': [1]}).done['d'] == 4


def test_a_value_that_is_not_json_ready_is_an_error_naming_the_step(tmp_path):
  journal = journal_lib.Journal(tmp_path / 'journal.jsonl', config={})
  with pytest.raises(journal_lib.JournalError, match="step 'a': the value is not JSON-ready"):
    journal.step('a', lambda: float('nan'))
  with pytest.raises(journal_lib.JournalError, match="step 'b': the value is not JSON-ready"):
    journal.step('b', lambda: object())


def test_a_step_read_back_is_checked_once_before_it_is_used(tmp_path):
  path = tmp_path / 'journal.jsonl'
  _journal_lines(path)
  seen = []

  def check(value):
    seen.append(value)
    return None if value != 'three' else 'names something that is gone'

  again = journal_lib.Journal(path, config={'items': [1]})
  assert again.step('a', lambda: 'not run', check=check) == 1
  assert again.step('a', lambda: 'not run', check=check) == 1
  assert again.step('e', lambda: 5, check=check) == 5  # computed here: nothing to check
  assert seen == [1]
  with pytest.raises(journal_lib.JournalError, match="line 4: step 'c' names something that"):
    again.step('c', lambda: 'not run', check=check)


class _HalfWrite:
  """A file whose writes land half-way, then fail as a full disk does."""

  def __init__(self, f):
    self._f = f

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()

  def write(self, data):
    self._f.write(data[: len(data) // 2])
    self._f.flush()
    raise OSError(errno.ENOSPC, 'No space left on device')

  def __getattr__(self, name):
    return getattr(self._f, name)


def test_a_write_that_fails_half_way_leaves_a_journal_that_resumes(tmp_path, monkeypatch):
  path = tmp_path / 'journal.jsonl'
  calls, compute = _counting()
  journal = journal_lib.Journal(path, config={})
  journal.step('a', compute(1))
  opened = pathlib.Path.open
  with monkeypatch.context() as patch:
    patch.setattr(pathlib.Path, 'open', lambda self, *a, **k: _HalfWrite(opened(self, *a, **k)))
    with pytest.raises(journal_lib.JournalError, match='No space left'):
      journal.step('b', compute(2))
  assert 'b' not in journal.done
  assert journal.step('c', compute(3)) == 3  # the append after the failed one
  journal.close()
  again = journal_lib.Journal(path, config={})
  assert again.resumed == 2 and again.done == {'a': 1, 'c': 3}
  assert again.step('b', compute(4)) == 4  # the failed step runs again
  again.close()
  assert journal_lib.Journal(path, config={}).done == {'a': 1, 'c': 3, 'b': 4}
  assert calls == [1, 2, 3, 4]


# One writer per journal -------------------------------------------------------------------------


def test_a_second_writer_of_an_open_journal_is_refused_naming_the_first(tmp_path):
  path = tmp_path / 'journal.jsonl'
  first = journal_lib.Journal(path, config={})
  with pytest.raises(journal_lib.JournalError, match=rf'another run \(pid {os.getpid()} on host'):
    journal_lib.Journal(path, config={})
  first.step('a', lambda: 1)  # the first writer is untouched by the refusal
  first.close()
  with journal_lib.Journal(path, config={}) as again:
    assert again.done == {'a': 1}
    again.step('b', lambda: 2)
  with pytest.raises(journal_lib.JournalError, match="closed; open it again to run step 'c'"):
    again.step('c', lambda: 3)
  assert journal_lib.Journal(path, config={}).done == {'a': 1, 'b': 2}


_HOLD = """
import sys
from graftjax.studies.common import journal
held = journal.Journal(sys.argv[1], config={})
held.step('theirs', lambda: 1)
print('held', flush=True)
sys.stdin.read()
"""


def test_a_journal_another_process_writes_is_refused_until_it_ends(tmp_path):
  path = tmp_path / 'journal.jsonl'
  other = subprocess.Popen(
    [sys.executable, '-c', _HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
  )
  try:
    assert other.stdout.readline() == b'held\n'
    with pytest.raises(journal_lib.JournalError, match=rf'another run \(pid {other.pid} on host'):
      journal_lib.Journal(path, config={})
  finally:
    other.communicate(b'', timeout=60)
  with journal_lib.Journal(path, config={}) as mine:  # its lock ended with it
    assert mine.done == {'theirs': 1}
