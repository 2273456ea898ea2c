"""Moving blocks to other positions, and composing independent blocks.

Relocation: a block computed alone at offset 0 is moved to offset M (the
model's `relocate`: keys re-rotated under `rope`, untouched under schemes
whose keys carry no absolute position) and grafted at its own slots; the
continuation after it is compared with a fresh computation of the same
text at offset M. The graft-free control compares fresh at 0 with fresh at
M: the model's own position sensitivity, with no graft involved.

Composition: blocks A and B are each computed alone (at the slots they will
occupy, in their own attention segment), moved to their target offsets and
grafted side by side; the continuation attends to both. The reference is a
fresh block-attention computation: A in segment 1, B in segment 2 (each
sees only itself), the continuation in segment 0 (sees everything).

All arms of one comparison use one cache capacity and one chunk size, so
they run the same compiled programs on the same shapes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from graftjax import blocks
from graftjax.models import cache as cache_lib


@dataclasses.dataclass(frozen=True)
class Layout:
  """Capacity and chunking shared by every arm."""

  capacity: int
  chunk_size: int


def _continue(model, cache, ids, first_position: int, layout: Layout) -> np.ndarray:
  """Logits [T, V] of `ids` processed (segment 0) from `first_position` on."""
  logits, _ = model.prefill(
    ids, cache=cache, chunk_size=layout.chunk_size, start_position=first_position, logits='all'
  )
  return np.asarray(logits[0])


def _prefilled(
  model, ids, first_position: int, layout: Layout, *, segment: int = 0, skip: int = 0, cache=None
):
  cache = model.init_cache(capacity=layout.capacity) if cache is None else cache
  if skip:
    cache = cache_lib.reserve(cache, skip)
  _, cache = model.prefill(
    ids,
    cache=cache,
    chunk_size=layout.chunk_size,
    start_position=first_position,
    logits='none',
    segment=segment,
  )
  return cache


def _capture(model, cache, ids, start: int, chunk_size: int) -> blocks.KVBlock:
  return blocks.capture(
    cache,
    blocks.Span(start, start + len(ids)),
    token_ids=ids,
    target=model.graft_target,
    chunk_size=chunk_size,
  )


def _graft(model, cache, block, chunk_size: int) -> cache_lib.KVCache:
  return blocks.graft(
    cache, block, target=model.graft_target, allow_shifted=True, chunk_size=chunk_size
  )


def fresh_at(model, block_ids, continuation_ids, offset: int, layout: Layout) -> np.ndarray:
  """Block and continuation computed fresh with the block's first token at `offset`."""
  cache = _prefilled(model, block_ids, offset, layout)
  return _continue(model, cache, continuation_ids, offset + len(block_ids), layout)


def relocated_to(model, block_ids, continuation_ids, offset: int, layout: Layout) -> np.ndarray:
  """Block computed alone at offset 0, moved to `offset`, grafted; then continued."""
  block = _capture(model, _prefilled(model, block_ids, 0, layout), block_ids, 0, layout.chunk_size)
  moved = blocks.relocate(block, offset, model=model)
  cache = _graft(model, model.init_cache(capacity=layout.capacity), moved, layout.chunk_size)
  return _continue(model, cache, continuation_ids, offset + len(block_ids), layout)


def own_position(model, block_ids, continuation_ids, offset: int, layout: Layout) -> np.ndarray:
  """Block computed at `offset`, grafted there unchanged; then continued."""
  block = _capture(
    model, _prefilled(model, block_ids, offset, layout), block_ids, 0, layout.chunk_size
  )
  cache = _graft(model, model.init_cache(capacity=layout.capacity), block, layout.chunk_size)
  return _continue(model, cache, continuation_ids, offset + len(block_ids), layout)


def composed_fresh(model, a_ids, b_ids, continuation_ids, offsets, layout: Layout) -> np.ndarray:
  """Fresh block attention: A (segment 1) at offsets[0], B (segment 2) at offsets[1]."""
  cache = _prefilled(model, a_ids, offsets[0], layout, segment=1)
  cache = _prefilled(model, b_ids, offsets[1], layout, segment=2, cache=cache)
  return _continue(model, cache, continuation_ids, offsets[1] + len(b_ids), layout)


def composed_grafted(model, a_ids, b_ids, continuation_ids, offsets, layout: Layout) -> np.ndarray:
  """A and B each computed alone at offset 0 (at their own slots), moved, grafted together."""
  a = _capture(model, _prefilled(model, a_ids, 0, layout, segment=1), a_ids, 0, layout.chunk_size)
  b_cache = _prefilled(model, b_ids, 0, layout, segment=2, skip=len(a_ids))
  b = _capture(model, b_cache, b_ids, len(a_ids), layout.chunk_size)
  cache = model.init_cache(capacity=layout.capacity)
  cache = _graft(model, cache, blocks.relocate(a, offsets[0], model=model), layout.chunk_size)
  cache = _graft(model, cache, blocks.relocate(b, offsets[1], model=model), layout.chunk_size)
  return _continue(model, cache, continuation_ids, offsets[1] + len(b_ids), layout)
