"""A page: a block stored with only some rows of some layers (see `BlockStore.put`).

A page layout gives one (first_row, stop_row) per layer: the layers kept
whole go to arrays k, v, the last rows of the others to k_tail, v_tail.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graftjax.store import chunks as store_chunks
from graftjax.store import errors as store_errors

Layout = tuple[tuple[int, int], ...]


def checked_layout(layout: Any, num_layers: int, n: int) -> Layout:
  """A page layout as a tuple of (first_row, stop_row) per layer; raises MalformedError.

  Each layer keeps all n rows (0, n) or the last r rows (n - r, n), one r
  for every trimmed layer, 0 <= r < n; at least one layer of each kind.
  """
  if not isinstance(layout, (list, tuple)) or len(layout) != num_layers:
    raise store_errors.MalformedError(
      f'page_layout is {store_errors.short(layout)}: expected one [first, stop] per layer'
    )
  rows = []
  for i, pair in enumerate(layout):
    if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(_is_int32(x) for x in pair)):
      raise store_errors.MalformedError(
        f'page_layout.{i} is {store_errors.short(pair)}: expected [first_row, stop_row]'
      )
    rows.append((int(pair[0]), int(pair[1])))
  trimmed = {first for first, stop in rows if (first, stop) != (0, n)}
  if any(stop != n for _, stop in rows) or len(trimmed) != 1 or not 0 < min(trimmed) <= n:
    raise store_errors.MalformedError(
      f'page_layout {store_errors.short(rows)}: each layer keeps rows [0, {n}]'
      f' or the same last r rows [{n} - r, {n}], 0 <= r < {n},'
      ' with at least one layer of each kind'
    )
  if all(first for first, _ in rows):
    raise store_errors.MalformedError(
      f'page_layout {store_errors.short(rows)} keeps no layer whole'
    )
  return tuple(rows)


def _is_int32(value: Any) -> bool:
  low, high = store_chunks.INT32
  return type(value) is int and low <= value <= high


def page_arrays(arrays: dict[str, np.ndarray], layout: Layout) -> dict[str, np.ndarray]:
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


def layout_of(manifest: dict[str, Any]) -> Layout | None:
  """The page layout a manifest records; None for a plain block."""
  layout = manifest.get('page_layout')
  return None if layout is None else tuple(tuple(pair) for pair in layout['rows'])
