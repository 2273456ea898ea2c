"""The code verifier's two sandboxed programs and the plain-data wire between them.

This file runs as `main.py` in two sandboxes at once (standard library only):

- `serve` (the candidate's sandbox): imports the candidate's code as the module `candidate`,
  then answers each call it is sent with the entry point's return value as plain data.
  Everything in this process is the candidate's to change; it holds nothing worth stealing.
- `judge` (the problem's sandbox; no candidate code runs there): checks that the candidate's
  code compiles, runs the problem's `check(candidate)` with a proxy whose calls go to `serve`,
  and writes the verdict, with the run's nonce, to a descriptor only it holds.

A value crosses the wire as JSON: None, bool, int, float and str as themselves, a list as an
array, a tuple, set, frozenset or dict tagged ({'t': [...]}, {'s': ...}, {'f': ...},
{'d': [[key, value], ...]}). The judge decodes it into those exact built-in types, so every
`==` of a check runs on built-in values, never on an object of the candidate's.

Causes (the verdict's `cause`; None is a pass): 'syntax_error', 'no_entry_point',
'exception:<Type>' (raised by the candidate, or by the check on its values), 'assertion',
'memory', 'process_limit', 'file_size', 'bad_return_type:<type>', 'bad_message',
'output_limit' (an answer over MAX_MESSAGE bytes), 'candidate_exited' (its process ended;
the caller names how), 'problem_error:<Type>' (the problem's own code failed) and
'problem_error:argument:<type>' (its check passed something that is not plain data).
"""

import errno
import json
import os
import re
import sys

MAX_MESSAGE = 16 << 20  # bytes of one answer
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]{0,99}')  # a type's name, as a cause may hold it
_TAGS = {'t': tuple, 's': set, 'f': frozenset}
_BUILTIN = (type(None), bool, int, float, str)


class WireError(ValueError):
  """A value or message that is not plain data; `cause` says how."""

  def __init__(self, cause: str):
    super().__init__(cause)
    self.cause = cause


def _plain(value):
  kind = type(value)
  if kind in _BUILTIN:
    return value
  if kind is list:
    return [_plain(x) for x in value]
  if kind is tuple:
    return {'t': [_plain(x) for x in value]}
  if kind in (set, frozenset):
    return {'s' if kind is set else 'f': [_plain(x) for x in value]}
  if kind is dict:
    return {'d': [[_plain(k), _plain(x)] for k, x in value.items()]}
  raise WireError(f'bad_return_type:{kind.__name__}')


def encode(value) -> bytes:
  """`value` as one line of the wire; WireError if it is not plain data."""
  try:
    text = json.dumps(_plain(value), ensure_ascii=True, check_circular=True)
  except WireError:
    raise
  except RecursionError:  # nested past the interpreter's depth, or circular
    raise WireError('bad_return_type:nested_too_deep') from None
  except ValueError:  # an int past the interpreter's limit on digits
    raise WireError('bad_return_type:huge_int') from None
  return text.encode() + b'\n'


def _tagged(pairs):
  if len(pairs) != 1:
    raise WireError('bad_message')
  ((tag, items),) = pairs
  if tag == 'd' and type(items) is list and all(type(p) is list and len(p) == 2 for p in items):
    return dict(items)
  if tag in _TAGS and type(items) is list:
    return _TAGS[tag](items)
  raise WireError('bad_message')


def decode(line: bytes):
  """The plain value one line of the wire holds; WireError('bad_message') if it holds none."""
  try:
    return json.loads(line, object_pairs_hook=_tagged)
  except WireError:
    raise
  except (ValueError, TypeError, RecursionError, MemoryError):  # not JSON; an unhashable key
    raise WireError('bad_message') from None


def _raised(error: BaseException) -> list:
  number = error.errno if isinstance(error, OSError) and type(error.errno) is int else None
  return ['raise', type(error).__name__, number, str(error)[:200]]


def serve(request_fd: int, response_fd: int, entry_point: str) -> None:
  """The candidate's side: import /tmp/candidate.py, then answer each call until the judge ends."""
  import importlib.util

  requests, responses = os.fdopen(request_fd, 'rb'), os.fdopen(response_fd, 'wb')

  def send(message) -> None:
    responses.write(encode(message))
    responses.flush()

  spec = importlib.util.spec_from_file_location('candidate', '/tmp/candidate.py')
  module = importlib.util.module_from_spec(spec)
  sys.modules['candidate'] = module
  try:
    spec.loader.exec_module(module)
  except BaseException as error:
    send(_raised(error))
    return
  function = getattr(module, entry_point, None)
  send(['ready'] if callable(function) else ['no_entry_point'])
  for line in requests:
    args, kwargs = decode(line)
    try:
      value = function(*args, **kwargs)
    except BaseException as error:
      send(_raised(error))
      continue
    try:
      send(['return', value])
    except WireError as error:
      send(['bad_return', error.cause])


class CandidateFailed(BaseException):
  """The candidate failed a call; a BaseException, so no `except Exception` in a check hides it."""

  def __init__(self, cause: str):
    super().__init__(cause)
    self.cause = cause


def _exception_cause(name, number, message) -> str:
  if name == 'MemoryError':
    return 'memory'
  if number == errno.EAGAIN or (name == 'RuntimeError' and "can't start new thread" in message):
    return 'process_limit'
  if number == errno.EFBIG:
    return 'file_size'
  return f'exception:{name}'


class Channel:
  """The judge's end of the wire: one answer read per message sent."""

  def __init__(self, request_fd: int, response_fd: int):
    self._requests = os.fdopen(request_fd, 'wb')
    self._responses = os.fdopen(response_fd, 'rb')

  def send(self, message) -> None:
    try:
      self._requests.write(encode(message))
      self._requests.flush()
    except BrokenPipeError:
      raise CandidateFailed('candidate_exited') from None

  def receive(self) -> list:
    line = self._responses.readline(MAX_MESSAGE + 1)
    if not line.endswith(b'\n'):
      raise CandidateFailed('output_limit' if len(line) > MAX_MESSAGE else 'candidate_exited')
    try:
      message = decode(line)
    except WireError as error:
      raise CandidateFailed(error.cause) from None
    if type(message) is not list or not message or message[0] not in _ANSWERS:
      raise CandidateFailed('bad_message')
    if len(message) != _ANSWERS[message[0]]:
      raise CandidateFailed('bad_message')
    return message


_ANSWERS = {'ready': 1, 'no_entry_point': 1, 'return': 2, 'bad_return': 2, 'raise': 4}


def _failure(message: list) -> str:
  """The cause a non-'return' answer names."""
  if message[0] == 'raise':
    _, name, number, text = message
    if type(name) is not str or not _NAME.fullmatch(name) or type(text) is not str:
      return 'bad_message'
    return _exception_cause(name, number, text)
  if message[0] == 'bad_return':
    cause = message[1]
    kind = cause.split(':', 1)[-1] if type(cause) is str else ''
    return cause if cause == f'bad_return_type:{kind}' and _NAME.fullmatch(kind) else 'bad_message'
  return message[0]


class Candidate:
  """What a check calls: each call's arguments go to the candidate, its answer comes back as
  plain data. The first failure is kept: a check that swallows it still fails."""

  def __init__(self, channel: Channel):
    self._channel = channel
    self.failure = None

  def __call__(self, *args, **kwargs):
    if self.failure is not None:
      raise CandidateFailed(self.failure)
    try:
      encode((args, kwargs))
    except WireError as error:
      self.failure = 'problem_error:argument:' + error.cause.split(':', 1)[1]
      raise CandidateFailed(self.failure) from None
    try:
      self._channel.send([list(args), kwargs])
      message = self._channel.receive()
    except CandidateFailed as failed:
      self.failure = failed.cause
      raise
    if message[0] != 'return':
      self.failure = _failure(message)
      raise CandidateFailed(self.failure)
    return message[1]


def _check(problem: dict, channel: Channel) -> str | None:
  """Runs the problem's check on the candidate; the cause it failed, None if it passed."""
  try:
    compile(problem['source'], 'candidate.py', 'exec')
  except (SyntaxError, ValueError):  # ValueError: a null byte (Python 3.11)
    return 'syntax_error'
  except (RecursionError, MemoryError) as error:
    return f'exception:{type(error).__name__}'
  try:
    first = channel.receive()
  except CandidateFailed as failed:
    return failed.cause
  if first[0] != 'ready':
    return _failure(first)
  namespace = {'__name__': 'problem'}
  try:
    exec(compile(f'{problem["prompt"]}\n\n{problem["test"]}\n', 'problem.py', 'exec'), namespace)
    check = namespace['check']
  except Exception as error:
    return f'problem_error:{type(error).__name__}'
  candidate = Candidate(channel)
  namespace[problem['entry_point']] = candidate  # as the candidate's own program would name it
  try:
    check(candidate)
  except CandidateFailed as failed:
    return failed.cause
  except AssertionError:
    return candidate.failure or 'assertion'
  except BaseException as error:
    return candidate.failure or _exception_cause(type(error).__name__, None, str(error))
  return candidate.failure


def judge(problem_path: str, request_fd: int, response_fd: int, verdict_fd: int) -> None:
  """The problem's side: check the candidate, then write {'nonce', 'cause'} to `verdict_fd`."""
  with open(problem_path, encoding='utf-8') as f:
    problem = json.load(f)
  cause = _check(problem, Channel(request_fd, response_fd))
  with os.fdopen(verdict_fd, 'wb') as verdict:
    verdict.write(json.dumps({'nonce': problem['nonce'], 'cause': cause}).encode())


if __name__ == '__main__':
  if sys.argv[1] == 'serve':
    serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
  else:
    judge(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
