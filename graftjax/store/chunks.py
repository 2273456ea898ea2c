"""A stored array as files: its chunks (one per layer for k, v) and zarr.json.

The files are those a zarr v3 reader (tensorstore included) opens as the
array: raw little-endian chunks under zarr's default keys, with '.' between
the parts of a key (one folder per array; format 4) or '/' (formats 2 and 3).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import ml_dtypes
import numpy as np

DTYPES = {
  'float32': np.dtype(np.float32),
  'bfloat16': np.dtype(ml_dtypes.bfloat16),
  'int32': np.dtype(np.int32),
}
LAYERED = ('k', 'v', 'k_tail', 'v_tail')  # chunked one layer per chunk; the rest in one chunk
INT32 = (-(2**31), 2**31 - 1)

_T = TypeVar('_T')
_R = TypeVar('_R')


@dataclasses.dataclass(frozen=True)
class Chunk:
  """One chunk file of an array: its bytes [start, stop), C order.

  Attributes:
    name: the array, e.g. 'k'.
    index: the chunk's index along the array's leading axis (its layer).
    ndim: the array's rank.
    start: offset of the chunk's first byte in the array.
    stop: offset just past its last byte.
    separator: between the parts of its key, '.' or '/'.
  """

  name: str
  index: int
  ndim: int
  start: int
  stop: int
  separator: str = '.'

  @property
  def path(self) -> str:
    """Its path in a block, e.g. 'k/c.3.0.0.0' ('k/c/3/0/0/0' with '/'; zarr v3 default keys)."""
    return f'{self.name}/' + self.separator.join(['c', str(self.index)] + ['0'] * (self.ndim - 1))

  def __str__(self) -> str:
    layer = f' layer {self.index}' if self.name in LAYERED else ''
    return f'array {self.name!r}{layer} ({self.path})'


def chunk_shape(name: str, shape: Sequence[int]) -> list[int]:
  """[1, n, K, H] for k and v of shape [L, n, K, H]; `shape` otherwise."""
  return [1, *shape[1:]] if name in LAYERED else list(shape)


def chunks(name: str, dtype: str, shape: Sequence[int], *, separator: str = '.') -> list[Chunk]:
  """The chunk files of array `name`, in chunk order, keyed with `separator`."""
  rows = chunk_shape(name, shape)[0]
  size = rows * DTYPES[dtype].itemsize * math.prod(shape[1:])
  return [
    Chunk(name, i, len(shape), i * size, (i + 1) * size, separator) for i in range(shape[0] // rows)
  ]


def flat_bytes(array: np.ndarray) -> np.ndarray:
  """[size * itemsize] uint8 view of a C-contiguous array's bytes."""
  return array.reshape(-1).view(np.uint8)


def map_threads(
  fn: Callable[[_T], _R],
  items: Sequence[_T],
  *,
  after: dict[int, Callable[[], None]] | None = None,
  threads: int | None = None,
) -> list[_R]:
  """`[fn(x) for x in items]` on up to `threads` threads (default: one per CPU), each taking
  the next item in order; raises the first error (in item order), after all end.

  The threads are made once and shared (a restore should not pay for
  starting them); a call from one of them runs in that thread. Every call
  has ended when this returns or raises, so none writes into its arrays later.
  `after[i]()` runs on the calling thread as soon as items[0..i] have all ended
  without error (while later items are still worked on), in order of i.
  """
  after = after or {}
  workers = min(len(items), threads or os.cpu_count() or 1)
  if workers < 2 or threading.current_thread().name.startswith(_POOL_NAME):
    out = []
    for i, x in enumerate(items):
      out.append(fn(x))
      if i in after:
        after[i]()
    return out
  results, errors, ended = [None] * len(items), [None] * len(items), [False] * len(items)
  claims = itertools.count()  # its next() is atomic: each item is taken once
  changed = threading.Condition()

  def work() -> None:
    while (i := next(claims)) < len(items):
      try:
        results[i] = fn(items[i])
      except BaseException as e:  # raised on the caller
        errors[i] = e
      with changed:
        ended[i] = True
        changed.notify()

  running = [_pool().submit(work) for _ in range(workers)]
  try:
    prefix = 0  # items[:prefix] have all ended
    for i in sorted(after):
      with changed:
        while prefix <= i:
          if ended[prefix]:
            prefix += 1
          else:
            changed.wait()
      if any(e is not None for e in errors[: i + 1]):
        break
      after[i]()
  finally:
    concurrent.futures.wait(running)
  for e in errors:
    if e is not None:
      raise e
  return results


_POOL_NAME = 'graftjax-store'


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
  # No fork worry: tensorstore aborts a process forked after it was used.
  return concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix=_POOL_NAME)


def zarr_metadata(
  name: str, dtype: str, shape: Sequence[int], *, separator: str = '.'
) -> dict[str, Any]:
  """The zarr v3 metadata of array `name`: raw little-endian chunk files keyed with `separator`."""
  keys = {'name': 'default'}  # '/' is the default's own separator, not written
  if separator != '/':
    keys['configuration'] = {'separator': separator}
  return {
    'zarr_format': 3,
    'node_type': 'array',
    'shape': list(shape),
    'data_type': dtype,
    'chunk_grid': {
      'name': 'regular',
      'configuration': {'chunk_shape': chunk_shape(name, shape)},
    },
    'chunk_key_encoding': keys,
    'codecs': [{'name': 'bytes', 'configuration': {'endian': 'little'}}],
    'fill_value': 0 if dtype == 'int32' else 0.0,  # as tensorstore writes it
  }


def zarr_json(name: str, dtype: str, shape: Sequence[int], *, separator: str = '.') -> bytes:
  """zarr.json of array `name`, byte for byte as tensorstore writes it."""
  metadata = zarr_metadata(name, dtype, shape, separator=separator)
  return json.dumps(metadata, sort_keys=True, separators=(',', ':')).encode('ascii')
