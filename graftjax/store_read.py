"""Reading a stored block back: every file checked, every byte hashed as it is read."""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any

import numpy as np
import tensorstore as ts

from graftjax import blocks
from graftjax import store_chunks
from graftjax import store_errors
from graftjax import store_files
from graftjax import store_kvstore
from graftjax import store_manifest
from graftjax import store_pages

# Bytes read, then hashed while they are still in (L2) cache, at a time.
_PIECE = 1 << 18


class _Vanished(Exception):
  """A file of a block disappeared between listing and reading it."""


def read_block(
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
      return _read_once(kv, where, key, local)
    except _Vanished:
      with store_errors.io_errors(where, 'cannot read the block'):
        if store_kvstore.result(kv.read(store_manifest.MANIFEST)).state != 'value':
          raise store_errors.MissingBlockError(
            where, 'no such block (deleted while being read)'
          ) from None
  raise store_errors.CorruptBlockError(where, 'files kept vanishing while the block was read')


def _read_once(
  kv: ts.KvStore, where: str, key: str, local: str | None
) -> tuple[dict[str, Any], blocks.KVBlock]:
  """Reads and verifies a block once (arguments as `read_block`).

  Checks, in order: the block holds exactly the expected files (regular
  files, on `file`); manifest.json passes `store_manifest.check_manifest`
  and describes `key`; each zarr.json describes the layout the manifest
  implies; each chunk has the expected size and its recorded digest (hashed
  once, as read); and the manifest is exactly what those chunk digests and
  the arrays' dtypes and shapes produce.
  """
  try:
    files = _listing(kv, where, local)
    if store_manifest.MANIFEST not in files:
      raise store_errors.CorruptBlockError(where, f'missing file {store_manifest.MANIFEST}')
    manifest, meta = store_manifest.parse_manifest(
      store_kvstore.read_value(kv, store_manifest.MANIFEST), where, key
    )
    entries = manifest['arrays']
    chunks = {
      name: store_chunks.chunks(name, entry['dtype'], entry['shape'])
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
        store_kvstore.read_value(kv, f'{name}/zarr.json'), where, name, entries[name]
      )
    recorded = [
      (chunk, digest, kv.read(chunk.path))  # all reads in flight at once
      for name in names
      for chunk, digest in zip(chunks[name], entries[name]['chunk_sha256'])
    ]
    try:
      arrays = {
        name: np.empty(entry['shape'], store_chunks.DTYPES[entry['dtype']])
        for name, entry in entries.items()
      }
    except (ValueError, MemoryError) as e:
      raise store_errors.CorruptBlockError(
        where, f'arrays of {store_manifest.MANIFEST} too large to read: {e}'
      ) from e
    found = store_chunks.map_threads(
      lambda task: _take_chunk(where, *task, store_chunks.flat_bytes(arrays[task[0].name])),
      recorded,
    )
  except FileNotFoundError as e:
    raise _Vanished() from e
  except OSError as e:
    raise store_errors.StoreIOError(where, f'cannot read the block: {e.strerror or e}') from e
  digests = {name: [] for name in names}
  for (chunk, _, _), digest in zip(recorded, found):
    digests[chunk.name].append(digest)
  layout = store_pages.layout_of(manifest)
  rebuilt = store_manifest.build_manifest(
    key, store_manifest.meta_json(meta), arrays, digests, layout
  )
  differences = store_manifest.differences(manifest, rebuilt)
  if differences:
    raise store_errors.CorruptBlockError(
      where,
      f'manifest.json disagrees with its payload (manifest != payload): {"; ".join(differences)}',
    )
  if layout is not None:
    arrays = store_pages.unpage_arrays(arrays, layout)
  try:
    block = blocks.KVBlock(meta=meta, **arrays)
  except ValueError as e:
    raise store_errors.CorruptBlockError(where, f'not a valid block: {e}') from e
  return manifest, block


def _listing(kv: ts.KvStore, where: str, local: str | None) -> set[str]:
  """The block's files, '/'-separated and relative; MissingBlockError if none."""
  if local is None:
    files = {name.decode('utf-8', 'replace') for name in store_kvstore.result(kv.list())}
    if not files:
      raise store_errors.MissingBlockError(where, 'no such block')
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


def _take_chunk(
  where: str, chunk: store_chunks.Chunk, expected: str, read: Any, array_bytes: np.ndarray
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
  data = np.frombuffer(store_kvstore.value(read, chunk.path), np.uint8)
  out = array_bytes[chunk.start : chunk.stop]
  if data.size != out.size:
    raise store_errors.CorruptBlockError(
      where, f'{chunk}: holds {data.size} bytes, expected {out.size} (sha256 expected {expected})'
    )
  digest = hashlib.sha256()
  for offset in range(0, out.size, _PIECE):
    piece = data[offset : offset + _PIECE]
    digest.update(piece)
    out[offset : offset + piece.size] = piece
  found = digest.hexdigest()
  if found != expected:
    raise store_errors.CorruptBlockError(
      where, f'{chunk}: sha256 expected {expected}, found {found}'
    )
  return found


def _check_zarr_metadata(data: bytes, where: str, name: str, entry: dict[str, Any]) -> None:
  """Raises unless `data`, `name`/zarr.json, describes the array `entry` describes."""
  relative_path = f'{name}/zarr.json'
  try:
    found = store_manifest.load_json(data)
    if not isinstance(found, dict):
      raise store_errors.Malformed(f'not a JSON object: {store_errors.short(found)}')
  except store_errors.Malformed as e:
    raise store_errors.CorruptBlockError(where, f'malformed {relative_path}: {e}') from e
  # What decides where tensorstore finds the bytes and how it decodes them;
  # other fields (attributes, dimension_names) are free.
  expected = {
    **store_chunks.zarr_metadata(name, entry['dtype'], entry['shape']),
    'storage_transformers': None,
  }
  differences = store_manifest.differences(
    {field: found.get(field) for field in expected}, expected
  )
  if differences:
    raise store_errors.CorruptBlockError(
      where,
      f'{relative_path} disagrees with {store_manifest.MANIFEST} (zarr.json != manifest):'
      f' {"; ".join(differences)}',
    )
