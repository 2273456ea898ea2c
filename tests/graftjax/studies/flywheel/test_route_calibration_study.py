"""Router calibration on a task's library, and the flywheel page's tables of it and the bench."""

import pytest

from graftjax import ledger
from graftjax.flywheel import tasks
from graftjax.routing import route as route_lib
from graftjax.studies.common import results_page
from graftjax.studies.flywheel import route_calibration

TOPICS = [
  'apples orchard harvest',
  'trains station platform',
  'violin concert orchestra',
  'glacier mountain climbing',
  'bakery bread flour',
  'chess tournament opening',
  'volcano lava eruption',
  'submarine ocean depth',
  'tulips garden spring',
  'rocket launch orbit',
  'library books shelves',
  'marathon runners finish',
]


def item(index, question, template=None):
  return tasks.Item(
    task='toy',
    id=f'toy/{index}',
    question=question,
    answer='1',
    source='t',
    split='t',
    template=template,
  )


def toy_task(unrelated_count=12):
  deposited = [item(i, f'How many {t} are there?') for i, t in enumerate(TOPICS)]
  held = [item(100 + i, f'Count the {t} please.', f'toy/{i}') for i, t in enumerate(TOPICS)]
  held.append(item(999, 'A question of a template never deposited?', 'toy/none'))
  unrelated = [f'What colour is the sky {w} tonight?' for w in range(unrelated_count)]
  return tasks.Task(
    'toy', 'numeric', lambda: deposited, held_out=lambda: held, unrelated=lambda: unrelated
  )


def test_queries_label_held_out_items_with_their_deposited_item():
  queries = route_calibration.queries(toy_task())
  assert queries.counts() == {'deposited': 12, 'reworded': 12, 'unrelated': 12}
  assert queries.reworded[0] == ('Count the apples orchard harvest please.', 'toy/0')
  targets = {'toy/100': 'toy/5'}
  task = toy_task()
  task = tasks.Task('toy', 'numeric', task.load, held_out=task.held_out, targets=targets)
  assert route_calibration.queries(task).reworded == [
    ('Count the apples orchard harvest please.', 'toy/5')
  ]


def test_every_router_is_fitted_and_reported_on_the_other_half():
  result = route_calibration.experiment(
    toy_task(),
    [route_lib.BM25Router()],
    seed=3,
    max_false_hit=0.05,
    header={'inputs': {}},
    conservative=False,
  )
  fit = result['routers']['BM25Router']
  assert fit['split']['seed'] == 3 and fit['sizes']['report'] == {
    'deposited': 6,
    'reworded': 6,
    'unrelated': 6,
  }
  summary = result['summary']['BM25Router']
  assert summary['threshold'] == fit['threshold'] > 0
  assert summary['false_hit'] == fit['report']['false_hit']
  assert summary['held_out'] == fit['held_out'] and not summary['held_out']['met']
  assert result['queries'] == {'deposited': 12, 'reworded': 12, 'unrelated': 12}
  assert 'BM25Router threshold' in route_calibration.format_rows(result)
  assert 'not bounded: 6 unrelated queries held out' in route_calibration.format_rows(result)


def test_the_calibration_bounds_held_out_false_hits_or_says_it_cannot():
  """The fit bounded the point estimate: 'met' at 0/6 held out, whose interval reaches 39%."""
  run = lambda task: route_calibration.experiment(
    task, [route_lib.BM25Router()], seed=0, max_false_hit=0.05, header={'inputs': {}}
  )
  result = run(toy_task(unrelated_count=146))
  assert result['conservative'] is True
  bound = result['summary']['BM25Router']['held_out']
  assert bound['met'] and bound['upper'] <= 0.05 and bound['why'] is None
  assert result['summary']['BM25Router']['false_hit']['trials'] == 73
  line = route_calibration.format_rows(result)
  assert f'false hits 0/73 (Wilson upper limit {bound["upper"]:.1%} <= 5.0%)' in line
  result = run(toy_task())  # 12 unrelated questions cannot bound 5%
  assert 'at least 73' in result['summary']['BM25Router']['refused']
  assert 'BM25Router no threshold: cannot bound false hits at 5.0%' in (
    route_calibration.format_rows(result)
  )


def test_template_ids():
  assert route_calibration.template_ids('0-3,7, 9') == [0, 1, 2, 3, 7, 9]
  assert route_calibration.template_ids('') == []


def _rate(s, n):
  return {'successes': s, 'trials': n, 'rate': s / n, 'low': 0.0, 'high': 1.0, 'confidence': 0.95}


@pytest.fixture
def study(tmp_path):
  where = tmp_path / 'flywheel'
  (where / 'runs').mkdir(parents=True)
  (where / results_page.DECLARATION).write_text(
    'title = "Flywheel"\norder = 1\nsection = "graftjax.studies.flywheel.section_flywheel"\n'
  )
  return where


def test_the_flywheel_page_shows_the_bench_and_the_calibration(study, tmp_path):
  cpu = {'device_kind': 'cpu', 'cpu_model': 'toy', 'jax_version': '0'}
  arm = {
    'first': {'seconds': 7.5},
    'repeated_median_s': 0.5,
    'unseen_in_bucket_median_s': 0.6,
    'unseen_in_bucket_over_repeated': 1.2,
  }
  bench = {
    'experiment': 'bench_answer',
    'command': 'python experiments/bench_answer.py',
    'determinism': cpu,
    'model': 'gemma3-270m',
    'deposits': [{'seconds': 19.0}, {'seconds': 1.0}, {'seconds': 3.0}],
    'arms': {
      'bucketed': {**arm, 'unseen_across_median_s': 0.9, 'unseen_across_over_repeated': 1.8},
      'unbucketed': {**arm, 'unseen_in_bucket_over_repeated': 13.25},
    },
  }
  report = {
    'threshold': 0.417,
    'deposited': _rate(35, 35),
    'reworded': _rate(34, 35),
    'false_hit': _rate(0, 35),
  }
  calibration = {
    'experiment': 'route_calibration',
    'command': 'python experiments/route_calibration.py',
    'determinism': cpu,
    'task': 'gsm8k',
    'seed': 0,
    'max_false_hit': 0.05,
    'summary': {
      'BM25Router': report,  # a result from before held-out bounds
      'EmbeddingRouter': {**report, 'held_out': {'met': False}},
      'ExactRouter': {'refused': 'cannot bound false hits at 5.0%'},
    },
  }
  ledger.write_result(study / 'bench_answer_cpu.json', bench)
  ledger.write_result(study / 'route_calibration_cpu.json', calibration)
  page = results_page.pages(tmp_path)['flywheel/README.md']
  for figure in (
    '| bucketed | 7.5 | 0.5 | 0.6 | 1.20x | 0.9 | 1.80x |',
    '| unbucketed | 7.5 | 0.5 | 0.6 | 13.25x | - | - |',
    '| gsm8k | BM25Router | 0.417 | 5.0% (seed 0) | 35/35 = 100.0%',
    '34/35 = 97.1%',
    '0/35 = 0.0%',
    '[0.0%, 100.0%] (not bounded) |',
    '| gsm8k | ExactRouter | none | 5.0% (seed 0) | - | - | - |',
    'the first 19 s (it compiles), the 2 later ones 2 s (median)',
  ):
    assert figure in page, figure
