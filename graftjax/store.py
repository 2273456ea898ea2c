"""Block store: KV blocks on disk, content-addressed, verified, atomic.

`BlockStore(root)` keeps each `KVBlock` in its own directory, named by the
block's key: the SHA-256 of what the block *is* (model, tokens, slots, dtype,
position scheme, layout version; see `key_for`), not of its bytes. Putting a
block whose key is already stored is a no-op when the stored payload is the
same and verifies, and an error naming the difference otherwise.

On-disk layout (format `graftjax.blockstore/1`)::

  <root>/
    .lock                  flock: deposits share it, garbage collection owns it
    .tmp/                  deposits and deletions in progress; never read
    <key>/                 one complete block; key = 64 lowercase hex digits
      manifest.json        format, key, layout version, BlockMeta, digests
      k/zarr.json          zarr v3 array metadata, written by tensorstore
      k/c/0/0/0/0          the only chunk of k [L, n, K, H]
      v/zarr.json
      v/c/0/0/0/0          the only chunk of v [L, n, K, H]
      positions/zarr.json
      positions/c/0        the only chunk of positions [n] int32

Each array is one zarr v3 chunk with the `bytes` codec (little-endian) and no
compression, so the chunk file is exactly the array's raw C-order bytes; k and
v are `float32` or `bfloat16` (a native zarr v3 data type in tensorstore).
Nothing in the files depends on time, host or process, so the same block
gives byte-identical files in every store (with one tensorstore version,
which writes zarr.json; `digest_tree` checks this).

A deposit writes the arrays and then manifest.json into a fresh directory
under `.tmp/`, fsyncs it, reads it back through `verify`'s checks, and
renames the whole directory to `<key>/`. A crashed deposit leaves only a
directory under `.tmp/`, which `list()` never shows and `gc()` (or the next
`put` that finds no other deposit running) removes. If two writers race on
one key, the loser's rename fails, and it verifies the winner's block instead.

manifest.json records, for each array, its dtype, shape and
`array_digest`: SHA-256 over the ASCII header `f'{dtype}[{d0},{d1},...]\\n'`
followed by the raw little-endian C-order bytes. The store reads files only
as JSON and through tensorstore; nothing is unpickled or evaluated, keys are
checked to be 64 lowercase hex digits, and symlinks inside the store are
refused.

Reading a block with nothing but tensorstore::

  import json, tensorstore as ts
  path = f'{root}/{key}'  # root: the store's directory
  manifest = json.load(open(f'{path}/manifest.json'))
  k, v, positions = (
      ts.open({'driver': 'zarr3', 'kvstore': f'file://{path}/{name}/',
               'fill_missing_data_reads': False}).result().read().result()
      for name in ('k', 'v', 'positions'))

Without `'fill_missing_data_reads': False`, a missing chunk file silently
reads back as zeros.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import tensorstore as ts

from graftjax import blocks

FORMAT = 'graftjax.blockstore/1'
KEY_SCHEME = 'graftjax.block-key/1'
MANIFEST = 'manifest.json'
ARRAY_NAMES = ('k', 'v', 'positions')
KV_DTYPES = ('float32', 'bfloat16')

_DTYPES = {
    'float32': np.dtype(np.float32),
    'bfloat16': np.dtype(ml_dtypes.bfloat16),
    'int32': np.dtype(np.int32),
}
_KEY_PATTERN = re.compile(r'[0-9a-f]{64}')
_STAGING = '.tmp'
_LOCK = '.lock'


class StoreError(Exception):
  """A block cannot be stored or read back as asked."""


class InvalidKeyError(StoreError):
  """A key is not 64 lowercase hex digits (and so could name any path)."""


class MissingBlockError(StoreError):
  """No block is stored under a key."""


class CorruptBlockError(StoreError):
  """A stored block does not match its manifest, or has no manifest."""


class ConflictingBlockError(StoreError):
  """A key is already stored with a different payload."""


class UnsafePathError(StoreError):
  """A symlink (or other non-regular entry) inside the store was refused."""


def key_for(meta: blocks.BlockMeta) -> str:
  """The content key of a block: SHA-256 hex of its canonical identity.

  The identity is the JSON object below, serialised with sorted keys, no
  whitespace and ASCII only, so the key is the same in every process and on
  every machine.

  Args:
    meta: the block's metadata.

  Returns:
    64 lowercase hex digits.
  """
  identity = {
      'key_scheme': KEY_SCHEME,
      'model_fingerprint': str(meta.model_fingerprint),
      'token_ids': [int(t) for t in meta.token_ids],
      'start': int(meta.start),
      'stop': int(meta.start) + len(meta.token_ids),
      'dtype': str(meta.dtype),
      'position_scheme': str(meta.position_scheme),
      'layout_version': int(meta.layout_version),
  }
  canonical = json.dumps(
      identity, sort_keys=True, separators=(',', ':'), ensure_ascii=True
  )
  return hashlib.sha256(canonical.encode('ascii')).hexdigest()


def array_digest(array: np.ndarray) -> str:
  """SHA-256 hex of an array's dtype, shape and little-endian bytes."""
  array = _little_endian(array)
  header = f'{array.dtype.name}[{",".join(map(str, array.shape))}]\n'
  digest = hashlib.sha256(header.encode('ascii'))
  digest.update(array.tobytes(order='C'))
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
  """KV blocks on disk under `root`, one directory per content key."""

  def __init__(self, root: str | os.PathLike[str]):
    self.root = os.path.abspath(os.fspath(root))
    self._staging_dir = os.path.join(self.root, _STAGING)
    os.makedirs(self._staging_dir, exist_ok=True)
    if os.path.islink(self._staging_dir):
      raise UnsafePathError(f'{self._staging_dir} is a symlink')

  def put(self, block: blocks.KVBlock) -> str:
    """Stores `block` and returns its key; a no-op if already stored.

    Raises:
      StoreError: if the block cannot be stored (dtype, empty block).
      ConflictingBlockError: if its key is stored with another payload.
      CorruptBlockError: if its key is stored but does not verify.
    """
    key = key_for(block.meta)
    arrays = _block_arrays(block)
    manifest = _manifest(key, block.meta, arrays)
    final = os.path.join(self.root, key)
    if os.path.lexists(final):
      self._check_stored(key, manifest)
      return key
    with self._staging_lock():
      staged = os.path.join(self._staging_dir, f'{key}.{uuid.uuid4().hex}')
      try:
        _write_block(staged, arrays, manifest)
        _read_block(staged, key)
        published = _rename_unless_taken(staged, final)
      finally:
        if os.path.lexists(staged):
          shutil.rmtree(staged)
    if published:
      _fsync(self.root)
    else:
      self._check_stored(key, manifest)
    return key

  def get(self, key: str) -> blocks.KVBlock:
    """The block stored under `key`, after verifying every digest.

    Returns:
      A KVBlock of numpy arrays: k, v [L, n, K, H] and positions [n] int32.
    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError, UnsafePathError.
    """
    _, block = _read_block(self._block_path(key), key)
    return block

  def verify(self, key: str) -> None:
    """Raises unless the block under `key` matches its manifest exactly.

    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError, UnsafePathError.
    """
    _read_block(self._block_path(key), key)

  def list(self) -> list[str]:
    """Sorted keys of the complete blocks (not verified; see `verify`)."""
    return sorted(
        name for name in os.listdir(self.root)
        if _KEY_PATTERN.fullmatch(name) and self._is_complete(name)
    )

  def delete(self, key: str) -> None:
    """Removes the block under `key`; it vanishes from view at once.

    Raises:
      InvalidKeyError, MissingBlockError, UnsafePathError.
    """
    path = self._block_path(key)
    with self._staging_lock():
      if os.path.islink(path):
        raise UnsafePathError(f'block {key} is a symlink; refusing it')
      trash = os.path.join(self._staging_dir, f'{key}.{uuid.uuid4().hex}.del')
      try:
        os.rename(path, trash)
      except FileNotFoundError:
        raise MissingBlockError(f'no block {key} in {self.root}') from None
      _fsync(self.root)
      shutil.rmtree(trash)

  def gc(self) -> int:
    """Removes what crashed deposits left in `.tmp/`; returns how many.

    Waits for deposits and deletions in progress to finish first.
    """
    lock = self._open_lock()
    try:
      fcntl.flock(lock, fcntl.LOCK_EX)
      return self._clear_staging()
    finally:
      os.close(lock)

  def __contains__(self, key: str) -> bool:
    return self._is_complete(_checked_key(key))

  def _block_path(self, key: str) -> str:
    return os.path.join(self.root, _checked_key(key))

  def _is_complete(self, key: str) -> bool:
    path = os.path.join(self.root, key)
    manifest = os.path.join(path, MANIFEST)
    return (
        not os.path.islink(path) and os.path.isdir(path)
        and not os.path.islink(manifest) and os.path.isfile(manifest)
    )

  def _check_stored(self, key: str, manifest: dict[str, Any]) -> None:
    stored, _ = _read_block(os.path.join(self.root, key), key)
    differences = _differences(stored, manifest)
    if differences:
      raise ConflictingBlockError(
          f'block {key} is already stored with another payload (stored !='
          f' new): {"; ".join(differences)}'
      )

  @contextlib.contextmanager
  def _staging_lock(self) -> Iterator[None]:
    """Shares the store lock; first clears `.tmp/` if no one else holds it.

    Every deposit and deletion holds the lock (shared) while it has a
    directory under `.tmp/`, so whoever holds it alone may remove them all.
    """
    lock = self._open_lock()
    try:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        pass
      else:
        self._clear_staging()
      fcntl.flock(lock, fcntl.LOCK_SH)
      yield
    finally:
      os.close(lock)

  def _open_lock(self) -> int:
    path = os.path.join(self.root, _LOCK)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)

  def _clear_staging(self) -> int:
    names = os.listdir(self._staging_dir)
    for name in names:
      path = os.path.join(self._staging_dir, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      else:
        os.unlink(path)
    return len(names)


def _checked_key(key: str) -> str:
  if not isinstance(key, str) or not _KEY_PATTERN.fullmatch(key):
    raise InvalidKeyError(
        f'invalid block key {key!r}: expected 64 lowercase hex digits'
    )
  return key


def _little_endian(array: np.ndarray) -> np.ndarray:
  array = np.asarray(array)
  return array.astype(array.dtype.newbyteorder('<'), copy=False)


def _block_arrays(block: blocks.KVBlock) -> dict[str, np.ndarray]:
  """The block's arrays as little-endian numpy, checked to be storable."""
  dtype = block.meta.dtype
  if dtype not in KV_DTYPES:
    raise StoreError(f'cannot store k/v of dtype {dtype!r}; only {KV_DTYPES}')
  if len(block) == 0:
    raise StoreError('cannot store an empty block')
  arrays = {name: _little_endian(a) for name, a in block.arrays().items()}
  for name in ('k', 'v'):
    if arrays[name].dtype.name != dtype:
      raise StoreError(
          f'array {name!r} is {arrays[name].dtype.name} but the block'
          f' metadata says {dtype}'
      )
  return arrays


def _manifest(
    key: str, meta: blocks.BlockMeta, arrays: dict[str, np.ndarray]
) -> dict[str, Any]:
  return {
      'format': FORMAT,
      'key': key,
      'layout_version': meta.layout_version,
      'meta': meta.to_json(),
      'arrays': {
          name: {
              'dtype': array.dtype.name,
              'shape': list(array.shape),
              'sha256': array_digest(array),
          }
          for name, array in arrays.items()
      },
  }


def _chunk_path(name: str, ndim: int) -> str:
  """The relative path of an array's one chunk, e.g. 'k/c/0/0/0/0'."""
  return '/'.join([name, 'c'] + ['0'] * ndim)


def _write_block(
    path: str, arrays: dict[str, np.ndarray], manifest: dict[str, Any]
) -> None:
  """Writes arrays, then manifest.json, into a new directory; fsyncs all."""
  os.mkdir(path)
  for name, array in arrays.items():
    _write_array(os.path.join(path, name), array)
  text = json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=True)
  with open(os.path.join(path, MANIFEST), 'x', encoding='ascii') as f:
    f.write(text + '\n')
  _fsync_tree(path)


def _write_array(path: str, array: np.ndarray) -> None:
  """Writes `array` as a zarr v3 array of one uncompressed chunk."""
  spec = {
      'driver': 'zarr3',
      'kvstore': {'driver': 'file', 'path': path},
      'metadata': {
          'shape': list(array.shape),
          'data_type': array.dtype.name,
          'chunk_grid': {
              'name': 'regular',
              'configuration': {'chunk_shape': list(array.shape)},
          },
          'chunk_key_encoding': {'name': 'default'},
          'codecs': [{'name': 'bytes', 'configuration': {'endian': 'little'}}],
          'fill_value': 0,
      },
      # Otherwise an all-zero chunk is not written at all (it equals the
      # fill value) and the block would depend on that silently.
      'store_data_equal_to_fill_value': True,
  }
  ts.open(spec, create=True).result().write(array).result()


def _read_array(path: str) -> np.ndarray:
  spec = {
      'driver': 'zarr3',
      'kvstore': {'driver': 'file', 'path': path},
      'fill_missing_data_reads': False,
  }
  return np.asarray(ts.open(spec, open=True).result().read().result())


def _read_block(
    path: str, key: str
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies the block at `path`; returns (manifest, block).

  Checks, in order: the directory holds exactly the expected regular files;
  manifest.json is well formed and describes `key`; each chunk file has the
  expected size; each array read through tensorstore has its recorded
  digest; and the manifest is exactly what the payload would produce.
  """
  try:
    mode = os.lstat(path).st_mode
  except FileNotFoundError:
    raise MissingBlockError(f'no block {key} at {path}') from None
  if stat.S_ISLNK(mode):
    raise UnsafePathError(f'block {key} is a symlink; refusing it')
  if not stat.S_ISDIR(mode):
    raise CorruptBlockError(f'block {key}: {path} is not a directory')
  files = _regular_files(path)
  if MANIFEST not in files:
    raise CorruptBlockError(f'block {key}: missing file {MANIFEST}')
  manifest, meta = _parse_manifest(
      _read_bytes(os.path.join(path, MANIFEST)), key
  )
  entries = manifest['arrays']
  expected_files = {MANIFEST}
  for name in ARRAY_NAMES:
    expected_files.add(f'{name}/zarr.json')
    expected_files.add(_chunk_path(name, len(entries[name]['shape'])))
  missing = sorted(expected_files - files)
  if missing:
    raise CorruptBlockError(f'block {key}: missing file {", ".join(missing)}')
  unexpected = sorted(files - expected_files)
  if unexpected:
    raise CorruptBlockError(
        f'block {key}: unexpected file {", ".join(unexpected)}'
    )
  arrays = {
      name: _read_checked_array(path, key, name, entries[name])
      for name in ARRAY_NAMES
  }
  try:
    block = blocks.KVBlock(meta=meta, **arrays)
    rebuilt = _manifest(key, meta, _block_arrays(block))
  except (ValueError, StoreError) as e:
    raise CorruptBlockError(f'block {key}: not a valid block: {e}') from e
  differences = _differences(manifest, rebuilt)
  if differences:
    raise CorruptBlockError(
        f'block {key}: manifest.json disagrees with its payload (manifest !='
        f' payload): {"; ".join(differences)}'
    )
  return manifest, block


def _parse_manifest(
    data: bytes, key: str
) -> tuple[dict[str, Any], blocks.BlockMeta]:
  """The manifest and its BlockMeta, checked for shape and for `key`."""
  try:
    manifest = json.loads(data.decode('ascii'))
    if manifest['format'] != FORMAT:
      raise ValueError(
          f'format {manifest["format"]!r}, this code reads {FORMAT!r}'
      )
    meta = blocks.BlockMeta.from_json(manifest['meta'])
    entries = manifest['arrays']
    if sorted(entries) != sorted(ARRAY_NAMES):
      raise ValueError(
          f'arrays {sorted(entries)}, expected {sorted(ARRAY_NAMES)}'
      )
    for name in ARRAY_NAMES:
      entry = entries[name]
      if entry['dtype'] not in _DTYPES or not isinstance(entry['sha256'], str):
        raise ValueError(f'bad entry for array {name!r}: {entry}')
      if not all(isinstance(d, int) and d > 0 for d in entry['shape']):
        raise ValueError(f'bad shape for array {name!r}: {entry["shape"]}')
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptBlockError(f'block {key}: malformed {MANIFEST}: {e}') from e
  described = key_for(meta)
  if described != key:
    raise CorruptBlockError(
        f'block {key}: {MANIFEST} describes block {described}'
    )
  return manifest, meta


def _read_checked_array(
    path: str, key: str, name: str, entry: dict[str, Any]
) -> np.ndarray:
  """Reads one array and checks its chunk size and digest against `entry`."""
  chunk = _chunk_path(name, len(entry['shape']))
  expected_size = _DTYPES[entry['dtype']].itemsize * math.prod(entry['shape'])
  found_size = os.lstat(os.path.join(path, chunk)).st_size
  if found_size != expected_size:
    raise CorruptBlockError(
        f'block {key}: array {name!r}: {chunk} holds {found_size} bytes,'
        f' expected {expected_size} (sha256 expected {entry["sha256"]})'
    )
  try:
    array = _read_array(os.path.join(path, name))
  except ValueError as e:
    raise CorruptBlockError(
        f'block {key}: array {name!r}: tensorstore cannot read it: {e}'
    ) from e
  found = array_digest(array)
  if found != entry['sha256']:
    raise CorruptBlockError(
        f'block {key}: array {name!r}: sha256 expected {entry["sha256"]},'
        f' found {found}'
    )
  return array


def _differences(a: Any, b: Any, where: str = '') -> list[str]:
  """Where two JSON values differ, as 'path: a != b' lines."""
  if isinstance(a, dict) and isinstance(b, dict):
    return [
        line for name in sorted(a.keys() | b.keys())
        for line in _differences(a.get(name), b.get(name), f'{where}{name}.')
    ]
  return [] if a == b else [f'{where[:-1]}: {a!r} != {b!r}']


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
  for directory, subdirectories, filenames in os.walk(path):
    for name in subdirectories + filenames:
      full = os.path.join(directory, name)
      relative = os.path.relpath(full, path).replace(os.sep, '/')
      mode = os.lstat(full).st_mode
      if stat.S_ISLNK(mode):
        raise UnsafePathError(
            f'{relative} under {path} is a symlink; refusing it'
        )
      if stat.S_ISREG(mode):
        files.add(relative)
      elif not stat.S_ISDIR(mode):
        raise UnsafePathError(f'{relative} under {path} is not a regular file')
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


def _fsync_tree(path: str) -> None:
  for directory, _, filenames in os.walk(path, topdown=False):
    for name in filenames:
      _fsync(os.path.join(directory, name))
    _fsync(directory)
