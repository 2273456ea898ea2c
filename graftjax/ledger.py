"""SHA-256 of every experiment input and output, and re-checking a result.

A result file is JSON. `write_result` adds the digest of its own canonical
body under `result_sha256`, so `verify_result` can tell whether the file
was edited after it was written, without running any model.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

import numpy as np


def sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def sha256_array(array) -> str:
  """SHA-256 of an array's raw bytes, C order, as stored (no header).

  This is the digest the paper compares: equal digests mean byte-equal values.
  """
  arr = np.ascontiguousarray(np.asarray(array))
  return hashlib.sha256(arr.tobytes()).hexdigest()


def sha256_tokens(token_ids) -> str:
  """SHA-256 of token ids as little-endian int32."""
  return sha256_array(np.asarray(token_ids, dtype='<i4'))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    while block := f.read(chunk):
      digest.update(block)
  return digest.hexdigest()


def _canonical(body: dict[str, Any]) -> bytes:
  return json.dumps(body, sort_keys=True, separators=(',', ':')).encode()


def write_result(path: str | os.PathLike, result: dict[str, Any]) -> str:
  """Writes `result` with its own digest (atomically); returns the digest."""
  body = {k: v for k, v in result.items() if k != 'result_sha256'}
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


def verify_result(path: str | os.PathLike) -> dict[str, Any]:
  """Loads a result and checks its self-digest.

  A result is one JSON object whose keys are unique at every level: with a
  key twice, `json` would keep the last value silently, and the digest would
  vouch for a body the file does not show.

  Raises:
    ValueError: if the file is not valid JSON, has a key twice in any object,
      is not an object at the top level, or its body no longer matches
      `result_sha256`.
  """
  text = pathlib.Path(path).read_text()
  try:
    result = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
  except ValueError as e:  # json.JSONDecodeError is a ValueError too
    raise ValueError(f'{path}: not a result file: {e}') from e
  if not isinstance(result, dict):
    kind = {list: 'array', str: 'string', int: 'number', float: 'number', bool: 'boolean'}
    raise ValueError(
      f'{path}: not a result file: the top level is a JSON'
      f' {kind.get(type(result), "null")}, not an object'
    )
  stated = result.get('result_sha256')
  body = {k: v for k, v in result.items() if k != 'result_sha256'}
  found = sha256_bytes(_canonical(body))
  if stated != found:
    raise ValueError(f'{path}: result digest {stated} != recomputed {found}')
  return result
