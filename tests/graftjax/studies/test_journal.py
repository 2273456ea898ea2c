"""The run journal: finished steps are kept, a torn line is dropped, another run is refused."""

import pytest

from graftjax.studies import journal as journal_lib


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
  again = journal_lib.Journal(path, config={'items': [1, 2]})
  assert again.resumed == 1
  assert again.step('a', compute('not run')) == {'x': 1.5, 'ids': [1, 2]}
  assert again.step('b', compute([3])) == [3]
  assert calls == [{'x': 1.5, 'ids': (1, 2)}, [3]]
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
  reopened = journal_lib.Journal(path, config={})
  assert reopened.done == {'a': 1}
  assert reopened.step('b', lambda: 2) == 2
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
