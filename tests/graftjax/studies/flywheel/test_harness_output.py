"""What experiments/flywheel.py takes and prints: HumanEval's size as a flag; each routing
line says a thing once."""

import pytest

from graftjax.flywheel import datasets
from graftjax.flywheel import tasks
from graftjax.routing import route as route_lib
from graftjax.studies.flywheel import harness


def test_a_router_fitted_without_unrelated_questions_says_so_once():
  router = route_lib.BM25Router()
  topics = [f'topic{i} widget{i}' for i in range(6)]
  router.add_many((f'k{i}', f'How many {t}?') for i, t in enumerate(topics))
  queries = route_lib.Queries(deposited=[(f'How many {t}?', f'k{i}') for i, t in enumerate(topics)])
  fit = route_lib.calibrate(router, queries).to_json()
  assert fit['held_out'] and not fit['held_out']['met']  # the bound has a reason of its own
  (line,) = harness.format_routing(
    {'router': 'BM25Router', 'routing': {'BM25Router': {'calibration': fit}}}
  ).splitlines()
  assert line.endswith('fitted; no unrelated questions held out'), line
  assert line.count('held out') == 1


def test_the_humaneval_task_takes_its_size():
  try:
    task = harness.load_task('humaneval', problems=5)
  except datasets.DatasetError as e:
    pytest.skip(str(e))
  assert [i.id for i in task.items()] == [f'HumanEval/{i}' for i in range(5)]
  assert len(list(harness.load_task('humaneval').items())) == 64
  with pytest.raises(tasks.TaskError, match='count of humaneval problems'):
    harness.load_task('qa_wikidata', problems=5)
