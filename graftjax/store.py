"""Block store: KV blocks on disk, content-addressed, verified, atomic.

`BlockStore(root)` keeps each `KVBlock` in its own directory, named by the
block's key: the SHA-256 of what the block *is* (model, tokens, slots, dtype,
position scheme, layout version; see `key_for`), not of its bytes. Putting a
block whose key is already stored is a no-op when the stored payload is the
same and verifies, and an error naming the difference otherwise.

On-disk layout (format `graftjax.blockstore/2`)::

  <root>/
    .lock                  flock: deposits share it, garbage collection owns it
    .tmp/                  deposits and deletions in progress; never read
    <key>/                 one complete block; key = 64 lowercase hex digits
      manifest.json        format, key, layout version, BlockMeta, digests
      k/zarr.json          zarr v3 array metadata, written by tensorstore
      k/c/<l>/0/0/0        chunk l of k [L, n, K, H]: layer l, [1, n, K, H]
      v/zarr.json
      v/c/<l>/0/0/0        chunk l of v [L, n, K, H]: layer l, [1, n, K, H]
      positions/zarr.json
      positions/c/0        the only chunk of positions [n] int32

k and v are chunked along the layer axis, one chunk per layer; positions is
one chunk. Every chunk uses the `bytes` codec (little-endian) and no
compression, so a chunk file is exactly its slice's raw C-order bytes, and
chunk l of k is bytes [l * s, (l + 1) * s) of k, s = n * K * H * itemsize.
k and v are `float32` or `bfloat16` (a native zarr v3 data type in
tensorstore). Nothing in the files depends on time, host or process, so the
same block gives byte-identical files in every store (with one tensorstore
version, which writes zarr.json; `digest_tree` checks this).

A deposit writes the arrays and then manifest.json into a fresh directory
under `.tmp/`, fsyncs it, reads it back through `verify`'s checks, and
renames the whole directory to `<key>/`. A crashed deposit leaves only a
directory under `.tmp/`, which `list()` never shows and `gc()` (or the next
`put` that finds no other deposit running) removes. If two writers race on
one key, the loser's rename fails, and it verifies the winner's block instead.

manifest.json records, for each array, its dtype, shape, chunk shape, the
SHA-256 of each chunk file in chunk order (`chunk_sha256`, so `sha256sum
k/c/3/0/0/0` checks layer 3 of k) and a two-level `sha256` of the whole
array: SHA-256 over the ASCII header `f'{dtype}[{d0},{d1},...]\\n'` followed
by the 32 raw bytes of each chunk digest, in chunk order (see
`array_digest`). Chunk digests let `get` hash the chunks in parallel, each
as it is read; the array digest names the payload in one value.

`get` and `verify` read each chunk file themselves, in a pool of threads, a
piece at a time into the array they return, hashing each piece as it lands
(hashlib and file reads release the GIL): the bytes returned are the bytes
hashed, read once, hashed once, copied once. The files are read only as
JSON and as raw bytes; nothing is unpickled or evaluated, keys are checked
to be 64 lowercase hex digits, symlinks inside the store are refused, and
each zarr.json is checked to describe the layout above, so tensorstore reads
the same arrays.

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

import concurrent.futures
import contextlib
import dataclasses
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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import ml_dtypes
import numpy as np
import tensorstore as ts

from graftjax import blocks

FORMAT = 'graftjax.blockstore/2'
KEY_SCHEME = 'graftjax.block-key/2'
MANIFEST = 'manifest.json'
ARRAY_NAMES = ('k', 'v', 'positions')
KV_DTYPES = ('float32', 'bfloat16')

_DTYPES = {
  'float32': np.dtype(np.float32),
  'bfloat16': np.dtype(ml_dtypes.bfloat16),
  'int32': np.dtype(np.int32),
}
_LAYERED = ('k', 'v')  # chunked one layer per chunk; the rest in one chunk
_SHA256_HEX = re.compile(r'[0-9a-f]{64}')  # keys and digests
_STAGING = '.tmp'
_LOCK = '.lock'
# Bytes read, then hashed while they are still in (L2) cache, at a time.
_PIECE = 1 << 18

_T = TypeVar('_T')
_R = TypeVar('_R')


class StoreError(Exception):
  """A block cannot be stored or read back as asked."""


class InvalidKeyError(StoreError):
  """A key is not 64 lowercase hex digits (and so could name any path)."""


class MissingBlockError(StoreError):
  """No block is stored under a key."""


class CorruptBlockError(StoreError):
  """A stored block does not match its manifest, or has no manifest."""


class UnsupportedFormatError(StoreError):
  """A stored block is in an on-disk format this code does not read."""


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
    'token_ids': list(map(int, meta.token_ids)),
    'start': int(meta.start),
    'stop': int(meta.start) + len(meta.token_ids),
    'first_position': int(meta.first_position),
    'shift': int(meta.shift),
    'dtype': str(meta.dtype),
    'position_scheme': str(meta.position_scheme),
    'layout_version': int(meta.layout_version),
  }
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
      UnsupportedFormatError: if its key is stored in another format.
    """
    key = key_for(block.meta)
    arrays = _block_arrays(block)
    manifest = _manifest(key, block.meta, arrays, _digests(arrays))
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
      InvalidKeyError, MissingBlockError, CorruptBlockError,
      UnsupportedFormatError, UnsafePathError.
    """
    _, block = _read_block(self._block_path(key), key)
    return block

  def verify(self, key: str) -> None:
    """Raises unless the block under `key` matches its manifest exactly.

    Raises:
      InvalidKeyError, MissingBlockError, CorruptBlockError,
      UnsupportedFormatError, UnsafePathError.
    """
    _read_block(self._block_path(key), key)

  def list(self) -> list[str]:
    """Sorted keys of the complete blocks (not verified; see `verify`)."""
    return sorted(
      name
      for name in os.listdir(self.root)
      if _SHA256_HEX.fullmatch(name) and self._is_complete(name)
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
      not os.path.islink(path)
      and os.path.isdir(path)
      and not os.path.islink(manifest)
      and os.path.isfile(manifest)
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


def _checked_key(key: str) -> str:
  if not isinstance(key, str) or not _SHA256_HEX.fullmatch(key):
    raise InvalidKeyError(f'invalid block key {key!r}: expected 64 lowercase hex digits')
  return key


def _block_arrays(block: blocks.KVBlock) -> dict[str, np.ndarray]:
  """The block's arrays as little-endian C-order numpy, checked storable."""
  dtype = block.meta.dtype
  if dtype not in KV_DTYPES:
    raise StoreError(f'cannot store k/v of dtype {dtype!r}; only {KV_DTYPES}')
  if len(block) == 0:
    raise StoreError('cannot store an empty block')
  arrays = {
    name: np.ascontiguousarray(a, a.dtype.newbyteorder('<')) for name, a in block.arrays().items()
  }
  for name in _LAYERED:
    if arrays[name].dtype.name != dtype:
      raise StoreError(
        f'array {name!r} is {arrays[name].dtype.name} but the block metadata says {dtype}'
      )
  return arrays


def _digests(arrays: dict[str, np.ndarray]) -> dict[str, list[str]]:
  """SHA-256 hex of each chunk of each array, hashed in parallel."""
  chunks = [
    chunk
    for name, array in arrays.items()
    for chunk in _chunks(name, array.dtype.name, array.shape)
  ]
  found = _map_threads(
    lambda c: hashlib.sha256(_flat_bytes(arrays[c.name])[c.start : c.stop]).hexdigest(),
    chunks,
  )
  digests = {name: [] for name in arrays}
  for chunk, digest in zip(chunks, found):
    digests[chunk.name].append(digest)
  return digests


def _manifest(
  key: str,
  meta: blocks.BlockMeta,
  arrays: dict[str, np.ndarray],
  digests: dict[str, list[str]],
) -> dict[str, Any]:
  """The manifest of a block, from its arrays' chunk digests (no hashing)."""
  return {
    'format': FORMAT,
    'key': key,
    'layout_version': meta.layout_version,
    'meta': _meta_json(meta),
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


def _meta_json(meta: blocks.BlockMeta) -> dict[str, Any]:
  """`meta.to_json()`, without `dataclasses.asdict`'s copy of each token id.

  That copy took about 0.1 s for 32k tokens, on every `get`; the manifest
  test checks that the two agree.
  """
  fields = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
  return {**fields, 'token_ids': list(meta.token_ids)}


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
    'fill_value': 0,
  }


def _write_block(path: str, arrays: dict[str, np.ndarray], manifest: dict[str, Any]) -> None:
  """Writes arrays, then manifest.json, into a new directory; fsyncs all."""
  os.mkdir(path)
  for name, array in arrays.items():
    _write_array(os.path.join(path, name), array)
  text = json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=True)
  with open(os.path.join(path, MANIFEST), 'x', encoding='ascii') as f:
    f.write(text + '\n')
  _fsync_tree(path)


def _write_array(path: str, array: np.ndarray) -> None:
  """Writes `array` as zarr v3 with `_zarr_metadata`'s chunks and codecs."""
  metadata = _zarr_metadata(os.path.basename(path), array.dtype.name, array.shape)
  spec = {
    'driver': 'zarr3',
    'kvstore': {'driver': 'file', 'path': path},
    'metadata': metadata,
    # Otherwise an all-zero chunk is not written at all (it equals the
    # fill value) and the block would depend on that silently.
    'store_data_equal_to_fill_value': True,
  }
  ts.open(spec, create=True).result().write(array).result()


def _read_block(path: str, key: str) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies the block at `path`; returns (manifest, block).

  Checks, in order: the directory holds exactly the expected regular files;
  manifest.json is well formed and describes `key`; each zarr.json describes
  the layout the manifest implies; each chunk file has the expected size and
  its recorded digest (hashed once, as read); and the manifest is exactly
  what those chunk digests and the arrays' dtypes and shapes produce.
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
  manifest, meta = _parse_manifest(_read_bytes(os.path.join(path, MANIFEST)), key)
  entries = manifest['arrays']
  chunks = {name: _chunks(name, entry['dtype'], entry['shape']) for name, entry in entries.items()}
  expected_files = {MANIFEST}
  for name in ARRAY_NAMES:
    expected_files.add(f'{name}/zarr.json')
    expected_files.update(chunk.path for chunk in chunks[name])
  missing = sorted(expected_files - files)
  if missing:
    raise CorruptBlockError(f'block {key}: missing file {", ".join(missing)}')
  unexpected = sorted(files - expected_files)
  if unexpected:
    raise CorruptBlockError(f'block {key}: unexpected file {", ".join(unexpected)}')
  for name in ARRAY_NAMES:
    _check_zarr_metadata(path, key, name, entries[name])
  recorded = [
    (chunk, digest)
    for name in ARRAY_NAMES
    for chunk, digest in zip(chunks[name], entries[name]['chunk_sha256'])
  ]
  for chunk, digest in recorded:
    size = os.lstat(os.path.join(path, chunk.path)).st_size
    if size != chunk.stop - chunk.start:
      raise CorruptBlockError(
        f'block {key}: {chunk}: holds {size} bytes, expected'
        f' {chunk.stop - chunk.start} (sha256 expected {digest})'
      )
  arrays = {
    name: np.empty(entry['shape'], _DTYPES[entry['dtype']]) for name, entry in entries.items()
  }
  found = _map_threads(
    lambda task: _read_chunk(path, key, *task, _flat_bytes(arrays[task[0].name])),
    recorded,
  )
  digests = {name: [] for name in ARRAY_NAMES}
  for (chunk, _), digest in zip(recorded, found):
    digests[chunk.name].append(digest)
  try:
    block = blocks.KVBlock(meta=meta, **arrays)
    rebuilt = _manifest(key, meta, _block_arrays(block), digests)
  except (ValueError, StoreError) as e:
    raise CorruptBlockError(f'block {key}: not a valid block: {e}') from e
  differences = _differences(manifest, rebuilt)
  if differences:
    raise CorruptBlockError(
      f'block {key}: manifest.json disagrees with its payload (manifest !='
      f' payload): {"; ".join(differences)}'
    )
  return manifest, block


def _parse_manifest(data: bytes, key: str) -> tuple[dict[str, Any], blocks.BlockMeta]:
  """The manifest and its BlockMeta, checked for shape and for `key`."""
  try:
    manifest = json.loads(data.decode('ascii'))
    if manifest['format'] != FORMAT:
      raise UnsupportedFormatError(
        f'block {key}: {MANIFEST} has format {manifest["format"]!r}; this'
        f' code reads only {FORMAT!r}'
      )
    meta = blocks.BlockMeta.from_json(manifest['meta'])
    entries = manifest['arrays']
    if sorted(entries) != sorted(ARRAY_NAMES):
      raise ValueError(f'arrays {sorted(entries)}, expected {sorted(ARRAY_NAMES)}')
    for name in ARRAY_NAMES:
      entry = entries[name]
      if entry['dtype'] not in _DTYPES or not isinstance(entry['sha256'], str):
        raise ValueError(f'bad entry for array {name!r}: {entry}')
      shape = entry['shape']
      if not (
        isinstance(shape, list) and shape and all(isinstance(d, int) and d > 0 for d in shape)
      ):
        raise ValueError(f'bad shape for array {name!r}: {shape}')
      digests = entry['chunk_sha256']
      rows = _chunk_shape(name, shape)[0]
      if not (
        isinstance(digests, list)
        and len(digests) * rows == shape[0]
        and all(isinstance(d, str) and _SHA256_HEX.fullmatch(d) for d in digests)
      ):
        raise ValueError(
          f'array {name!r} of shape {shape} needs {shape[0] // rows} chunk'
          f' digests (64 lowercase hex digits each), got {digests}'
        )
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptBlockError(f'block {key}: malformed {MANIFEST}: {e}') from e
  described = key_for(meta)
  if described != key:
    raise CorruptBlockError(f'block {key}: {MANIFEST} describes block {described}')
  return manifest, meta


def _check_zarr_metadata(path: str, key: str, name: str, entry: dict[str, Any]) -> None:
  """Raises unless `name`/zarr.json describes the array `entry` describes."""
  relative_path = f'{name}/zarr.json'
  try:
    found = json.loads(_read_bytes(os.path.join(path, relative_path)))
    if not isinstance(found, dict):
      raise ValueError(f'not a JSON object: {found!r}')
  except ValueError as e:
    raise CorruptBlockError(f'block {key}: malformed {relative_path}: {e}') from e
  # What decides where tensorstore finds the bytes and how it decodes them;
  # other fields (attributes, dimension_names) are free.
  expected = {
    **_zarr_metadata(name, entry['dtype'], entry['shape']),
    'storage_transformers': None,
  }
  differences = _differences({field: found.get(field) for field in expected}, expected)
  if differences:
    raise CorruptBlockError(
      f'block {key}: {relative_path} disagrees with {MANIFEST} (zarr.json'
      f' != manifest): {"; ".join(differences)}'
    )


def _read_chunk(path: str, key: str, chunk: _Chunk, expected: str, array_bytes: np.ndarray) -> str:
  """Reads a chunk file into its slice of `array_bytes`, checking its digest.

  The file's size has been checked. Each piece is hashed right after it is
  read, while still in cache.

  Args:
    path: the block's directory.
    key: the block's key, for messages.
    chunk: which chunk file, and where its bytes go.
    expected: the chunk's recorded SHA-256 hex.
    array_bytes: [nbytes] uint8 bytes of the chunk's whole array.

  Returns:
    The chunk's SHA-256 hex, which is `expected`.
  """
  out = array_bytes[chunk.start : chunk.stop]
  fd = os.open(os.path.join(path, chunk.path), os.O_RDONLY | os.O_NOFOLLOW)
  with open(fd, 'rb', buffering=0) as f:
    digest = hashlib.sha256()
    done = 0
    while done < out.size:
      count = f.readinto(out[done : done + _PIECE])
      if not count:
        raise CorruptBlockError(f'block {key}: {chunk}: ended after {done} of {out.size} bytes')
      digest.update(out[done : done + count])
      done += count
  found = digest.hexdigest()
  if found != expected:
    raise CorruptBlockError(f'block {key}: {chunk}: sha256 expected {expected}, found {found}')
  return found


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
  return [f'{where[:-1]}: {a!r} != {b!r}']


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
          raise UnsafePathError(f'{relative} under {path} is a symlink; refusing it')
        if entry.is_dir(follow_symlinks=False):
          directories.append(f'{relative}/')
        elif entry.is_file(follow_symlinks=False):
          files.add(relative)
        else:
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
