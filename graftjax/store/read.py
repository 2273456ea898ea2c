"""Reading a stored block back: every file checked, every byte hashed as it is read."""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorstore as ts

from graftjax import blocks
from graftjax.store import chunks as store_chunks
from graftjax.store import errors as store_errors
from graftjax.store import files as store_files
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import pages as store_pages

# Bytes read, then hashed while they are still in cache, at a time (4 MiB: the fastest
# verified read of 256 KiB to 4 MiB pieces on the H200's host,
# experiments/results/graft_speed/logs/blake3_pieces_probe_h200.txt).
PIECE = 1 << 22

# Threads a read takes: one per this many bytes of chunks, at most one per CPU. On the H200's
# host, 37 MB (1k tokens of gemma-3-270m in float32) read sooner on 8 or 9 threads than on 16
# (experiments/results/graft_speed/logs/restore_overhead_h200.txt, restore_threads_h200.txt):
# the pool's wake-ups and the GIL cost more than they gain. 2-16 MiB a thread were within that
# machine's noise from 4k up.
BYTES_PER_THREAD = 4 << 20

# The small files of a plain block, read from an object store with its listing (a page's
# tail arrays' zarr.json are read once its manifest names them).
_READ_AHEAD = (
  store_manifest.MANIFEST,
  *(f'{name}/zarr.json' for name in store_manifest.ARRAY_NAMES),
)

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
  """A file of a block disappeared between listing and reading it."""


def read_block(
  kv: ts.KvStore,
  where: str,
  key: str,
  local: str | None,
  into: Into | None = None,
  on_verified: OnVerified | None = None,
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies the block under `kv`; returns (manifest, block).

  A block deleted (or replaced) while it is read is read again from the
  start, and reported missing if it is gone.

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
  """
  for _ in range(3):
    try:
      return _read_once(kv, where, key, local, into, on_verified)
    except _Vanished:
      with store_errors.io_errors(where, 'cannot read the block'):
        if store_kvstore.result(kv.read(store_manifest.MANIFEST)).state != 'value':
          raise store_errors.MissingBlockError(
            where, 'no such block (deleted while being read)'
          ) from None
  raise store_errors.CorruptBlockError(where, 'files kept vanishing while the block was read')


def _read_once(
  kv: ts.KvStore,
  where: str,
  key: str,
  local: str | None,
  into: Into | None,
  on_verified: OnVerified | None,
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies a block once (arguments as `read_block`).

  Checks, in order: the block holds exactly the expected files (regular
  files, on `file`); manifest.json passes `store_manifest.parse_manifest`
  (`check_manifest`, describes `key`, and is exactly what its chunk digests
  and the arrays' dtypes and shapes produce); each zarr.json describes the
  layout the manifest implies; and each chunk has the expected size and its
  recorded digest (hashed once, as read); then that its positions are what its
  metadata says (`blocks.check_positions`).
  """
  try:
    # On an object store every small file is asked for with the listing, in one round trip:
    # the listing still decides what the block holds; a file read ahead is used only if listed.
    listed = ahead = None
    if local is None:
      listed = kv.list()
      ahead = {name: kv.read(name) for name in _READ_AHEAD}
    files = _listing(kv, where, local, listed)
    if store_manifest.MANIFEST not in files:
      raise store_errors.CorruptBlockError(where, f'missing file {store_manifest.MANIFEST}')
    manifest, meta = store_manifest.parse_manifest(
      _small_file(kv, local, store_manifest.MANIFEST, ahead), where, key
    )
    entries = manifest['arrays']
    store_format = manifest['format']
    separator = store_manifest.chunk_separator(store_format)
    chunks = {
      name: store_chunks.chunks(name, entry['dtype'], entry['shape'], separator=separator)
      for name, entry in entries.items()
    }
    names = [name for name in store_manifest.PAGE_ARRAY_NAMES if name in entries]
    expected_files = {store_manifest.MANIFEST}
    for name in names:
      expected_files.add(f'{name}/zarr.json')
      expected_files.update(chunk.path for chunk in chunks[name])
    missing = sorted(expected_files - files)
    if missing:
      raise store_errors.CorruptBlockError(where, f'missing file {", ".join(missing)}')
    unexpected = sorted(files - expected_files)
    if unexpected:
      raise store_errors.CorruptBlockError(where, f'unexpected file {", ".join(unexpected)}')
    for name in names:
      _check_zarr_metadata(
        _small_file(kv, local, f'{name}/zarr.json', ahead), where, name, entries[name], separator
      )
    layout = store_pages.layout_of(manifest)
    arrays = _destinations(meta, entries, layout, into, where)
    zeros, reads = _jobs(chunks, entries, names, layout, arrays, store_format)
    if local is None:  # every read in flight at once; tensorstore overlaps them
      pending = [kv.read(chunk.path) for chunk, _, _ in reads]
      jobs = [
        lambda r=r, p=p: _take_value(where, *r, p, store_format) for r, p in zip(reads, pending)
      ]
    else:  # on `file`, straight from each file into its place: one copy
      jobs = [lambda r=r: _read_file(where, local, *r, store_format) for r in reads]
    jobs = [lambda z=z: z.fill(0) for z in zeros] + jobs  # a page's zeros before its arrays
    after = {} if on_verified is None else _reports(reads, len(zeros), layout, on_verified)
    threads = -(-sum(out.size for _, _, out in reads) // BYTES_PER_THREAD)
    store_chunks.map_threads(lambda job: job(), jobs, after=after, threads=threads)
  except FileNotFoundError as e:
    raise _Vanished() from e
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


def _listing(kv: ts.KvStore, where: str, local: str | None, listed: Any = None) -> set[str]:
  """The block's files, '/'-separated and relative; MissingBlockError if none. `listed`:
  a `kv.list()` already issued, or None."""
  if local is None:
    listed = kv.list() if listed is None else listed
    files = {name.decode('utf-8', 'replace') for name in store_kvstore.result(listed)}
    if not files:
      raise store_errors.MissingBlockError(where, 'no such block')
    if store_manifest.MANIFEST not in files:  # the commit point: a deposit not (yet) made
      raise store_errors.MissingBlockError(
        where,
        f'no such block (a payload without {store_manifest.MANIFEST}: a deposit that'
        ' did not finish, or a deletion that did not)',
      )
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


def _small_file(
  kv: ts.KvStore, local: str | None, name: str, ahead: dict[str, Any] | None = None
) -> bytes:
  """The bytes of file `name` of the block: straight from `local` on `file` (a kvstore
  read of a small file costs several times more), else from `kv`: the read `ahead` holds
  for it if any, else a new one."""
  if local is None:
    read = (ahead or {}).pop(name, None)
    return store_kvstore.read_value(kv, name) if read is None else store_kvstore.value(read, name)
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
    digest = store_manifest.new_hash(store_format)
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
) -> str:
  """Copies a kvstore value just read into `out` ([size] uint8), hashing each piece as copied.

  Returns:
    The chunk's digest hex (the hash of `store_format`), which is `expected`.
  """
  data = np.frombuffer(store_kvstore.value(read, chunk.path), np.uint8)
  if data.size != out.size:
    raise _wrong_size(where, chunk, data.size, out.size, expected)
  digest = store_manifest.new_hash(store_format)
  for offset in range(0, out.size, PIECE):
    piece = data[offset : offset + PIECE]
    digest.update(piece)
    out[offset : offset + piece.size] = piece
  return _checked(where, chunk, expected, digest.hexdigest())


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
      raise store_errors.Malformed(f'not a JSON object: {store_errors.short(found)}')
  except store_errors.Malformed as e:
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
