"""SHA-256 of every experiment input and output, and re-checking a result.

A result file is JSON. `write_result` adds the digest of its own canonical
body under `result_sha256`, so `verify_result` can tell whether the file
was edited after it was written, without running any model.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import stat
from typing import Any

import numpy as np

from graftjax.errors import GraftjaxError


def sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def sha256_array(array) -> str:
  """SHA-256 of an array's raw bytes, C order, as stored (no header).

  This is the digest the paper compares: equal digests mean byte-equal values.
  """
  arr = np.ascontiguousarray(np.asarray(array))
  return hashlib.sha256(arr.reshape(-1).view(np.uint8)).hexdigest()


def sha256_tokens(token_ids) -> str:
  """SHA-256 of token ids as little-endian int32."""
  return sha256_array(np.asarray(token_ids, dtype='<i4'))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    while block := f.read(chunk):
      digest.update(block)
  return digest.hexdigest()


MAX_DEPTH = 64  # objects and arrays nested deeper than this are not a result
MAX_BYTES = 256 << 20  # a result file is JSON of well under a megabyte; beyond this, refused
_KINDS = (
  (stat.S_ISDIR, 'a directory'),
  (stat.S_ISFIFO, 'a FIFO'),
  (stat.S_ISCHR, 'a character device'),
  (stat.S_ISBLK, 'a block device'),
  (stat.S_ISSOCK, 'a socket'),
)


class ResultError(GraftjaxError, ValueError):
  """A result file cannot be read as a result, or no longer matches its own digest."""


def _canonical(body: dict[str, Any]) -> bytes:
  return json.dumps(body, sort_keys=True, separators=(',', ':'), allow_nan=False).encode()


def _problem(value: Any) -> str | None:
  """Where `value` is not a result body (nesting depth, a non-finite number), or None."""
  stack = [(value, '', 1)]
  while stack:
    node, where, depth = stack.pop()
    if isinstance(node, (dict, list)) and depth > MAX_DEPTH:
      return f'{where or "the top level"} is nested deeper than {MAX_DEPTH} levels'
    if isinstance(node, dict):
      stack += [(v, f'{where}.{k}' if where else k, depth + 1) for k, v in node.items()]
    elif isinstance(node, list):
      stack += [(v, f'{where}[{i}]', depth + 1) for i, v in enumerate(node)]
    elif isinstance(node, float) and not math.isfinite(node):
      return f'{where or "the top level"} is {node}, not a finite number'
  return None


def write_result(path: str | os.PathLike, result: dict[str, Any]) -> str:
  """Writes `result` with its own digest (atomically); returns the digest.

  Raises:
    ResultError: `result` holds a NaN or infinity, or is nested deeper than `MAX_DEPTH`
      (`verify_result` would refuse the file).
  """
  body = {k: v for k, v in result.items() if k != 'result_sha256'}
  if cause := _problem(body):
    raise ResultError(f'{path}: not written: {cause}')
  digest = sha256_bytes(_canonical(body))
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f'.{path.name}.tmp')
  tmp.write_text(json.dumps({**body, 'result_sha256': digest}, indent=1, sort_keys=True) + '\n')
  os.replace(tmp, path)
  return digest


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  seen = set()
  for key, _ in pairs:
    if key in seen:
      raise ValueError(f'duplicate key {key!r}')
    seen.add(key)
  return dict(pairs)


def _no_constant(name: str) -> Any:
  raise ValueError(f'{name} is not a JSON number')


def _read_bytes(path: str | os.PathLike) -> bytes:
  """The bytes of the regular file at `path`, at most `MAX_BYTES`; a `ResultError` otherwise.

  The file is opened without blocking (a FIFO without a writer does not wait) and checked to
  be a regular file before anything is read.
  """
  try:
    fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
  except OSError as e:
    raise ResultError(f'{path}: cannot be read: {e.strerror or e}') from None
  try:
    mode = os.fstat(fd).st_mode
  except OSError as e:
    os.close(fd)
    raise ResultError(f'{path}: cannot be read: {e.strerror or e}') from None
  if not stat.S_ISREG(mode):
    os.close(fd)
    kind = next((name for test, name in _KINDS if test(mode)), 'a special file')
    raise ResultError(f'{path}: cannot be read as a result: it is {kind}, not a regular file')
  with open(fd, 'rb', buffering=0) as f:
    try:
      chunks, size = [], 0
      while size <= MAX_BYTES and (chunk := f.read(min(1 << 20, MAX_BYTES + 1 - size))):
        chunks.append(chunk)
        size += len(chunk)
    except OSError as e:
      raise ResultError(f'{path}: cannot be read: {e.strerror or e}') from None
  if size > MAX_BYTES:
    raise ResultError(f'{path}: not a result file: larger than {MAX_BYTES:,} bytes')
  return b''.join(chunks)


def read_result(path: str | os.PathLike) -> dict[str, Any]:
  """Loads a result file without checking its digest (see `verify_result`).

  Raises:
    ResultError: the file cannot be read, is not a regular file (a FIFO, a device: never
      waited on or read without end) or is larger than `MAX_BYTES`, is not UTF-8, not JSON (or has
      NaN, infinities or a key twice in an object), is nested deeper than
      `MAX_DEPTH`, or is not an object at the top level.
  """
  data = _read_bytes(path)
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError as e:
    raise ResultError(
      f'{path}: not a result file: not UTF-8 ({e.reason} at byte {e.start})'
    ) from None
  try:
    result = json.loads(text, object_pairs_hook=_refuse_duplicate_keys, parse_constant=_no_constant)
  except RecursionError:
    raise ResultError(f'{path}: not a result file: JSON nested too deeply') from None
  except ValueError as e:  # json.JSONDecodeError is a ValueError too
    raise ResultError(f'{path}: not a result file: {e}') from None
  if not isinstance(result, dict):
    kind = {list: 'array', str: 'string', int: 'number', float: 'number', bool: 'boolean'}
    raise ResultError(
      f'{path}: not a result file: the top level is a JSON'
      f' {kind.get(type(result), "null")}, not an object'
    )
  if cause := _problem(result):
    raise ResultError(f'{path}: not a result file: {cause}')
  return result


def check_digest(path: str | os.PathLike, result: dict[str, Any]) -> None:
  """Raises `ResultError` unless `result` (read from `path`) matches its `result_sha256`."""
  stated = result.get('result_sha256')
  body = {k: v for k, v in result.items() if k != 'result_sha256'}
  found = sha256_bytes(_canonical(body))
  if stated != found:
    raise ResultError(f'{path}: result digest {str(stated)[:80]} != recomputed {found}')


def verify_result(path: str | os.PathLike) -> dict[str, Any]:
  """Loads a result and checks its self-digest.

  A result is one JSON object whose keys are unique at every level: with a
  key twice, `json` would keep the last value silently, and the digest would
  vouch for a body the file does not show.

  Raises:
    ResultError (a ValueError): as `read_result`, or the body no longer
      matches `result_sha256`.
  """
  result = read_result(path)
  check_digest(path, result)
  return result
