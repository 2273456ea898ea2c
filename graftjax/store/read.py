"""Reading a stored block back: every file checked, every byte hashed as it is read."""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from typing import Any

import blake3
import numpy as np
import tensorstore as ts

from graftjax import blocks
from graftjax.store import chunks as store_chunks
from graftjax.store import errors as store_errors
from graftjax.store import files as store_files
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import pages as store_pages

# Bytes read, then hashed, at a time: 16 MiB, so most chunk files are read in one call and
# hashed in one (few hand-overs of the GIL between the threads; on the H200's host 256 KiB
# pieces read slower than 4 MiB ones at 16 threads,
# experiments/results/graft_speed/logs/blake3_pieces_probe_h200.txt).
PIECE = 1 << 24

# A chunk of at least this many bytes is hashed on every core (BLAKE3's tree hashed by the
# `blake3` package's threads, `max_threads=AUTO`: the same digest), so a few large chunks
# (a global layer's keys at 32k tokens are 134 MB at 31B) do not wait on one core each.
PARALLEL_HASH_BYTES = 1 << 20

# Threads a read takes: one per this many bytes of chunks, at most one per CPU. On the H200's
# host, 37 MB (1k tokens of gemma-3-270m in float32) read sooner on 8 or 9 threads than on 16
# (experiments/results/graft_speed/logs/restore_overhead_h200.txt, restore_threads_h200.txt):
# the pool's wake-ups and the GIL cost more than they gain. 2-16 MiB a thread were within that
# machine's noise from 4k up.
BYTES_PER_THREAD = 4 << 20

# Where a block is read to: (meta, shapes by name) -> writable arrays by name
# ('k', 'v' [L, n, K, H] with each layer C-contiguous, 'positions' [n] int32).
Into = Callable[[blocks.BlockMeta, dict[str, tuple[int, ...]]], dict[str, np.ndarray]]
# Called as `(name, stop)` once layers [0, stop) of array `name` ('k', 'v' of a plain block,
# layer by layer) or all of it (stop None: positions, and a page's k and v once its whole
# layers, tails and zeros are in place) are in place and every chunk matched its digest, while
# the rest is still read; the block as a whole is checked only after (a read that then fails
# raises, and the arrays must not be used).
OnVerified = Callable[[str, int | None], None]


class _Vanished(Exception):
  """A file of a block was not there when read: `manifest`, the manifest's bytes it was read
  under (None if not yet read), `name` the file."""

  def __init__(self, manifest: bytes | None, name: str):
    super().__init__(manifest, name)
    self.manifest = manifest
    self.name = name


def read_block(
  kv: ts.KvStore,
  where: str,
  key: str,
  local: str | None,
  into: Into | None = None,
  on_verified: OnVerified | None = None,
  staged: bytes | None = None,
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies the block under `kv`; returns (manifest, block).

  On an object store the manifest is read first and the payload where it says
  (`store_manifest.data_prefix`). A block deleted (or replaced) while it is read
  is read again from the start, and reported missing if it is gone; a file
  missing under the manifest it was read by, still in place, is corruption.

  Args:
    kv: the block's kvstore (its path: the block's prefix).
    where: its path or URL, for messages.
    key: its key.
    local: its directory on the `file` kvstore (checked for symlinks and
      stray entries; its chunk files are read straight into the arrays), or
      None.
    into: where to read the arrays to (e.g. reused staging buffers; a page's
      rows not kept are zeroed there); new arrays if None.
    on_verified: called as layers of each array verify (`OnVerified`), or None.
    staged: on an object store, the bytes of a manifest not yet written (a
      deposit reading back its payload before it commits), or None.
  """
  for _ in range(3):
    try:
      return _read_once(kv, where, key, local, into, on_verified, staged)
    except _Vanished as e:
      if staged is not None:
        raise store_errors.CorruptBlockError(where, f'missing file {e.name}') from None
      with store_errors.io_errors(where, 'cannot read the block'):
        found = store_kvstore.result(kv.read(store_manifest.MANIFEST))
      if found.state != 'value':
        raise store_errors.MissingBlockError(
          where, 'no such block (deleted while being read)'
        ) from None
      if e.manifest is not None and found.value == e.manifest:  # the same commit
        raise store_errors.CorruptBlockError(where, f'missing file {e.name}') from None
  raise store_errors.CorruptBlockError(where, 'files kept vanishing while the block was read')


def _read_once(
  kv: ts.KvStore,
  where: str,
  key: str,
  local: str | None,
  into: Into | None,
  on_verified: OnVerified | None,
  staged: bytes | None = None,
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies a block once (arguments as `read_block`).

  Checks, in order: on `file`, that the block holds exactly the expected
  files (regular files); manifest.json passes `store_manifest.parse_manifest`
  (`check_manifest`, describes `key`, and is exactly what its chunk digests
  and the arrays' dtypes and shapes produce); on an object store, for a
  manifest of a format before 5 (payload beside it), that the listing holds
  exactly its files (writers' prefixes aside); each zarr.json describes the
  layout the manifest implies; and each chunk has the expected size and its
  recorded digest (hashed once, as read); then that its positions are what its
  metadata says (`blocks.check_positions`).
  """
  manifest_data = staged
  try:
    if local is None:
      if manifest_data is None:
        found = store_kvstore.result(kv.read(store_manifest.MANIFEST))
        if found.state != 'value':
          store_kvstore.result(kv.list())  # a missing bucket answers a GET as a missing key
          raise store_errors.MissingBlockError(where, 'no such block')
        manifest_data = found.value
      files = None
    else:
      files = _listing(kv, where, local)
      if store_manifest.MANIFEST not in files:
        raise store_errors.CorruptBlockError(where, f'missing file {store_manifest.MANIFEST}')
      manifest_data = _small_file(local, store_manifest.MANIFEST)
    manifest, meta = store_manifest.parse_manifest(manifest_data, where, key)
    prefix = store_manifest.data_prefix(manifest)
    payload_kv = kv / prefix if prefix else kv
    entries = manifest['arrays']
    store_format = manifest['format']
    separator = store_manifest.chunk_separator(store_format)
    chunks = {
      name: store_chunks.chunks(name, entry['dtype'], entry['shape'], separator=separator)
      for name, entry in entries.items()
    }
    names = [name for name in store_manifest.PAGE_ARRAY_NAMES if name in entries]
    zarr_names = [f'{name}/zarr.json' for name in names]
    payload_files = [*zarr_names, *(chunk.path for name in names for chunk in chunks[name])]
    expected_files = {store_manifest.MANIFEST, *(prefix + path for path in payload_files)}
    layout = store_pages.layout_of(manifest)
    arrays = _destinations(meta, entries, layout, into, where)
    zeros, reads = _jobs(chunks, entries, names, layout, arrays, store_format)
    if local is None:
      # Every small file and, where the manifest names the payload's prefix, every chunk at
      # once: one round trip after the manifest's. Before format 5 the listing of the block
      # (its payload beside the manifest) says first that it holds exactly its files.
      small = {name: payload_kv.read(name) for name in zarr_names}
      if prefix:
        pending = [payload_kv.read(chunk.path) for chunk, _, _ in reads]
      else:
        files = _listing(kv, where, None)
        pending = None
    if files is not None:
      missing = sorted(expected_files - files)
      if missing:
        raise store_errors.CorruptBlockError(where, f'missing file {", ".join(missing)}')
      unexpected = sorted(files - expected_files)
      if unexpected:
        raise store_errors.CorruptBlockError(where, f'unexpected file {", ".join(unexpected)}')
    for name in names:
      data = (
        store_kvstore.value(small[f'{name}/zarr.json'], f'{prefix}{name}/zarr.json')
        if local is None
        else _small_file(local, f'{prefix}{name}/zarr.json')
      )
      _check_zarr_metadata(data, where, name, entries[name], separator)
    if local is None:  # every read in flight at once; tensorstore overlaps them
      if pending is None:
        pending = [payload_kv.read(chunk.path) for chunk, _, _ in reads]
      jobs = [
        lambda r=r, p=p: _take_value(where, *r, p, store_format, prefix)
        for r, p in zip(reads, pending)
      ]
    else:  # on `file`, straight from each file into its place: one copy
      payload_dir = os.path.join(local, prefix)  # a format-5 block copied from an object store
      jobs = [lambda r=r: _read_file(where, payload_dir, *r, store_format) for r in reads]
    jobs = [lambda z=z: z.fill(0) for z in zeros] + jobs  # a page's zeros before its arrays
    after = {} if on_verified is None else _reports(reads, len(zeros), layout, on_verified)
    threads = -(-sum(out.size for _, _, out in reads) // BYTES_PER_THREAD)
    store_chunks.map_threads(lambda job: job(), jobs, after=after, threads=threads)
  except FileNotFoundError as e:
    raise _Vanished(manifest_data, str(e.filename)) from e
  except OSError as e:
    error = store_errors.AccessDeniedError if getattr(e, 'denied', False) else None
    raise (error or store_errors.StoreIOError)(
      where, f'cannot read the block: {e.strerror or e}'
    ) from e
  try:
    block = blocks.KVBlock(meta=meta, **arrays)
    blocks.check_positions(block.positions, meta)
  except ValueError as e:  # blocks.GraftError included
    raise store_errors.CorruptBlockError(where, f'not a valid block: {e}') from e
  return manifest, block


def _reports(
  reads: list[tuple[store_chunks.Chunk, str, np.ndarray]],
  first: int,
  layout: store_pages.Layout | None,
  on_verified: OnVerified,
) -> dict[int, Callable[[], None]]:
  """`map_threads`' `after`: the `on_verified` call each job index (reads from `first`)
  completes. A plain block's k and v layer by layer; positions and a page's arrays whole."""
  if layout is None:
    return {
      first + i: functools.partial(
        on_verified, chunk.name, None if chunk.name == 'positions' else chunk.index + 1
      )
      for i, (chunk, _, _) in enumerate(reads)
    }
  last = {chunk.name.removesuffix('_tail'): first + i for i, (chunk, _, _) in enumerate(reads)}
  return {i: functools.partial(on_verified, name, None) for name, i in last.items()}


def _listing(kv: ts.KvStore, where: str, local: str | None) -> set[str]:
  """The block's files, '/'-separated and relative; MissingBlockError if none. On an object
  store, the files of writers' own prefixes (`<data>/...`: deposits in progress, lost or
  abandoned, and format 5's payloads) are left out."""
  if local is None:
    names = (name.decode('utf-8', 'replace') for name in store_kvstore.result(kv.list()))
    files = {name for name in names if not store_manifest.DATA_ID.fullmatch(name.split('/')[0])}
    if store_manifest.MANIFEST not in files:
      raise store_errors.MissingBlockError(where, 'no such block (deleted while being read)')
    return files
  try:
    mode = os.lstat(local).st_mode
  except FileNotFoundError:
    raise store_errors.MissingBlockError(where, 'no such block') from None
  if stat.S_ISLNK(mode):
    raise store_errors.UnsafePathError(where, 'the block is a symlink; refusing it')
  if not stat.S_ISDIR(mode):
    raise store_errors.CorruptBlockError(where, 'the block is not a directory')
  return store_files.regular_files(local)


def _small_file(local: str, name: str) -> bytes:
  """The bytes of file `name` of a block on `file`, straight from its directory `local` (a
  kvstore read of a small file costs several times more)."""
  fd = os.open(os.path.join(local, name), os.O_RDONLY | os.O_NOFOLLOW)
  with open(fd, 'rb', buffering=0) as f:
    return f.readall()


def _destinations(
  meta: blocks.BlockMeta,
  entries: dict[str, Any],
  layout: store_pages.Layout | None,
  into: Into | None,
  where: str,
) -> dict[str, np.ndarray]:
  """The arrays the block is read into: k, v [L, n, K, H] and positions [n].

  From `into` if given (checked: shape, dtype, and each layer's rows
  contiguous), else newly allocated.
  """
  k_shape = list(entries['k']['shape'])
  if layout is not None:
    k_shape[0] = len(layout)
  dtype = store_chunks.DTYPES[meta.dtype]
  shapes = {'k': tuple(k_shape), 'v': tuple(k_shape), 'positions': (k_shape[1],)}
  dtypes = {'k': dtype, 'v': dtype, 'positions': store_chunks.DTYPES['int32']}
  if layout is None and 'k_tail' in entries:  # a compact block's tail, as stored
    shapes.update({name: tuple(entries[name]['shape']) for name in ('k_tail', 'v_tail')})
    dtypes.update(k_tail=dtype, v_tail=dtype)
  if into is not None:
    arrays = into(meta, shapes)
    for name, shape in shapes.items():
      array = arrays[name]
      rows = array if name == 'positions' else array[0]
      if (
        array.shape != shape
        or array.dtype != dtypes[name]
        or not rows.flags.c_contiguous
        or not array.flags.writeable
      ):
        raise ValueError(
          f'`into` gave {name} {array.dtype}{list(array.shape)} (strides {array.strides}):'
          f' expected a writable {dtypes[name]}{list(shape)} with each layer C-contiguous'
        )
    return {name: arrays[name] for name in shapes}
  try:
    return {name: np.empty(shape, dtypes[name]) for name, shape in shapes.items()}
  except (ValueError, MemoryError) as e:
    raise store_errors.CorruptBlockError(
      where, f'arrays of {store_manifest.MANIFEST} too large to read: {e}'
    ) from e


def _jobs(
  chunks: dict[str, list[store_chunks.Chunk]],
  entries: dict[str, Any],
  names: list[str],
  layout: store_pages.Layout | None,
  arrays: dict[str, np.ndarray],
  store_format: str,
) -> tuple[list[np.ndarray], list[tuple[store_chunks.Chunk, str, np.ndarray]]]:
  """What to zero (a page's rows not kept) and what to read: (chunk, digest, its bytes' place)."""
  zeros, reads = [], []
  whole = tail = ()
  if layout is not None:
    whole = [i for i, (first, _) in enumerate(layout) if first == 0]
    tail = [(i, first) for i, (first, _) in enumerate(layout) if first != 0]
    zeros = [arrays[name][i, :first] for name in ('k', 'v') for i, first in tail]
  chunk_field, _ = store_manifest.digest_fields(store_format)
  # positions first (one small chunk), so the last chunk read is v's: k, v each verify sooner.
  for name in sorted(names, key=lambda name: name != 'positions'):
    for chunk, digest in zip(chunks[name], entries[name][chunk_field]):
      if name == 'positions':
        place = arrays[name]
      elif layout is None:
        place = arrays[name][chunk.index]
      elif name.endswith('_tail'):
        layer, first = tail[chunk.index]
        place = arrays[name.removesuffix('_tail')][layer, first:]
      else:
        place = arrays[name][whole[chunk.index]]
      reads.append((chunk, digest, store_chunks.flat_bytes(place)))
  return zeros, reads


def _read_file(
  where: str, local: str, chunk: store_chunks.Chunk, expected: str, out, store_format: str
) -> str:
  """Reads a chunk file straight into `out` ([size] uint8), hashing each piece as it lands.

  One copy, from the file into the array returned: the bytes returned are
  the bytes hashed. The size is that of the file opened, so a chunk that
  changed after the listing is caught here.

  Returns:
    The chunk's digest hex (the hash of `store_format`), which is `expected`.
  """
  fd = os.open(os.path.join(local, chunk.path), os.O_RDONLY | os.O_NOFOLLOW)
  with open(fd, 'rb', buffering=0) as f:
    size = os.fstat(fd).st_size
    if size != out.size:
      raise _wrong_size(where, chunk, size, out.size, expected)
    digest = chunk_hash(store_format, out.size)
    done = 0
    while done < out.size:
      count = f.readinto(out[done : done + PIECE])
      if not count:
        raise _wrong_size(where, chunk, done, out.size, expected)
      digest.update(out[done : done + count])
      done += count
  return _checked(where, chunk, expected, digest.hexdigest())


def _take_value(
  where: str,
  chunk: store_chunks.Chunk,
  expected: str,
  out: np.ndarray,
  read: Any,
  store_format: str,
  prefix: str = '',
) -> str:
  """Copies a kvstore value just read into `out` ([size] uint8), hashing each piece as copied.

  Returns:
    The chunk's digest hex (the hash of `store_format`), which is `expected`.
  """
  data = np.frombuffer(store_kvstore.value(read, f'{prefix}{chunk.path}'), np.uint8)
  if data.size != out.size:
    raise _wrong_size(where, chunk, data.size, out.size, expected)
  digest = chunk_hash(store_format, out.size)
  for offset in range(0, out.size, PIECE):
    piece = data[offset : offset + PIECE]
    digest.update(piece)
    out[offset : offset + piece.size] = piece
  return _checked(where, chunk, expected, digest.hexdigest())


def chunk_hash(store_format: str, nbytes: int):
  """A fresh hash of `store_format`'s chunk digests for a chunk of `nbytes` bytes: BLAKE3 on
  every core from `PARALLEL_HASH_BYTES` (the digest does not depend on it), else one thread."""
  if nbytes >= PARALLEL_HASH_BYTES and store_manifest.DIGEST_OF_FORMAT[store_format] == 'blake3':
    return blake3.blake3(max_threads=blake3.blake3.AUTO)
  return store_manifest.new_hash(store_format)


def _wrong_size(where, chunk, found: int, size: int, expected: str):
  return store_errors.CorruptBlockError(
    where, f'{chunk}: holds {found} bytes, expected {size} (digest expected {expected})'
  )


def _checked(where: str, chunk: store_chunks.Chunk, expected: str, found: str) -> str:
  if found != expected:
    raise store_errors.CorruptBlockError(
      where, f'{chunk}: digest expected {expected}, found {found}'
    )
  return found


def _check_zarr_metadata(
  data: bytes, where: str, name: str, entry: dict[str, Any], separator: str
) -> None:
  """Raises unless `data`, `name`/zarr.json, describes the array `entry` describes, its
  chunks keyed with `separator`."""
  problem = _zarr_problem(data, name, entry['dtype'], tuple(entry['shape']), separator)
  if problem is not None:
    raise store_errors.CorruptBlockError(where, problem)


@functools.lru_cache(maxsize=1024)
def _zarr_problem(
  data: bytes, name: str, dtype: str, shape: tuple[int, ...], separator: str
) -> str | None:
  """What is wrong with `data` as `name`/zarr.json of such an array, or None. Memoized: the
  same bytes are checked once per process (a restore reads three of these)."""
  relative_path = f'{name}/zarr.json'
  try:
    found = store_manifest.load_json(data)
    if not isinstance(found, dict):
      raise store_errors.MalformedError(f'not a JSON object: {store_errors.short(found)}')
  except store_errors.MalformedError as e:
    return f'malformed {relative_path}: {e}'
  # What decides where tensorstore finds the bytes and how it decodes them;
  # other fields (attributes, dimension_names) are free.
  expected = {
    **store_chunks.zarr_metadata(name, dtype, list(shape), separator=separator),
    'storage_transformers': None,
  }
  differences = store_manifest.differences(
    {field: found.get(field) for field in expected}, expected
  )
  if differences:
    return (
      f'{relative_path} disagrees with {store_manifest.MANIFEST} (zarr.json != manifest):'
      f' {"; ".join(differences)}'
    )
  return None
