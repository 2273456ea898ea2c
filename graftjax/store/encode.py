"""A KVBlock (or a page of it) as the files of a stored block, refused unless exact."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from graftjax import blocks
from graftjax.store import chunks as store_chunks
from graftjax.store import errors as store_errors
from graftjax.store import manifest as store_manifest
from graftjax.store import pages as store_pages
from graftjax.store import values as store_values

_T = TypeVar('_T')


def block_files(
  block: blocks.KVBlock,
  root: str,
  page_layout: Sequence[Sequence[int]] | None = None,
  store_format: str = store_manifest.FORMAT,
  data: str | None = None,
) -> tuple[dict[str, bytes], dict[str, Any]]:
  """The block's (or page's) files (relative path -> bytes) and its manifest in
  `store_format` (an older one only to compare with a stored block), checked. In
  `PREFIXED_FORMAT` the manifest names `data`, the payload's prefix; the payload's paths
  here are relative to that prefix, manifest.json's to the block.

  Raises:
    InvalidBlockError: naming the first thing that cannot be stored exactly.
  """
  try:
    meta = block.meta
    if not isinstance(meta, blocks.BlockMeta):
      raise store_errors.MalformedError(f'meta is a {type(meta).__name__}, not a BlockMeta')
    meta_json = store_manifest.meta_json(meta)
    store_manifest.check_meta(meta_json)  # before key_for, which would narrow what it hashes
    if not meta.token_ids:
      raise store_errors.MalformedError('cannot store an empty block')
    names = ('k', 'v', 'k_tail', 'v_tail') if block.k_tail is not None else ('k', 'v')  # r > 0
    arrays = {name: _little_endian(getattr(block, name), name) for name in names}
    arrays['positions'] = _int32_positions(block.positions)
    _check_rows(arrays, meta)
    blocks.check_positions(arrays['positions'], meta)
    layout = None
    if page_layout is not None and meta.tail_layers:
      raise store_errors.MalformedError(
        f'a block with tail layers {list(meta.tail_layers)} holds only the rows it keeps;'
        ' it takes no page_layout (only a block that holds every row of every layer does)'
      )
    if page_layout is not None:
      layout = store_pages.checked_layout(page_layout, arrays['k'].shape[0], len(meta.token_ids))
      arrays = store_pages.page_arrays(arrays, layout)
    nonfinite = store_values.first_nonfinite(arrays)
    if nonfinite is not None:
      raise store_errors.MalformedError(
        f'{nonfinite}: a block holds finite keys and values only (a NaN or infinity in any'
        ' row turns every logit that attends to the block NaN)'
      )
    key = store_manifest.key_for(meta, layout)
    names = [name for name in store_manifest.PAGE_ARRAY_NAMES if name in arrays]
    separator = store_manifest.chunk_separator(store_format)
    chunks = {
      name: store_chunks.chunks(name, a.dtype.name, a.shape, separator=separator)
      for name, a in arrays.items()
    }
    payload = store_chunks.map_threads(
      lambda c: store_chunks.flat_bytes(arrays[c.name])[c.start : c.stop].tobytes(),
      [c for name in names for c in chunks[name]],
    )
    manifest = _manifest(key, meta_json, arrays, chunks, payload, layout, store_format, data)
    store_manifest.check_manifest(manifest)
  except (store_errors.MalformedError, blocks.GraftError) as e:
    raise store_errors.InvalidBlockError(root, f'cannot store the block: {e}') from e
  files = {c.path: b for c, b in zip((c for n in names for c in chunks[n]), payload)}
  for name, array in arrays.items():
    files[f'{name}/zarr.json'] = store_chunks.zarr_json(
      name, array.dtype.name, array.shape, separator=separator
    )
  files[store_manifest.MANIFEST] = manifest_bytes(manifest)
  return files, manifest


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
  """manifest.json's bytes: ASCII JSON, sorted keys, an indent of 2, a final newline."""
  text = json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=True) + '\n'
  return text.encode('ascii')


def _manifest(
  key: str,
  meta_json: dict[str, Any],
  arrays: dict[str, np.ndarray],
  chunks: dict[str, list[store_chunks.Chunk]],
  payload: Sequence[bytes],
  layout: store_pages.Layout | None,
  store_format: str,
  data: str | None,
) -> dict[str, Any]:
  """The manifest in `store_format` of arrays whose chunk files are `payload` (hashed here),
  its payload under prefix `data` if given."""

  def digest(data: bytes) -> str:
    hasher = store_manifest.new_hash(store_format)
    hasher.update(data)
    return hasher.hexdigest()

  digests = store_chunks.map_threads(digest, payload)
  return store_manifest.build_manifest(
    key,
    meta_json,
    arrays,
    _by_array(chunks, digests),
    layout,
    store_format=store_format,
    data=data,
  )


def _by_array(
  chunks: dict[str, list[store_chunks.Chunk]], values: Sequence[_T]
) -> dict[str, list[_T]]:
  """`values`, one per chunk in PAGE_ARRAY_NAMES order, grouped by array."""
  out, rest = {}, iter(values)
  for name in store_manifest.PAGE_ARRAY_NAMES:
    if name in chunks:
      out[name] = [next(rest) for _ in chunks[name]]
  return out


def _check_rows(arrays: dict[str, np.ndarray], meta: blocks.BlockMeta) -> None:
  """Raises MalformedError unless k, v hold [L, n, K, H], one row per token id of `meta`, and
  k_tail, v_tail (exactly where `meta` names tail layers) [Lt, r, Kt, Ht], its tail's rows."""
  n = len(meta.token_ids)
  expected = {'k': ('L', n), 'v': ('L', n)}
  if meta.tail_rows or 'k_tail' in arrays:
    expected.update(
      {name: (len(meta.tail_layers), meta.tail_rows) for name in ('k_tail', 'v_tail')}
    )
  for name, (layers, rows) in expected.items():
    shape = arrays[name].shape if name in arrays else None
    if shape is None or len(shape) != 4 or shape[1] != rows or layers not in ('L', shape[0]):
      raise store_errors.MalformedError(
        f'{name} is {None if shape is None else list(shape)}: expected [{layers}, {rows}, K, H],'
        ' one row per token id of its metadata (the last tail_rows of a tail layer)'
      )
  for a, b in (('k', 'v'), ('k_tail', 'v_tail')):
    if a in arrays and arrays[a].shape != arrays[b].shape:
      raise store_errors.MalformedError(
        f'{a} {list(arrays[a].shape)} != {b} {list(arrays[b].shape)}'
      )


def _little_endian(array: Any, name: str) -> np.ndarray:
  array = np.asarray(array)
  if array.dtype.name not in store_manifest.KV_DTYPES:
    raise store_errors.MalformedError(
      f'cannot store array {name!r} of dtype {array.dtype.name!r}; only {store_manifest.KV_DTYPES}'
    )
  return np.ascontiguousarray(array, array.dtype.newbyteorder('<'))


def _int32_positions(positions: Any) -> np.ndarray:
  """`positions` as int32, refused unless every value is exactly an int32."""
  positions = np.asarray(positions)
  kind = positions.dtype.kind
  if kind not in 'iuf' or positions.ndim != 1:
    raise store_errors.MalformedError(
      f'positions must be a 1-D integer array, got {positions.dtype}{positions.shape}'
    )
  if positions.size:
    if kind == 'f':
      exact = np.isfinite(positions) & (positions == np.round(positions))
      if not exact.all():
        bad = int(np.argmin(exact))
        raise store_errors.MalformedError(f'position {bad} is {positions[bad]!r}, not an integer')
    low, high = positions.min(), positions.max()
    if low < store_chunks.INT32[0] or high > store_chunks.INT32[1]:
      bad = int(
        np.argmax((positions < store_chunks.INT32[0]) | (positions > store_chunks.INT32[1]))
      )
      raise store_errors.MalformedError(f'position {bad} is {positions[bad]!r}, outside int32')
  return np.ascontiguousarray(positions, np.dtype('<i4'))
