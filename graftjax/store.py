"""Block store: KV blocks on a tensorstore kvstore, content-addressed, verified, atomic.

`BlockStore(root)` keeps each `KVBlock` under its content key (`key_for`).
`put` deposits a block so that it appears whole or not at all; `get` and
`verify` check every byte against its SHA-256 as it is read. Every failure
raises a `StoreError` naming the path and the cause. The on-disk format,
and what each guarantee rests on, is specified in docs/store_format.md.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import enum
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import stat
import types
import typing
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import ml_dtypes
import numpy as np
import tensorstore as ts

from graftjax import blocks

FORMAT = 'graftjax.blockstore/2'
KEY_SCHEME = 'graftjax.block-key/3'
MANIFEST = 'manifest.json'
ARRAY_NAMES = ('k', 'v', 'positions')
# A page's arrays (see `put`'s page_layout): k, v hold the layers kept whole,
# k_tail, v_tail the last rows of the trimmed layers.
PAGE_ARRAY_NAMES = ('k', 'v', 'k_tail', 'v_tail', 'positions')
KV_DTYPES = ('float32', 'bfloat16')

_DTYPES = {
  'float32': np.dtype(np.float32),
  'bfloat16': np.dtype(ml_dtypes.bfloat16),
  'int32': np.dtype(np.int32),
}
_LAYERED = ('k', 'v', 'k_tail', 'v_tail')  # chunked one layer per chunk; the rest in one chunk
_SHA256_HEX = re.compile(r'[0-9a-f]{64}')  # keys and digests
_INT32 = (-(2**31), 2**31 - 1)
_STAGING = '.tmp'
_LOCK = '.lock'
# Bytes read, then hashed while they are still in (L2) cache, at a time.
_PIECE = 1 << 18

_T = TypeVar('_T')
_R = TypeVar('_R')


class StoreError(Exception):
  """A block cannot be stored or read back as asked.

  Attributes:
    path: what failed: the store, a block in it, or a file of a block.
    cause: why, in words.
  """

  def __init__(self, path: str, cause: str):
    super().__init__(path, cause)  # both survive pickling across processes
    self.path = path
    self.cause = cause

  def __str__(self) -> str:
    return f'{self.path}: {self.cause}'


class InvalidKeyError(StoreError):
  """A key is not 64 lowercase hex digits (and so could name any path)."""


class InvalidBlockError(StoreError):
  """`put` refuses a block: its metadata or arrays cannot be stored exactly."""


class MissingBlockError(StoreError):
  """No block is stored under a key (or it was deleted while being read)."""


class CorruptBlockError(StoreError):
  """A stored block does not match its manifest, or its manifest is malformed."""


class UnsupportedFormatError(StoreError):
  """A stored block is in an on-disk format this code does not read."""


class ConflictingBlockError(StoreError):
  """A key is already stored with a different payload."""


class UnsafePathError(StoreError):
  """A symlink, or an entry of the wrong kind, where the store expects its own."""


class StoreIOError(StoreError):
  """The storage under the store failed: not a directory, disk full, I/O error."""


class ReadOnlyStoreError(StoreIOError):
  """A write to a store opened read-only, or on storage that refuses writes."""


class UnknownDriverError(StoreError):
  """The store names a tensorstore kvstore driver that does not exist here."""


class _Malformed(ValueError):
  """A manifest (or a block's metadata) is not what the format allows."""


class _Vanished(Exception):
  """A file of a block disappeared between listing and reading it."""


def key_for(meta: blocks.BlockMeta, page_layout: Sequence[Sequence[int]] | None = None) -> str:
  """The content key of a block: SHA-256 hex of its canonical identity.

  The identity is every field of `BlockMeta` (token ids as a list), plus
  `key_scheme` and `stop`, and for a page its `page_layout` (one
  [first_row, stop_row] per layer), serialised as JSON with sorted keys, no
  whitespace and ASCII only, so the key is the same in every process and
  on every machine. A block's key does not depend on pages (it has none).

  Args:
    meta: the block's metadata.
    page_layout: for a page, the rows kept of each layer (see `put`).

  Returns:
    64 lowercase hex digits.
  """
  identity = {
    **_meta_json(meta),
    'key_scheme': KEY_SCHEME,
    'stop': meta.start + len(meta.token_ids),
  }
  if page_layout is not None:
    identity['page_layout'] = [[int(a), int(b)] for a, b in page_layout]
  canonical = json.dumps(identity, sort_keys=True, separators=(',', ':'), ensure_ascii=True)
  return hashlib.sha256(canonical.encode('ascii')).hexdigest()


def array_digest(dtype: str, shape: Sequence[int], chunk_digests: Sequence[str]) -> str:
  """The two-level SHA-256 hex of an array, from its chunks' digests.

  Args:
    dtype: numpy name of the array's dtype, e.g. 'bfloat16'.
    shape: the array's shape.
    chunk_digests: SHA-256 hex of each chunk file's bytes, in chunk order.

  Returns:
    SHA-256 hex over `f'{dtype}[{d0},{d1},...]\\n'` (ASCII) followed by the
    32 raw bytes of each chunk digest.
  """
  digest = hashlib.sha256(f'{dtype}[{",".join(map(str, shape))}]\n'.encode())
  for chunk_digest in chunk_digests:
    digest.update(bytes.fromhex(chunk_digest))
  return digest.hexdigest()


def digest_tree(path: str | os.PathLike[str]) -> str:
  """SHA-256 hex over every file under `path`, e.g. one stored block.

  Files are taken in sorted order of their '/'-separated relative paths;
  each adds `f'{relative_path}\\n{size}\\n'` and then its bytes.

  Raises:
    UnsafePathError: if the tree holds a symlink.
  """
  path = os.fspath(path)
  digest = hashlib.sha256()
  for relative_path in sorted(_regular_files(path)):
    data = _read_bytes(os.path.join(path, relative_path))
    digest.update(f'{relative_path}\n{len(data)}\n'.encode())
    digest.update(data)
  return digest.hexdigest()


class BlockStore:
  """KV blocks under `root`, one key prefix (a directory on `file`) per block.

  `root` is a local directory (the `file` kvstore), a tensorstore kvstore
  URL or JSON spec (`'memory://'`, `{'driver': 'gcs', 'bucket': ...}`), or
  an open `tensorstore.KvStore`. Opening a store writes nothing. With
  `read_only=True`, or on storage that refuses writes, `list`, `get` and
  `verify` work and `put`, `delete` and `gc` raise `ReadOnlyStoreError`.
  """

  def __init__(self, root: Any, *, read_only: bool = False):
    self.read_only = read_only
    self._kv, self._local = _open_kvstore(root, read_only)
    self.root = self._local if self._local is not None else self._kv.url
    if self._local is not None:
      self._staging_dir = os.path.join(self._local, _STAGING)

  def put(
    self, block: blocks.KVBlock, *, page_layout: Sequence[Sequence[int]] | None = None
  ) -> str:
    """Stores `block` and returns its key; a no-op if already stored.

    With `page_layout` (one `(first_row, stop_row)` per layer, rows of the
    block's n) only those rows are stored, as a page under its own key
    (`key_for(meta, page_layout)`): each layer keeps either all rows
    `(0, n)` or the same last r rows `(n - r, n)`, 0 <= r < n, at least one
    layer of each kind. `get` gives the other rows back as zeros. The plain
    block format (no `page_layout`) is unchanged.

    Raises:
      InvalidBlockError: if the block cannot be stored exactly (dtype, empty
        block, positions outside int32, metadata of the wrong types).
      ConflictingBlockError: if its key is stored with another payload.
      CorruptBlockError: if its key is stored but does not verify.
      UnsupportedFormatError: if its key is stored in another format.
      ReadOnlyStoreError, StoreIOError, UnsafePathError: if the storage
        refuses the deposit; nothing of it is visible then.
    """
    self._check_writable()
    files, manifest = _storable(block, self.root, page_layout)
    key = manifest['key']
    deposit = self._deposit_local if self._local is not None else self._deposit_kvstore
    for _ in range(3):  # a block deleted under us is deposited again
      if self._exists(key):
        try:
          self._check_stored(key, manifest)
          return key
        except MissingBlockError:
          continue
      if deposit(key, files):
        return key
    raise StoreIOError(self._where(key), 'deleted by another writer each time it was deposited')

  def get(self, key: str) -> blocks.KVBlock:
    """The block stored under `key`, after verifying every digest.

    Returns:
      A KVBlock of numpy arrays: k, v [L, n, K, H] and positions [n] int32.
      For a page, the rows it does not keep are zeros (see `get_page`).
    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError,
      UnsupportedFormatError, UnsafePathError, StoreIOError.
    """
    return self._read(self._checked_key(key))[1]

  def get_page(self, key: str) -> tuple[blocks.KVBlock, tuple[tuple[int, int], ...] | None]:
    """(block, page_layout) under `key`: as `get`, with the rows each layer keeps.

    page_layout is None for a plain block (every row of every layer).
    """
    manifest, block = self._read(self._checked_key(key))
    return block, _layout_of(manifest)

  def verify(self, key: str) -> None:
    """Raises unless the block under `key` matches its manifest exactly.

    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError,
      UnsupportedFormatError, UnsafePathError, StoreIOError.
    """
    self._read(self._checked_key(key))

  def list(self) -> list[str]:
    """Sorted keys of the complete blocks (not verified; see `verify`)."""
    if self._local is not None:
      with _io_errors(self.root, 'cannot list the store'):
        names = os.listdir(self._local)
      return sorted(n for n in names if _SHA256_HEX.fullmatch(n) and self._is_complete(n))
    with _io_errors(self.root, 'cannot list the store'):
      names = _result(self._kv.list())
    suffix = f'/{MANIFEST}'.encode()
    return sorted(
      n[:64].decode()
      for n in names
      if n.endswith(suffix) and _SHA256_HEX.fullmatch(n[: -len(suffix)].decode('latin-1'))
    )

  def delete(self, key: str) -> None:
    """Removes the block under `key`; it vanishes from view at once.

    Raises:
      InvalidKeyError, MissingBlockError, UnsafePathError, ReadOnlyStoreError,
      StoreIOError.
    """
    self._checked_key(key)
    self._check_writable()
    where = self._where(key)
    if self._local is None:  # the manifest first: the block is gone from view
      with _io_errors(where, 'cannot delete the block'):
        if _result(self._kv.read(f'{key}/{MANIFEST}')).state != 'value':
          raise MissingBlockError(where, 'no such block')
        _result(self._kv.write(f'{key}/{MANIFEST}', None))
        _result(self._kv.delete_range(ts.KvStore.KeyRange(f'{key}/', f'{key}0')))
      return
    with self._staging_lock():
      if os.path.islink(where):
        raise UnsafePathError(where, 'the block is a symlink; refusing it')
      trash = os.path.join(self._staging_dir, f'{key}.{uuid.uuid4().hex}.del')
      with _io_errors(where, 'cannot delete the block'):
        try:
          os.rename(where, trash)
        except FileNotFoundError:
          raise MissingBlockError(where, 'no such block') from None
        _fsync(self.root)
        shutil.rmtree(trash)

  def gc(self) -> int:
    """Removes what crashed deposits left in `.tmp/`; returns how many.

    Waits for deposits and deletions in progress to finish first. On a
    kvstore other than `file` there is no `.tmp/` (see docs/store_format.md)
    and this returns 0.
    """
    self._check_writable()
    if self._local is None:
      return 0
    with self._lock(fcntl.LOCK_EX):
      return self._clear_staging()

  def __contains__(self, key: str) -> bool:
    key = self._checked_key(key)
    if self._local is not None:
      return self._is_complete(key)
    with _io_errors(self._where(key), 'cannot read the block'):
      return _result(self._kv.read(f'{key}/{MANIFEST}')).state == 'value'

  def _checked_key(self, key: str) -> str:
    if not isinstance(key, str) or not _SHA256_HEX.fullmatch(key):
      raise InvalidKeyError(
        self.root, f'invalid block key {key!r}: expected 64 lowercase hex digits'
      )
    return key

  def _where(self, key: str) -> str:
    """The block's path (file) or URL, for messages."""
    return os.path.join(self.root, key) if self._local is not None else f'{self.root}{key}'

  def _exists(self, key: str) -> bool:
    if self._local is not None:
      return os.path.lexists(os.path.join(self._local, key))
    return key in self

  def _is_complete(self, key: str) -> bool:
    path = os.path.join(self._local, key)
    manifest = os.path.join(path, MANIFEST)
    return (
      not os.path.islink(path)
      and os.path.isdir(path)
      and not os.path.islink(manifest)
      and os.path.isfile(manifest)
    )

  def _read(self, key: str, staged: str | None = None):
    """(manifest, block) of `key`, read and verified; `staged`: under .tmp/."""
    if staged is None:
      where, kv, local = self._where(key), self._kv / f'{key}/', self._local
      local = None if local is None else os.path.join(local, key)
    else:
      where = local = staged
      kv = self._kv / f'{_STAGING}/{os.path.basename(staged)}/'
    return _read_block(kv, where, key, local)

  def _check_writable(self) -> None:
    if self.read_only:
      raise ReadOnlyStoreError(self.root, 'the store was opened read-only')

  def _check_stored(self, key: str, manifest: dict[str, Any]) -> None:
    stored, _ = self._read(key)
    differences = _differences(stored, manifest)
    if differences:
      raise ConflictingBlockError(
        self._where(key),
        f'the block is already stored with another payload (stored != new):'
        f' {"; ".join(differences)}',
      )

  def _deposit_local(self, key: str, files: dict[str, bytes | memoryview]) -> bool:
    """Writes the block under .tmp/, verifies it, renames it into place.

    Returns False if another writer's block took the key first.
    """
    final = os.path.join(self._local, key)
    with self._staging_lock():
      name = f'{key}.{uuid.uuid4().hex}'
      staged = os.path.join(self._staging_dir, name)
      try:
        with _io_errors(staged, 'cannot deposit the block'):
          os.mkdir(staged)
          _write_files(self._kv / f'{_STAGING}/{name}/', files)
          _fsync_directories(staged)
        self._read(key, staged)
        with _io_errors(final, 'cannot publish the block'):
          published = _rename_unless_taken(staged, final)
          if published:
            _fsync(self.root)
      finally:
        shutil.rmtree(staged, ignore_errors=True)
    return published

  def _deposit_kvstore(self, key: str, files: dict[str, bytes | memoryview]) -> bool:
    """Writes the payload under `key/`, then the manifest if still absent.

    The manifest write is conditional on the manifest not existing (a
    generation condition), so of racing writers exactly one publishes.
    Returns False if another writer's manifest came first.
    """
    where = self._where(key)
    kv = self._kv / f'{key}/'
    with _io_errors(where, 'cannot deposit the block'):
      absent = _result(kv.read(MANIFEST))
      if absent.state != 'missing':
        return False
      # A failed deposit leaves payload without a manifest: never listed or
      # read, and overwritten by the next deposit of the key.
      _write_files(kv, {n: data for n, data in files.items() if n != MANIFEST})
      stamp = _result(kv.write(MANIFEST, files[MANIFEST], if_equal=absent.stamp.generation))
    if not stamp.generation:  # the condition failed: another manifest is there
      return False
    self._read(key)
    return True

  @contextlib.contextmanager
  def _staging_lock(self) -> Iterator[None]:
    """Shares the store lock; first clears `.tmp/` if no one else holds it.

    Every deposit and deletion holds the lock (shared) while it has a
    directory under `.tmp/`, so whoever holds it alone may remove them all.
    """
    with self._lock(None) as lock:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        pass
      else:
        self._clear_staging()
      fcntl.flock(lock, fcntl.LOCK_SH)
      yield

  @contextlib.contextmanager
  def _lock(self, operation: int | None) -> Iterator[int]:
    """Opens `.lock` (flocked with `operation` if given) and `.tmp/`."""
    path = os.path.join(self.root, _LOCK)
    with _io_errors(path, 'cannot open the store lock'):
      try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
      except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
          raise UnsafePathError(path, 'the store lock is not a regular file') from e
        raise
    try:
      if not stat.S_ISREG(os.fstat(lock).st_mode):
        raise UnsafePathError(path, 'the store lock is not a regular file')
      with _io_errors(self._staging_dir, 'cannot create the staging directory'):
        try:
          os.mkdir(self._staging_dir)
        except FileExistsError:
          pass
      mode = os.lstat(self._staging_dir).st_mode
      if not stat.S_ISDIR(mode):
        kind = 'a symlink' if stat.S_ISLNK(mode) else 'not a directory'
        raise UnsafePathError(self._staging_dir, f'the staging directory is {kind}')
      if operation is not None:
        fcntl.flock(lock, operation)
      yield lock
    finally:
      os.close(lock)

  def _clear_staging(self) -> int:
    with _io_errors(self._staging_dir, 'cannot clear the staging directory'):
      names = os.listdir(self._staging_dir)
      for name in names:
        path = os.path.join(self._staging_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
          shutil.rmtree(path)
        else:
          os.unlink(path)
    return len(names)


@contextlib.contextmanager
def _io_errors(path: str, doing: str) -> Iterator[None]:
  """Turns an OSError into a StoreIOError (or ReadOnlyStoreError) on `path`."""
  try:
    yield
  except OSError as e:
    where = e.filename if isinstance(e.filename, str) else path
    cause = f'{doing}: {e.strerror or e}'
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
      raise ReadOnlyStoreError(where, cause) from e
    raise StoreIOError(where, cause) from e


@dataclasses.dataclass(frozen=True)
class _Chunk:
  """One chunk file of an array: its bytes [start, stop), C order.

  Attributes:
    name: the array, e.g. 'k'.
    index: the chunk's index along the array's leading axis (its layer).
    ndim: the array's rank.
    start: offset of the chunk's first byte in the array.
    stop: offset just past its last byte.
  """

  name: str
  index: int
  ndim: int
  start: int
  stop: int

  @property
  def path(self) -> str:
    """Its path in a block, e.g. 'k/c/3/0/0/0' (zarr v3 default keys)."""
    return '/'.join([self.name, 'c', str(self.index)] + ['0'] * (self.ndim - 1))

  def __str__(self) -> str:
    layer = f' layer {self.index}' if self.name in _LAYERED else ''
    return f'array {self.name!r}{layer} ({self.path})'


def _chunk_shape(name: str, shape: Sequence[int]) -> list[int]:
  """[1, n, K, H] for k and v of shape [L, n, K, H]; `shape` otherwise."""
  return [1, *shape[1:]] if name in _LAYERED else list(shape)


def _chunks(name: str, dtype: str, shape: Sequence[int]) -> list[_Chunk]:
  """The chunk files of array `name`, in chunk order."""
  rows = _chunk_shape(name, shape)[0]
  size = rows * _DTYPES[dtype].itemsize * math.prod(shape[1:])
  return [_Chunk(name, i, len(shape), i * size, (i + 1) * size) for i in range(shape[0] // rows)]


def _map_threads(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
  """`[fn(x) for x in items]` on a thread per CPU; raises the first error."""
  workers = min(len(items), os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(fn, items))


def _flat_bytes(array: np.ndarray) -> np.ndarray:
  """[size * itemsize] uint8 view of a C-contiguous array's bytes."""
  return array.reshape(-1).view(np.uint8)


def _storable(
  block: blocks.KVBlock, root: str, page_layout: Sequence[Sequence[int]] | None = None
) -> tuple[dict[str, bytes], dict[str, Any]]:
  """The block's (or page's) files (relative path -> bytes) and its manifest, checked.

  Raises:
    InvalidBlockError: naming the first thing that cannot be stored exactly.
  """
  try:
    meta = block.meta
    if not isinstance(meta, blocks.BlockMeta):
      raise _Malformed(f'meta is a {type(meta).__name__}, not a BlockMeta')
    meta_json = _meta_json(meta)
    _check_meta(meta_json)  # before key_for, which would narrow what it hashes
    if not meta.token_ids:
      raise _Malformed('cannot store an empty block')
    arrays = {
      'k': _little_endian(block.k, 'k'),
      'v': _little_endian(block.v, 'v'),
      'positions': _int32_positions(block.positions),
    }
    layout = None
    if page_layout is not None:
      layout = _checked_layout(page_layout, arrays['k'].shape[0], len(meta.token_ids))
      arrays = _page_arrays(arrays, layout)
    key = key_for(meta, layout)
    names = [name for name in PAGE_ARRAY_NAMES if name in arrays]
    chunks = {name: _chunks(name, a.dtype.name, a.shape) for name, a in arrays.items()}
    payload = _map_threads(
      lambda c: _flat_bytes(arrays[c.name])[c.start : c.stop].tobytes(),
      [c for name in names for c in chunks[name]],
    )
    digests = _map_threads(lambda data: hashlib.sha256(data).hexdigest(), payload)
    manifest = _manifest(key, meta_json, arrays, _by_array(chunks, digests), layout)
    _check_manifest(manifest)
  except (_Malformed, blocks.GraftError) as e:
    raise InvalidBlockError(root, f'cannot store the block: {e}') from e
  files = {c.path: data for c, data in zip((c for n in names for c in chunks[n]), payload)}
  for name, array in arrays.items():
    files[f'{name}/zarr.json'] = _zarr_json(name, array.dtype.name, array.shape)
  text = json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=True) + '\n'
  files[MANIFEST] = text.encode('ascii')
  return files, manifest


def _by_array(chunks: dict[str, list[_Chunk]], values: Sequence[_T]) -> dict[str, list[_T]]:
  """`values`, one per chunk in PAGE_ARRAY_NAMES order, grouped by array."""
  out, rest = {}, iter(values)
  for name in PAGE_ARRAY_NAMES:
    if name in chunks:
      out[name] = [next(rest) for _ in chunks[name]]
  return out


def _checked_layout(layout: Any, num_layers: int, n: int) -> tuple[tuple[int, int], ...]:
  """A page layout as a tuple of (first_row, stop_row) per layer; raises _Malformed.

  Each layer keeps all n rows (0, n) or the last r rows (n - r, n), one r
  for every trimmed layer, 0 <= r < n; at least one layer of each kind.
  """
  if not isinstance(layout, (list, tuple)) or len(layout) != num_layers:
    raise _Malformed(f'page_layout is {_short(layout)}: expected one [first, stop] per layer')
  rows = []
  for i, pair in enumerate(layout):
    if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(_is_int32(x) for x in pair)):
      raise _Malformed(f'page_layout.{i} is {_short(pair)}: expected [first_row, stop_row]')
    rows.append((int(pair[0]), int(pair[1])))
  trimmed = {first for first, stop in rows if (first, stop) != (0, n)}
  if any(stop != n for _, stop in rows) or len(trimmed) != 1 or not 0 < min(trimmed) <= n:
    raise _Malformed(
      f'page_layout {_short(rows)}: each layer keeps rows [0, {n}] or the same last r rows'
      f' [{n} - r, {n}], 0 <= r < {n}, with at least one layer of each kind'
    )
  if all(first for first, _ in rows):
    raise _Malformed(f'page_layout {_short(rows)} keeps no layer whole')
  return tuple(rows)


def _is_int32(value: Any) -> bool:
  return type(value) is int and _INT32[0] <= value <= _INT32[1]


def _page_arrays(arrays: dict[str, np.ndarray], layout) -> dict[str, np.ndarray]:
  """A block's arrays cut to a page's: whole layers in k, v; last rows in k_tail, v_tail."""
  n = arrays['positions'].shape[0]
  whole = [i for i, (first, _) in enumerate(layout) if first == 0]
  tail = [i for i, (first, _) in enumerate(layout) if first != 0]
  first = layout[tail[0]][0]
  out = {'k': arrays['k'][whole], 'v': arrays['v'][whole]}
  if first < n:
    out['k_tail'] = np.ascontiguousarray(arrays['k'][tail, first:])
    out['v_tail'] = np.ascontiguousarray(arrays['v'][tail, first:])
  out['positions'] = arrays['positions']
  return out


def _unpage_arrays(arrays: dict[str, np.ndarray], layout) -> dict[str, np.ndarray]:
  """A page's arrays as a block's: [L, n, K, H], zeros in the rows not kept."""
  whole = [i for i, (first, _) in enumerate(layout) if first == 0]
  tail = [i for i, (first, _) in enumerate(layout) if first != 0]
  first = layout[tail[0]][0]
  out = {'positions': arrays['positions']}
  for name in ('k', 'v'):
    part = arrays[name]
    full = np.zeros((len(layout), *part.shape[1:]), part.dtype)
    full[whole] = part
    if f'{name}_tail' in arrays:
      full[tail, first:] = arrays[f'{name}_tail']
    out[name] = full
  return out


def _layout_of(manifest: dict[str, Any]) -> tuple[tuple[int, int], ...] | None:
  layout = manifest.get('page_layout')
  return None if layout is None else tuple(tuple(pair) for pair in layout['rows'])


def _little_endian(array: Any, name: str) -> np.ndarray:
  array = np.asarray(array)
  if array.dtype.name not in KV_DTYPES:
    raise _Malformed(f'cannot store array {name!r} of dtype {array.dtype.name!r}; only {KV_DTYPES}')
  return np.ascontiguousarray(array, array.dtype.newbyteorder('<'))


def _int32_positions(positions: Any) -> np.ndarray:
  """`positions` as int32, refused unless every value is exactly an int32."""
  positions = np.asarray(positions)
  kind = positions.dtype.kind
  if kind not in 'iuf' or positions.ndim != 1:
    raise _Malformed(
      f'positions must be a 1-D integer array, got {positions.dtype}{positions.shape}'
    )
  if positions.size:
    if kind == 'f':
      exact = np.isfinite(positions) & (positions == np.round(positions))
      if not exact.all():
        bad = int(np.argmin(exact))
        raise _Malformed(f'position {bad} is {positions[bad]!r}, not an integer')
    low, high = positions.min(), positions.max()
    if low < _INT32[0] or high > _INT32[1]:
      bad = int(np.argmax((positions < _INT32[0]) | (positions > _INT32[1])))
      raise _Malformed(f'position {bad} is {positions[bad]!r}, outside int32')
  return np.ascontiguousarray(positions, np.dtype('<i4'))


def _manifest(
  key: str,
  meta_json: dict[str, Any],
  arrays: dict[str, np.ndarray],
  digests: dict[str, list[str]],
  page_layout: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
  """The manifest of a block (or page), from its arrays' chunk digests (no hashing)."""
  manifest = {
    'format': FORMAT,
    'key': key,
    'layout_version': meta_json['layout_version'],
    'meta': meta_json,
    'arrays': {
      name: {
        'dtype': array.dtype.name,
        'shape': list(array.shape),
        'chunk_shape': _chunk_shape(name, array.shape),
        'chunk_sha256': digests[name],
        'sha256': array_digest(array.dtype.name, array.shape, digests[name]),
      }
      for name, array in arrays.items()
    },
  }
  if page_layout is not None:
    manifest['page_layout'] = {'rows': [list(pair) for pair in page_layout]}
  return manifest


def _meta_json(meta: blocks.BlockMeta) -> dict[str, Any]:
  """`meta.to_json()`, without `dataclasses.asdict`'s copy of each token id.

  That copy took about 0.1 s for 32k tokens, on every `get`; the manifest
  test checks that the two agree.
  """
  fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
  return {**fields, 'token_ids': list(meta.token_ids)}


_MANIFEST_FIELDS = {'format', 'key', 'layout_version', 'meta', 'arrays'}
_ENTRY_FIELDS = {'dtype', 'shape', 'chunk_shape', 'chunk_sha256', 'sha256'}


def _check_manifest(manifest: Any) -> blocks.BlockMeta:
  """Checks a manifest's every field, type and size; returns its BlockMeta.

  The one validation of a manifest, for what `put` writes and `get` reads.
  What it cannot check alone (the digests against the payload, chunk
  shapes against the layout) `_read_block` compares with a manifest rebuilt
  from the bytes read.

  Raises:
    UnsupportedFormatError: (from the caller) if `format` is not FORMAT.
    _Malformed: naming the first field that is missing, extra, of the
      wrong type or out of range.
  """
  paged = type(manifest) is dict and 'page_layout' in manifest
  _check_object(manifest, _MANIFEST_FIELDS | ({'page_layout'} if paged else set()), 'manifest')
  if manifest['format'] != FORMAT:
    raise _OtherFormat(manifest['format'])
  if not (type(manifest['key']) is str and _SHA256_HEX.fullmatch(manifest['key'])):
    raise _Malformed(f'key is {_short(manifest["key"])}: expected 64 lowercase hex digits')
  meta = _check_meta(manifest['meta'])
  if meta.dtype not in KV_DTYPES:
    raise _Malformed(f'cannot store k/v of dtype {meta.dtype!r}; only {KV_DTYPES}')
  if type(manifest['layout_version']) is not int or (
    manifest['layout_version'] != meta.layout_version
  ):
    raise _Malformed(
      f'layout_version {manifest["layout_version"]!r} != meta.layout_version'
      f' {meta.layout_version!r}'
    )
  entries = manifest['arrays']
  n = len(meta.token_ids)
  names = list(ARRAY_NAMES)
  if paged:
    _check_object(manifest['page_layout'], {'rows'}, 'page_layout')
    rows = manifest['page_layout']['rows']
    if type(rows) is not list or not all(type(pair) is list for pair in rows):
      raise _Malformed(f'page_layout.rows is {_short(rows)}: expected a list of [first, stop]')
    num_layers = len(rows)
    layout = _checked_layout(rows, num_layers, n)
    whole = sum(1 for first, _ in layout if first == 0)
    kept = n - max(first for first, _ in layout)
    names = [name for name in PAGE_ARRAY_NAMES if kept or not name.endswith('_tail')]
    expected_rows = {'k': (whole, n), 'v': (whole, n)}
    expected_rows.update(
      {'k_tail': (num_layers - whole, kept), 'v_tail': (num_layers - whole, kept)}
    )
  _check_object(entries, set(names), 'arrays')
  for name in names:
    entry = entries[name]
    _check_object(entry, _ENTRY_FIELDS, f'arrays.{name}')
    dtype = 'int32' if name == 'positions' else meta.dtype
    if entry['dtype'] != dtype:
      raise _Malformed(f'arrays.{name}.dtype is {entry["dtype"]!r}, expected {dtype!r}')
    shape = entry['shape']
    for field in ('shape', 'chunk_shape'):
      dims = entry[field]
      if not (
        type(dims) is list and dims and all(type(d) is int and 0 < d <= _INT32[1] for d in dims)
      ):
        raise _Malformed(f'arrays.{name}.{field} is {dims!r}: expected positive int32 sizes')
    if name == 'positions' and shape != [n]:
      raise _Malformed(f'arrays.positions.shape is {shape}, expected [{n}] for {n} token ids')
    if name in _LAYERED and not paged and (len(shape) != 4 or shape[1] != n):
      raise _Malformed(f'arrays.{name}.shape is {shape}, expected [L, {n}, K, H]')
    if name in _LAYERED and paged and (len(shape) != 4 or tuple(shape[:2]) != expected_rows[name]):
      layers, rows_kept = expected_rows[name]
      raise _Malformed(
        f'arrays.{name}.shape is {shape}, expected [{layers}, {rows_kept}, K, H] by page_layout'
      )
    if name == 'v' and shape != entries['k']['shape']:
      raise _Malformed(f'arrays.v.shape {shape} != arrays.k.shape {entries["k"]["shape"]}')
    if name == 'v_tail' and shape != entries['k_tail']['shape']:
      raise _Malformed(
        f'arrays.v_tail.shape {shape} != arrays.k_tail.shape {entries["k_tail"]["shape"]}'
      )
    if name == 'k_tail' and shape[2:] != entries['k']['shape'][2:]:
      raise _Malformed(f'arrays.k_tail.shape {shape} and arrays.k.shape differ in [K, H]')
    digests = entry['chunk_sha256']
    count = shape[0] // _chunk_shape(name, shape)[0]
    if not (
      type(digests) is list
      and len(digests) == count
      and all(type(d) is str and _SHA256_HEX.fullmatch(d) for d in digests)
    ):
      raise _Malformed(
        f'array {name!r} of shape {shape} needs {count} chunk digests (64 lowercase hex'
        f' digits each), got {_short(digests)}'
      )
    if not (type(entry['sha256']) is str and _SHA256_HEX.fullmatch(entry['sha256'])):
      raise _Malformed(f'arrays.{name}.sha256 is {_short(entry["sha256"])}: expected 64 hex digits')
  return meta


class _OtherFormat(Exception):
  """A manifest names another format (or its metadata another layout)."""


_UNSUPPORTED_LAYOUT = getattr(blocks, 'UnsupportedLayoutError', ())


def _check_meta(data: Any) -> blocks.BlockMeta:
  """A BlockMeta from its JSON form, every field of the type it declares.

  The fields and their types come from `blocks.BlockMeta` itself; integers
  must lie in int32, `start` and token ids must not be negative, and the
  result must give back exactly `data` (no value narrowed or dropped).
  """
  hints = typing.get_type_hints(blocks.BlockMeta)
  if type(data) is not dict:
    raise _Malformed(f'meta is {_short(data)}: expected a JSON object')
  try:
    meta = blocks.BlockMeta.from_json(data)
  except _UNSUPPORTED_LAYOUT as e:
    raise _OtherFormat(f'meta.layout_version {_short(data.get("layout_version"))}') from e
  except (ValueError, TypeError, KeyError, OverflowError) as e:  # blocks.BlockMetaError
    raise _Malformed(str(e)) from e
  for name, value in data.items():  # whatever from_json lets through
    _check_type(value, hints.get(name), f'meta.{name}')
  if data['start'] < 0:
    raise _Malformed(f'meta.start is {data["start"]}: a slot cannot be negative')
  if any(t < 0 for t in data['token_ids']):
    raise _Malformed(f'meta.token_ids holds a negative id {min(data["token_ids"])}')
  if _meta_json(meta) != data:
    raise _Malformed('meta does not read back as written')
  return meta


def _check_type(value: Any, hint: Any, where: str) -> None:
  """Raises _Malformed unless `value` (JSON or Python) is a `hint`.

  Knows str, int (int32, not bool), bool, float, tuple[X, ...], unions and
  enums; a type it does not know is left to `BlockMeta.from_json`.
  """
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    errors = []
    for arm in typing.get_args(hint):
      try:
        return _check_type(value, arm, where)
      except _Malformed as e:
        errors.append(str(e))
    raise _Malformed('; '.join(errors))
  if hint is type(None):
    ok = value is None
  elif hint is int:
    ok = type(value) is int and _INT32[0] <= value <= _INT32[1]
  elif hint in (str, bool):
    ok = type(value) is hint
  elif hint is float:
    ok = type(value) in (int, float) and math.isfinite(value)
  elif origin is tuple:
    if type(value) not in (list, tuple):
      raise _Malformed(f'{where} is {_short(value)}: expected a list')
    item = typing.get_args(hint)[0]
    for i, x in enumerate(value):
      _check_type(x, item, f'{where}.{i}')
    return
  elif isinstance(hint, type) and issubclass(hint, enum.Enum):
    ok = isinstance(value, hint) or value in {m.value for m in hint}
  else:
    return
  if not ok:
    name = getattr(hint, '__name__', str(hint))
    bound = ' in int32' if hint is int else ''
    raise _Malformed(f'{where} is {_short(value)}: expected {name}{bound}')


def _check_object(value: Any, names: set[str], where: str) -> None:
  if type(value) is not dict:
    raise _Malformed(f'{where} is {_short(value)}: expected a JSON object')
  if value.keys() != names:
    raise _Malformed(f'{where} has fields {sorted(value)}, expected {sorted(names)}')


def _short(value: Any) -> str:
  """repr of `value` cut to 80 characters (a bad field can be huge)."""
  try:
    text = repr(value)
  except (ValueError, RecursionError):  # ints past str's digit limit; deep nesting
    return f'a {type(value).__name__}'
  return text if len(text) <= 80 else f'{text[:77]}...'


def _load_json(data: bytes) -> Any:
  """JSON from ASCII bytes, refusing duplicate keys; raises _Malformed."""

  def no_duplicates(pairs):
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
      raise _Malformed(f'duplicate key {min(n for n in names if names.count(n) > 1)!r}')
    return dict(pairs)

  try:
    return json.loads(data.decode('ascii'), object_pairs_hook=no_duplicates)
  except RecursionError:
    raise _Malformed('JSON nested too deeply') from None
  except (ValueError, OverflowError) as e:  # UnicodeDecodeError, JSONDecodeError, digit limit
    raise _Malformed(str(e)) from e


def _zarr_metadata(name: str, dtype: str, shape: Sequence[int]) -> dict[str, Any]:
  """The zarr v3 metadata of array `name`: raw little-endian chunk files."""
  return {
    'zarr_format': 3,
    'node_type': 'array',
    'shape': list(shape),
    'data_type': dtype,
    'chunk_grid': {
      'name': 'regular',
      'configuration': {'chunk_shape': _chunk_shape(name, shape)},
    },
    'chunk_key_encoding': {'name': 'default'},
    'codecs': [{'name': 'bytes', 'configuration': {'endian': 'little'}}],
    'fill_value': 0 if dtype == 'int32' else 0.0,  # as tensorstore writes it
  }


def _zarr_json(name: str, dtype: str, shape: Sequence[int]) -> bytes:
  """zarr.json of array `name`, byte for byte as tensorstore writes it."""
  metadata = _zarr_metadata(name, dtype, shape)
  return json.dumps(metadata, sort_keys=True, separators=(',', ':')).encode('ascii')


def _open_kvstore(root: Any, read_only: bool) -> tuple[ts.KvStore, str | None]:
  """The store's kvstore (its path ending in '/'), and its directory on `file`."""
  if isinstance(root, (str, os.PathLike)) and '://' not in os.fspath(root):
    spec = {'driver': 'file', 'path': os.fspath(root)}
  elif isinstance(root, ts.KvStore):
    spec = root.spec(retain_context=True)
  else:
    spec = root
  try:
    kv = root.copy() if isinstance(root, ts.KvStore) else ts.KvStore.open(spec).result()
  except ValueError as e:
    if 'not a registered KvStore driver' in str(e) or 'unsupported URL scheme' in str(e):
      driver = spec.get('driver') if isinstance(spec, dict) else str(spec).split('://')[0]
      raise UnknownDriverError(
        _short(spec), f'unknown tensorstore kvstore driver {driver!r} ({e})'
      ) from e
    raise StoreIOError(_short(spec), f'cannot open the kvstore: {e}') from e
  except TypeError as e:
    raise StoreIOError(_short(spec), f'not a kvstore spec, URL or path: {e}') from e
  if kv.spec().to_json().get('driver') != 'file':
    if kv.path and not kv.path.endswith('/'):
      kv.path += '/'
    return kv, None
  local = os.path.abspath(kv.path or '.')
  if not read_only and not os.path.lexists(local):
    with _io_errors(local, 'cannot create the store'):
      os.makedirs(local, exist_ok=True)
  try:
    mode = os.stat(local).st_mode
  except FileNotFoundError:
    raise StoreIOError(local, 'no such store (read-only stores are not created)') from None
  except OSError as e:
    raise StoreIOError(local, f'cannot open the store: {e.strerror}') from e
  if not stat.S_ISDIR(mode):
    raise StoreIOError(local, 'the store root is not a directory')
  kv.path = local + '/'
  return kv, local


def _result(future: Any) -> Any:
  """`future.result()`, tensorstore's errors (ValueError) raised as OSError."""
  try:
    return future.result()
  except ValueError as e:
    text = str(e)
    code = next((c for marker, c in _TS_ERRNO if marker in text), errno.EIO)
    raise OSError(code, text) from e


# tensorstore's absl status codes and messages, by the errno they mean here.
_TS_ERRNO = (
  ('No space left', errno.ENOSPC),
  ('RESOURCE_EXHAUSTED', errno.ENOSPC),
  ('Read-only file system', errno.EROFS),
  ('PERMISSION_DENIED', errno.EACCES),
  ('NOT_FOUND', errno.ENOENT),
)


def _write_files(kv: ts.KvStore, files: dict[str, bytes]) -> None:
  """Writes every value at once (tensorstore overlaps them); waits for all."""
  futures = [kv.write(name, data) for name, data in files.items()]
  for future in futures:
    _result(future)


def _read_block(
  kv: ts.KvStore, where: str, key: str, local: str | None
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies the block under `kv`; returns (manifest, block).

  A block deleted (or replaced) while it is read is read again from the
  start, and reported missing if it is gone.

  Args:
    kv: the block's kvstore (its path: the block's prefix).
    where: its path or URL, for messages.
    key: its key.
    local: its directory on the `file` kvstore (checked for symlinks and
      stray entries), or None.
  """
  for _ in range(3):
    try:
      return _read_block_once(kv, where, key, local)
    except _Vanished:
      with _io_errors(where, 'cannot read the block'):
        if _result(kv.read(MANIFEST)).state != 'value':
          raise MissingBlockError(where, 'no such block (deleted while being read)') from None
  raise CorruptBlockError(where, 'files kept vanishing while the block was read')


def _read_block_once(
  kv: ts.KvStore, where: str, key: str, local: str | None
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies a block once (arguments as `_read_block`).

  Checks, in order: the block holds exactly the expected files (regular
  files, on `file`); manifest.json passes `_check_manifest` and describes
  `key`; each zarr.json describes the layout the manifest implies; each
  chunk has the expected size and its recorded digest (hashed once, as
  read); and the manifest is exactly what those chunk digests and the
  arrays' dtypes and shapes produce.
  """
  try:
    files = _listing(kv, where, local)
    if MANIFEST not in files:
      raise CorruptBlockError(where, f'missing file {MANIFEST}')
    manifest, meta = _parse_manifest(_read_value(kv, MANIFEST), where, key)
    entries = manifest['arrays']
    chunks = {
      name: _chunks(name, entry['dtype'], entry['shape']) for name, entry in entries.items()
    }
    names = [name for name in PAGE_ARRAY_NAMES if name in entries]
    expected_files = {MANIFEST}
    for name in names:
      expected_files.add(f'{name}/zarr.json')
      expected_files.update(chunk.path for chunk in chunks[name])
    missing = sorted(expected_files - files)
    if missing:
      raise CorruptBlockError(where, f'missing file {", ".join(missing)}')
    unexpected = sorted(files - expected_files)
    if unexpected:
      raise CorruptBlockError(where, f'unexpected file {", ".join(unexpected)}')
    for name in names:
      _check_zarr_metadata(_read_value(kv, f'{name}/zarr.json'), where, name, entries[name])
    recorded = [
      (chunk, digest, kv.read(chunk.path))  # all reads in flight at once
      for name in names
      for chunk, digest in zip(chunks[name], entries[name]['chunk_sha256'])
    ]
    try:
      arrays = {
        name: np.empty(entry['shape'], _DTYPES[entry['dtype']]) for name, entry in entries.items()
      }
    except (ValueError, MemoryError) as e:
      raise CorruptBlockError(where, f'arrays of {MANIFEST} too large to read: {e}') from e
    found = _map_threads(
      lambda task: _take_chunk(where, *task, _flat_bytes(arrays[task[0].name])), recorded
    )
  except FileNotFoundError as e:
    raise _Vanished() from e
  except OSError as e:
    raise StoreIOError(where, f'cannot read the block: {e.strerror or e}') from e
  digests = {name: [] for name in names}
  for (chunk, _, _), digest in zip(recorded, found):
    digests[chunk.name].append(digest)
  layout = _layout_of(manifest)
  rebuilt = _manifest(key, _meta_json(meta), arrays, digests, layout)
  differences = _differences(manifest, rebuilt)
  if differences:
    raise CorruptBlockError(
      where,
      f'manifest.json disagrees with its payload (manifest != payload): {"; ".join(differences)}',
    )
  if layout is not None:
    arrays = _unpage_arrays(arrays, layout)
  try:
    block = blocks.KVBlock(meta=meta, **arrays)
  except ValueError as e:
    raise CorruptBlockError(where, f'not a valid block: {e}') from e
  return manifest, block


def _listing(kv: ts.KvStore, where: str, local: str | None) -> set[str]:
  """The block's files, '/'-separated and relative; MissingBlockError if none."""
  if local is None:
    files = {name.decode('utf-8', 'replace') for name in _result(kv.list())}
    if not files:
      raise MissingBlockError(where, 'no such block')
    return files
  try:
    mode = os.lstat(local).st_mode
  except FileNotFoundError:
    raise MissingBlockError(where, 'no such block') from None
  if stat.S_ISLNK(mode):
    raise UnsafePathError(where, 'the block is a symlink; refusing it')
  if not stat.S_ISDIR(mode):
    raise CorruptBlockError(where, 'the block is not a directory')
  return _regular_files(local)


def _read_value(kv: ts.KvStore, name: str) -> bytes:
  return _value(kv.read(name), name)


def _take_chunk(
  where: str, chunk: _Chunk, expected: str, read: Any, array_bytes: np.ndarray
) -> str:
  """Copies a chunk just read into its slice of `array_bytes`, checking its digest.

  Each piece is hashed as it is copied, while still in cache: the bytes
  returned are the bytes hashed.

  Args:
    where: the block's path or URL, for messages.
    chunk: which chunk, and where its bytes go.
    expected: the chunk's recorded SHA-256 hex.
    read: the chunk's pending kvstore read.
    array_bytes: [nbytes] uint8 bytes of the chunk's whole array.

  Returns:
    The chunk's SHA-256 hex, which is `expected`.
  """
  data = np.frombuffer(_value(read, chunk.path), np.uint8)
  out = array_bytes[chunk.start : chunk.stop]
  if data.size != out.size:
    raise CorruptBlockError(
      where, f'{chunk}: holds {data.size} bytes, expected {out.size} (sha256 expected {expected})'
    )
  digest = hashlib.sha256()
  for offset in range(0, out.size, _PIECE):
    piece = data[offset : offset + _PIECE]
    digest.update(piece)
    out[offset : offset + piece.size] = piece
  found = digest.hexdigest()
  if found != expected:
    raise CorruptBlockError(where, f'{chunk}: sha256 expected {expected}, found {found}')
  return found


def _value(read: Any, name: str) -> bytes:
  """The value a kvstore read found; FileNotFoundError if it found none."""
  result = _result(read)
  if result.state != 'value':
    raise FileNotFoundError(errno.ENOENT, 'vanished', name)
  return result.value


def _parse_manifest(data: bytes, path: str, key: str) -> tuple[dict[str, Any], blocks.BlockMeta]:
  """The manifest and its BlockMeta, checked by `_check_manifest` and for `key`."""
  try:
    manifest = _load_json(data)
    meta = _check_manifest(manifest)
  except _OtherFormat as e:
    found = e.args[0]
    if isinstance(found, str) and found.startswith('meta.layout_version'):
      cause = f'{MANIFEST} has {found}; this code reads only {blocks.LAYOUT_VERSION}'
    else:
      cause = f'{MANIFEST} has format {_short(found)}; this code reads only {FORMAT!r}'
    raise UnsupportedFormatError(path, cause) from None
  except _Malformed as e:
    raise CorruptBlockError(path, f'malformed {MANIFEST}: {e}') from e
  described = key_for(meta, _layout_of(manifest))
  if described != key:
    raise CorruptBlockError(path, f'{MANIFEST} describes block {described}')
  return manifest, meta


def _check_zarr_metadata(data: bytes, where: str, name: str, entry: dict[str, Any]) -> None:
  """Raises unless `data`, `name`/zarr.json, describes the array `entry` describes."""
  relative_path = f'{name}/zarr.json'
  try:
    found = _load_json(data)
    if not isinstance(found, dict):
      raise _Malformed(f'not a JSON object: {_short(found)}')
  except _Malformed as e:
    raise CorruptBlockError(where, f'malformed {relative_path}: {e}') from e
  # What decides where tensorstore finds the bytes and how it decodes them;
  # other fields (attributes, dimension_names) are free.
  expected = {
    **_zarr_metadata(name, entry['dtype'], entry['shape']),
    'storage_transformers': None,
  }
  differences = _differences({field: found.get(field) for field in expected}, expected)
  if differences:
    raise CorruptBlockError(
      where,
      f'{relative_path} disagrees with {MANIFEST} (zarr.json != manifest):'
      f' {"; ".join(differences)}',
    )


def _differences(a: Any, b: Any, where: str = '') -> list[str]:
  """Where two JSON values differ, as 'path: a != b' lines.

  Dicts are compared key by key and lists of one length item by item, so a
  path such as 'arrays.k.chunk_sha256.3' names the differing chunk.
  """
  if a == b:
    return []
  if isinstance(a, dict) and isinstance(b, dict):
    return [
      line
      for name in sorted(a.keys() | b.keys())
      for line in _differences(a.get(name), b.get(name), f'{where}{name}.')
    ]
  if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    return [
      line for i, (x, y) in enumerate(zip(a, b)) for line in _differences(x, y, f'{where}{i}.')
    ]
  return [f'{where[:-1]}: {_short(a)} != {_short(b)}']


def _rename_unless_taken(source: str, target: str) -> bool:
  """Renames directory `source` to `target`; False if `target` exists."""
  try:
    os.rename(source, target)
  except OSError as e:
    if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
      return False
    raise
  return True


def _regular_files(path: str) -> set[str]:
  """'/'-separated relative paths of the files under `path`; no symlinks."""
  files = set()
  directories = ['']
  while directories:
    directory = directories.pop()
    with os.scandir(os.path.join(path, directory)) as entries:
      for entry in entries:
        relative = directory + entry.name
        if entry.is_symlink():
          raise UnsafePathError(path, f'{relative} is a symlink; refusing it')
        if entry.is_dir(follow_symlinks=False):
          directories.append(f'{relative}/')
        elif entry.is_file(follow_symlinks=False):
          files.add(relative)
        else:
          raise UnsafePathError(path, f'{relative} is not a regular file')
  return files


def _read_bytes(path: str) -> bytes:
  fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  with os.fdopen(fd, 'rb') as f:
    return f.read()


def _fsync(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _fsync_directories(path: str) -> None:
  """fsyncs every directory under `path` (the file kvstore fsyncs files)."""
  for directory, _, _ in os.walk(path, topdown=False):
    _fsync(directory)
