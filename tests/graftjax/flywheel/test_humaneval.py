"""The code task through the flywheel: code mode, fenced deposits, fitted routing, HumanEval."""

import dataclasses
import shutil

import pytest

from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import code_verifier, datasets, humaneval, rescore, tasks
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import loop
from graftjax.routing import route as route_lib

needs_bwrap = pytest.mark.skipif(
  shutil.which('bwrap') is None,
  reason='bubblewrap is not installed here (`make setup` installs it as root)',
)

_FENCE = 4  # a control byte no text holds, standing for Gemma's one '```' token


class FenceTokenizer:
  """The tests' byte tokenizer, with '```' one token as in Gemma's vocabulary."""

  def __init__(self, inner):
    self.inner = inner
    self.vocab_size = inner.vocab_size

  def encode(self, text, *, add_bos=True):
    pieces = text.split('```')
    ids = []
    for i, piece in enumerate(pieces):
      ids += ([_FENCE] if i else []) + self.inner.encode(piece, add_bos=False)
    return ([2] if add_bos else []) + ids

  def decode(self, ids, *, skip_special=False):
    parts, run = [], []
    for i in [*ids, None]:
      if i in (_FENCE, None):
        parts.append(self.inner.decode(run, skip_special=skip_special))
        run = []
      else:
        run.append(i)
    return '```'.join(parts)

  def digest(self):
    return 'bytes+fence'


@pytest.fixture(scope='module')
def code_model(text_model):
  return dataclasses.replace(text_model, tokenizer=FenceTokenizer(text_model.tokenizer))


def _problem(i, name, op, a, b):
  return tasks.Item(
    task='toy_code',
    id=f'c{i}',
    question=f'def {name}(a, b):\n  """{name.title()} a and b."""\n',
    answer=f'def {name}(a, b):\n  """{name.title()} a and b."""\n',
    aliases=(f'def check(f):\n  assert f({a}, {b}) == {a} {op} {b}\n', name),
    solution=f'  return a {op} b\n',
    source='test',
    split='test',
  )


PROBLEMS = [
  _problem(0, 'add', '+', 2, 3),
  _problem(1, 'sub', '-', 7, 4),
  _problem(2, 'mul', '*', 3, 5),
]
TOY = tasks.Task(
  'toy_code',
  code_verifier.VERIFIER,
  lambda: PROBLEMS,
  prompt=humaneval.PROMPT,
  reworded=lambda: [(f'{p.aliases[1].title()} two numbers', p.id) for p in PROBLEMS],
  unrelated=lambda: [f'Reverse a list of {n} strings' for n in ('two', 'three', 'four', 'five')],
)


def test_code_mode_asks_in_an_open_fence_and_stops_at_its_close(code_model):
  prompt = humaneval.PROMPT
  assert (prompt.base_mode, prompt.recall_mode, prompt.transfer_mode) == ('code', 'code', 'code')
  assert answer_lib.stop_ids(code_model, 'code') == (_FENCE, code_model.config.eos_id)
  ids = answer_lib.query_ids(code_model, 'def f():\n', mode='code', after_block=True)
  assert code_model.tokenizer.decode(ids).endswith('Final answer:\n```python\n')


def test_other_prompts_keep_their_modes():
  qa = tasks.Prompt('', library_lib.RECALL_QUERY, answer_only=True)
  solve = tasks.Prompt('', library_lib.SOLVE_QUERY)
  assert (qa.base_mode, qa.recall_mode, qa.transfer_mode) == ('recall', 'recall', 'recall')
  assert (solve.base_mode, solve.recall_mode, solve.transfer_mode) == ('solve', 'recall', 'solve')


@pytest.mark.slow
@needs_bwrap
def test_the_loop_runs_a_code_task_and_its_result_re_checks(code_model, tmp_path):
  library = library_lib.Library(tmp_path, shape=library_lib.Shape(capacity=256, chunk_size=16))
  budget = loop.Budget(max_new_tokens=6, recall_tokens=20, rows=3)
  routers = [route_lib.BM25Router(), route_lib.ExactRouter()]
  out = loop.run(code_model, TOY, library=library, budget=budget, routers=routers)
  assert out['verifier'] == {'name': 'code', 'version': code_verifier.VERSION}
  assert [d['source'] for d in out['deposits']] == ['reference'] * 3  # random weights solve none
  for entry, item in zip(library.entries(), PROBLEMS):
    assert entry.text == library_lib.CODE_TEMPLATE.format(
      question=item.question, answer=item.solution.rstrip()
    )
  recurrence = [a for a in out['attempts'] if a['phase'] == 'recurrence']
  assert [a['answered_by'] for a in recurrence] == ['flywheel'] * 3
  assert all(a['verdict']['verifier'] == 'code' for a in out['attempts'])
  assert out['grafted_vs_prompted']['summary']['logits_byte_equal'] == 3
  fitted = out['routing']['BM25Router']['calibration']
  assert fitted['sizes']['calibration'] == {'deposited': 1, 'reworded': 1, 'unrelated': 2}
  assert set(out['routing']) == {'BM25Router'}  # the exact router has a threshold of its own
  found = rescore.check(out)
  assert found.problems == [], found.problems
  assert any('fitted and reported' in note for note in found.notes)
  fitted['report']['reworded']['successes'] += 1  # a rate whose interval is not its own
  assert any(
    'routing.BM25Router.calibration.report.reworded' in p for p in rescore.check(out).problems
  )


@needs_bwrap
def test_an_answer_asked_in_a_fence_is_checked_up_to_its_close():
  problem = code_verifier.Problem.from_gold(PROBLEMS[0].gold)
  verdict = code_verifier.VERIFIER('  return a + b\n```', problem.gold)
  assert verdict.verdict and verdict.extracted == '  return a + b\n'
  assert not code_verifier.VERIFIER('  return a - b\n```\nreturn a + b', problem.gold).verdict


def test_a_prompt_without_its_tests_passes_nothing():
  verdict = code_verifier.VERIFIER('  return a + b\n', (PROBLEMS[0].question,))
  assert (verdict.verdict, verdict.detail) == (False, 'no tests to run')
  assert verdict.gold == (PROBLEMS[0].question,)


def _items():
  try:
    return code_verifier.humaneval_items()
  except datasets.DatasetError as error:
    pytest.skip(f'HumanEval is not installed here (`make setup` installs it): {error}')


def test_a_description_is_the_docstring_prose_before_its_examples():
  items = _items()
  assert humaneval.description(items[0]) == (
    'Check if in given list of numbers, are any two numbers closer to each other than given'
    ' threshold.'
  )
  assert humaneval.description(items[115]).startswith('You are given a rectangular grid of wells.')
  assert all('>>>' not in humaneval.description(item) for item in items)


def test_the_humaneval_task_deposits_its_first_problems_and_routes_the_rest_away():
  items = _items()
  task = humaneval.task(5)
  chosen = list(task.items())
  assert [i.id for i in chosen] == [f'HumanEval/{i}' for i in range(5)]
  assert [i for _, i in task.reworded()] == [i.id for i in chosen]
  unrelated = task.unrelated()
  assert len(unrelated) == 2 * (len(items) - 5)
  assert not {i.question for i in chosen} & set(unrelated)
  assert task.prompt.query == library_lib.CODE_QUERY
  with pytest.raises(tasks.TaskError, match='count'):
    humaneval.task(len(items))
