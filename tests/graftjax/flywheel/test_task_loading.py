"""A `--task` plug-in never ends the caller: whatever its module or factory does (raise, need
arguments, call sys.exit), loading it is a `TaskError` naming the spec and the cause."""

import pytest

from graftjax.flywheel import tasks
from graftjax.studies.flywheel import harness

USER_TASKS = """
import sys
from graftjax.flywheel import tasks

TASK = tasks.Task('toy', 'alias', lambda: [])

def make():
  return TASK

def raises():
  raise RuntimeError('no dataset here')

def needs(split):
  return TASK

def exits():
  sys.exit(0)

def gives_none():
  return None
"""


@pytest.fixture
def user_tasks(tmp_path, monkeypatch):
  (tmp_path / 'user_tasks_l.py').write_text(USER_TASKS)
  (tmp_path / 'exiting_tasks_l.py').write_text('import sys\nsys.exit(0)\n')
  monkeypatch.syspath_prepend(str(tmp_path))


def test_a_task_or_its_factory_loads(user_tasks):
  assert harness.load_task('user_tasks_l:make') is harness.load_task('user_tasks_l:TASK')
  assert tasks.load('user_tasks_l:make').name == 'toy'


@pytest.mark.parametrize(
  'spec, says',
  [
    ('user_tasks_l:raises', "'user_tasks_l:raises'.*RuntimeError: no dataset here"),
    ('user_tasks_l:needs', "'user_tasks_l:needs' needs arguments.*split"),
    ('user_tasks_l:exits', r"'user_tasks_l:exits'.*called sys.exit\(0\)"),
    ('exiting_tasks_l:TASK', r"'exiting_tasks_l:TASK' cannot be loaded.*called sys.exit\(0\)"),
    ('user_tasks_l:gives_none', "'user_tasks_l:gives_none' is a NoneType, not a"),
    ('user_tasks_l:', 'package.module:Name'),
  ],
)
def test_a_task_plug_in_that_fails_is_a_task_error_naming_it(user_tasks, spec, says):
  with pytest.raises(tasks.TaskError, match=says):
    harness.load_task(spec)
