"""`loop.check_task` checks every item's gold before the model loads, naming the item; the
library's `code` verifier is found by name without importing its module first."""

import os
import subprocess
import sys

import pytest

from graftjax.flywheel import loop
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers


def _item(i, answer, solution=None, split='dep'):
  return tasks.Item(
    'sums', f'{split}/{i}', f'What is {i} + {i}?', answer, 'test', split, solution=solution
  )


def _numeric_task(bad_at: int, *, held_out=False):
  items = [_item(i, str(2 * i)) for i in range(10)]
  items[bad_at] = _item(bad_at, 'about twelve')
  if held_out:
    return tasks.Task('sums', 'numeric', lambda: items[:3], held_out=lambda: items[3:])
  return tasks.Task('sums', 'numeric', lambda: items)


def test_a_gold_the_verifier_refuses_on_item_7_is_named_before_the_model_loads(monkeypatch):
  from graftjax.models.gemma import model as gemma_model
  from graftjax.studies.flywheel import harness

  def never(*args, **kwargs):
    raise AssertionError('the model was loaded')

  monkeypatch.setattr(gemma_model, 'load_named', never)
  with pytest.raises(tasks.TaskError, match=r'fails on item dep/7 \(its gold\): ValueError: gold'):
    harness.experiment(
      harness.Settings(
        model_name='tiny',
        dtype='float32',
        impl='xla',
        budget=loop.Budget(max_new_tokens=4, recall_tokens=4),
        capacity=128,
        library_dir=None,
        bm25_threshold=None,
        measure_energy=False,
        task=_numeric_task(7),
      )
    )


def test_held_out_golds_are_checked_too():
  with pytest.raises(tasks.TaskError, match='item dep/5'):
    loop.check_task(_numeric_task(5, held_out=True))


def test_a_verifier_without_a_gold_check_runs_on_every_reference():
  calls = []

  def picky(text, gold):
    calls.append(text)
    if text == 'bad':
      raise ValueError('cannot read this reference')
    return text in gold

  verifiers.register('picky_reference', 1, picky)
  items = [_item(i, str(i), solution='bad' if i == 3 else None) for i in range(5)]
  with pytest.raises(tasks.TaskError, match=r'item dep/3 \(its reference answer\)'):
    loop.check_task(tasks.Task('sums', 'picky_reference', lambda: items))
  assert calls == ['0', '1', '2', 'bad']


def test_a_gold_check_replaces_the_call_after_the_first_item():
  calls, golds = [], []
  verifiers.register('costly', 1, lambda text, gold: calls.append(text) or True, gold=golds.append)
  items = [_item(i, str(i)) for i in range(4)]
  loop.check_task(tasks.Task('sums', 'costly', lambda: items))
  assert calls == ['0'] and golds == [('1',), ('2',), ('3',)]


def test_a_code_gold_without_its_tests_part_is_refused_without_running_code(monkeypatch):
  from graftjax.flywheel import code_verifier

  ran = []
  monkeypatch.setattr(
    code_verifier,
    'run',
    lambda problem, text: ran.append(text) or code_verifier.Outcome(True, None, None, None),
  )
  good = tasks.Item(
    'code',
    'p/0',
    'def f():\n',
    'def f():\n',
    'test',
    'test',
    aliases=('def check(c): pass', 'f'),
    solution='  return 1\n',
  )
  bad = tasks.Item('code', 'p/1', 'def g():\n', 'def g():\n', 'test', 'test', aliases=('g',))
  with pytest.raises(tasks.TaskError, match=r'item p/1 \(its gold\): ValueError: a code gold'):
    loop.check_task(tasks.Task('code', 'code', lambda: [good, bad]))
  assert len(ran) == 1  # the first item's reference alone ran in the sandbox


def test_the_code_verifier_is_found_by_name_without_importing_it_first():
  script = (
    'import sys\n'
    'from graftjax.flywheel import verifiers\n'
    "assert 'graftjax.flywheel.code_verifier' not in sys.modules\n"
    "print(verifiers.get('code').name, verifiers.get('code', 3).version)\n"
  )
  proc = subprocess.run(
    [sys.executable, '-c', script],
    capture_output=True,
    text=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    timeout=120,
    check=False,
  )
  assert proc.returncode == 0 and proc.stdout.split() == ['code', '3'], proc.stderr[-2000:]
