"""docs/examples/my_task.py, the "Add a task" walk-through: it loads by name and runs clean.

The same task without its held-out items runs recurrence only.
"""

import dataclasses
import pathlib

import pytest

from graftjax.flywheel import library as library_lib
from graftjax.flywheel import loop
from graftjax.flywheel import rescore
from graftjax.routing import route as route_lib
from graftjax.studies.flywheel import harness

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples'
BUDGET = loop.Budget(samples=1, max_new_tokens=4, recall_tokens=4, rows=2)


def _task(monkeypatch):
  monkeypatch.syspath_prepend(str(EXAMPLES))
  return harness.load_task('my_task:TASK')


def _bytes(text):
  return [1 + b % 200 for b in text.encode()]


def _library(path):
  return library_lib.Library(path, shape=library_lib.Shape(capacity=256, chunk_size=16))


def test_the_walk_through_fits_in_42_lines():
  assert len((EXAMPLES / 'my_task.py').read_text().splitlines()) <= 42


@pytest.mark.slow
def test_the_example_task_runs_and_rescores_clean(text_model, tmp_path, monkeypatch, tqdm_bars):
  unrelated = [f'The mascot of {team} is' for team in ('Ajax', 'Boca', 'Celtic', 'Dynamo')]
  task = dataclasses.replace(_task(monkeypatch), unrelated=lambda: unrelated)
  with harness.progress_bars() as progress:
    out = loop.run(
      text_model,
      task,
      library=_library(tmp_path),
      budget=BUDGET,
      routers=[
        route_lib.BM25Router(threshold=0.0),
        route_lib.EmbeddingRouter(text_model, chunk_size=16, batch_size=2, encode=_bytes),
      ],  # the embedding router's threshold fitted in the run
      progress=progress,
    )
    assert all(bar.disable for bar in tqdm_bars)  # each closed when its phase ended
  bars = {bar.desc: bar for bar in tqdm_bars}
  grafted = out['grafted_vs_prompted']['summary']['items']
  assert bars['recurrence: prompted'].n == bars['recurrence: prompted'].total == grafted
  assert bars['transfer: router calibration'].n == 1  # the embedding router
  assert list(bars)[:3] == ['base attempts', 'deposits', 'recurrence']
  phases = [a['phase'] for a in out['attempts']]
  assert phases.count('base') == phases.count('transfer_flywheel') == 3
  assert out['verifier'] == {'name': 'first_word', 'version': 1}
  assert {a['verdict']['verifier'] for a in out['attempts']} == {'first_word'}
  assert out['routing']['BM25Router']['accuracy']['trials'] == 3
  assert 'calibration' not in out['routing']['BM25Router']  # its threshold was given
  fitted = out['routing']['EmbeddingRouter']
  assert fitted['calibration']['threshold'] == fitted['threshold']
  assert fitted['calibration']['sizes'] == {
    'calibration': {'deposited': 1, 'reworded': 1, 'unrelated': 2},
    'report': {'deposited': 2, 'reworded': 2, 'unrelated': 2},
  }
  assert fitted['calibration']['bounded'] == 'unrelated'
  assert fitted['calibration']['report']['false_hit']['trials'] == 2
  found = rescore.check(out)
  assert not found.problems, found.problems
  fitted['calibration']['threshold'] = 0.123
  fitted['calibration']['report']['deposited']['high'] = 0.5
  problems = rescore.check(out).problems
  assert any('calibration.threshold 0.123 is not the evaluated threshold' in p for p in problems)
  assert any('calibration.report.deposited.high' in p for p in problems)


@pytest.mark.slow
def test_a_task_without_held_out_items_runs_recurrence_only(text_model, tmp_path, monkeypatch):
  task = dataclasses.replace(_task(monkeypatch), held_out=None, targets=None)
  out = loop.run(text_model, task, library=_library(tmp_path), budget=BUDGET)
  phases = {a['phase'] for a in out['attempts']}
  assert phases <= {'base', 'recurrence'} and 'base' in phases
  unsolved = out['summary']['recurrence_items']
  assert [a['phase'] for a in out['attempts']].count('recurrence') == unsolved
  assert out['routing'] == {} and out['summary']['transfer_flywheel'] == {'items': 0}
  found = rescore.check(out)
  assert not found.problems, found.problems
  assert any('recurrence only' in n for n in found.notes)


def test_the_guide_quotes_the_example_as_it_is():
  guide = (EXAMPLES.parent / 'flywheel.md').read_text().split('### Add a task')[1]
  quoted = guide.split('```python\n')[1].split('```')[0].splitlines()
  lines = (EXAMPLES / 'my_task.py').read_text().splitlines()
  assert len(quoted) > 20 and [q for q in quoted if '[...]' not in q and q not in lines] == []
