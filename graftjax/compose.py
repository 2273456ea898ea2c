"""Composition: stored blocks side by side in one cache, each in its own attention segment.

Exact because a block computed alone moves only by whole attention splits (the Pallas kernel's, or
the 'xla_split' attention's: sums over slots anchored at absolute slots), under rope_relative (keys
carry no position): docs/composition.md.

`compose(model, store, keys, capacity=..., page=...)` reads each block (digest-verified), places
block i at the start of a free page in segment i + 1 (it sees only itself), its positions right
after the previous block's, and grafts them; a query appended in segment 0 sees them all.
`fresh_layout` is the reference: the same texts prefilled at the same slots, positions and
segments. The two caches are byte-equal, and so are the query's logits (tests/graftjax/test_compose.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.kernels import attention as attention_kernel
from graftjax.models import cache as cache_lib

SCHEME = 'rope_relative'


class ComposeError(blocks.GraftError):
  """Blocks cannot be composed as asked; no cache was built."""


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where one block sits in the composed cache.

  Attributes:
    slot: its first slot (a page boundary).
    position: its first token's position.
    segment: its attention segment (>= 1: it sees only itself).
    length: its tokens.
    key: its store key (None for a layout planned from lengths alone).
  """

  slot: int
  position: int
  segment: int
  length: int
  key: str | None = None

  @property
  def stop(self) -> int:
    return self.slot + self.length


@dataclasses.dataclass(frozen=True)
class Layout:
  """The composed context: a cache of `capacity` slots in pages of `page`, and its blocks."""

  capacity: int
  page: int
  placements: tuple[Placement, ...]

  @property
  def length(self) -> int:
    """Slots written: the query's first slot."""
    return self.placements[-1].stop

  @property
  def next_position(self) -> int:
    """The query's first position (right after the last block's tokens)."""
    last = self.placements[-1]
    return last.position + last.length


def split_slots(model) -> int:
  """Slots per split of the model's Pallas attention (float32 256, bfloat16 512).

  A move by a multiple of it keeps every row's tiles and the order they are folded in.
  """
  group = model.config.num_heads // model.config.num_kv_heads
  return attention_kernel.default_block_sizes(model.dtype, group).block_s


def plan(
  lengths: Sequence[int],
  *,
  capacity: int,
  page: int,
  slots: Sequence[int] | None = None,
  keys: Sequence[str] | None = None,
) -> Layout:
  """Places blocks of `lengths` tokens: block i at `slots[i]` (default: the next free page).

  Positions run on from block to block (block i starts where block i - 1's tokens end), so the
  query sees the texts as if written one after another, without gaps.

  Raises:
    ComposeError: no blocks, an empty block, a capacity that is not whole pages, a slot off a
      page boundary, slots that overlap or do not ascend, or blocks that do not fit.
  """
  lengths = [int(n) for n in lengths]
  if not lengths:
    raise ComposeError('nothing to compose: no blocks')
  if min(lengths) <= 0:
    raise ComposeError(f'empty block in {lengths}')
  if page <= 0 or capacity <= 0 or capacity % page:
    raise ComposeError(f'capacity {capacity} is not a whole number of pages of {page} slots')
  if slots is None:
    slots, free = [], 0
    for n in lengths:
      slots.append(free)
      free += -(-n // page) * page
  slots = [int(s) for s in slots]
  if len(slots) != len(lengths) or (keys is not None and len(keys) != len(lengths)):
    raise ComposeError(f'{len(slots)} slots for {len(lengths)} blocks')
  placements, free, position = [], 0, 0
  for i, (slot, n) in enumerate(zip(slots, lengths)):
    if slot % page:
      raise ComposeError(f'block {i} at slot {slot}: not on a page boundary (page {page})')
    if slot < free:
      raise ComposeError(
        f'block {i} at slot {slot} overlaps the pages of block {i - 1} (free from slot {free});'
        ' slots must ascend, one block per page run'
      )
    if slot + n > capacity:
      raise ComposeError(
        f'block {i} ({n} tokens at slot {slot}) does not fit a cache of {capacity} slots'
      )
    key = None if keys is None else keys[i]
    placements.append(Placement(slot=slot, position=position, segment=i + 1, length=n, key=key))
    free = slot + -(-n // page) * page
    position += n
  return Layout(capacity=capacity, page=page, placements=tuple(placements))


def compose(
  model,
  store: store_lib.BlockStore,
  keys: Sequence[str],
  *,
  capacity: int,
  page: int | None = None,
  slots: Sequence[int] | None = None,
) -> tuple[cache_lib.KVCache, Layout]:
  """A cache holding the blocks stored under `keys`, side by side (see `plan`).

  Each block must have been captured at slot 0 (computed alone, as the flywheel library and pages
  deposit them). Every block is read, verified and checked before the cache is built
  (`check_model`, then `place`, then `install`; graftjax.paging.context uses the same three
  steps with pages read through its host-memory tier).

  Args:
    model: a `Gemma` under `rope_relative` with split-invariant attention (`check_model`).
    store: where the blocks are.
    keys: their store keys; block i goes to segment i + 1.
    capacity: slots of the composed cache.
    page: slots per page, a multiple of `split_slots(model)` (the default).
    slots: first slot of each block (page boundaries, ascending); default: next free page.

  Returns:
    (cache, layout): the cache's `length` is the last block's stop slot; append the query
    at `layout.next_position` in segment 0.

  Raises:
    ComposeError: the model's kernels or scheme cannot compose exactly, the page is not a whole
      number of splits, a block was not captured at slot 0, or `plan` refuses the layout.
    blocks.GraftError: a block of another model, scheme or dtype (`blocks.check_compatible`).
    store.StoreError: a block is missing or does not verify.
  """
  page = check_model(model, page)
  stored = [store.get(key) for key in keys]
  placed, layout = place(model, stored, capacity=capacity, page=page, slots=slots, keys=keys)
  return install(model, placed, capacity=capacity, query_position=layout.next_position), layout


def check_model(model, page: int | None = None, *, capacity: int | None = None) -> int:
  """The page size (default: one split) after checking `model` can compose exactly.

  A model whose sliding-window layers keep a ring (`with_local_cache('ring')`) composes in
  pages that are whole rings as well as whole splits (`ring_page`; `capacity` gives the ring).

  Raises:
    ComposeError: the model's attention is not split-invariant (`GraftTarget.split_invariant`:
      Pallas or 'xla_split'), the model is not under `rope_relative`, or `page` is not a whole
      number of its attention splits (and rings).
  """
  target = model.graft_target
  if not target.split_invariant:
    kernels = ', '.join(f'{op}={impl}' for op, impl in target.kernels)
    raise ComposeError(
      f'composition moves blocks to other slots, which is exact only where attention sums over'
      f' the slots in splits anchored at absolute slots (this model: {kernels}). Under plain XLA'
      ' attention a block moved by 300 slots changed 15 of 18 layers of gemma-3-270m (float32,'
      " CPU): its dots sum over the slots in blocks of the kernel library's choosing. Use"
      " model.with_impl('pallas'), or model.with_impl('xla', attention='xla_split') on CPU."
    )
  if model.position_scheme != SCHEME:
    raise ComposeError(
      f'composition needs {SCHEME!r}, whose keys carry no absolute position; this model is'
      f' {model.position_scheme!r} (re-rotated rope keys are not byte-exact)'
    )
  split = split_slots(model)
  unit = split if capacity is None else ring_page(model, capacity)
  page = unit if page is None else page
  if page <= 0 or page % split:
    raise ComposeError(
      f'page {page} is not a multiple of the attention split ({split} slots for'
      f' {jnp.dtype(model.dtype).name}): a block moved by it would fold its tiles differently'
    )
  if page % unit:
    raise ComposeError(
      f'page {page} is not a multiple of {unit} slots (the split and the ring of'
      f' {model.ring_capacity(capacity)} slots of the local layers): a block moved by it would'
      ' sit at other ring indices, where its window wraps elsewhere (docs/composition.md)'
    )
  return page


def ring_page(model, capacity: int) -> int:
  """The least page of `model`'s cache of `capacity` slots: a whole number of attention splits
  and, if its local layers keep a ring of R slots, of R (a block moved by it keeps its ring
  indices)."""
  split = split_slots(model)
  ring = model.ring_capacity(capacity)
  if ring is None or ring == capacity:
    return split
  return math.lcm(split, ring)


def check_ring_window(model, layout: Layout) -> None:
  """Raises ComposeError unless a query after `layout` finds, in a local layer's ring, every row
  its window sees (no-op without a ring).

  A block row at slot s is at ring index s mod R until a later write lands there: a later
  block's row, or a query row, written at most `max_chunk` slots ahead of the last query token
  that still sees it (a chunk is written before it attends). Without page gaps no such write
  exists (R >= W - 1 + max_chunk); across a gap it may.
  """
  ring = model.ring_capacity(layout.capacity)
  if ring is None or ring == layout.capacity:
    return
  window = model.config.sliding_window
  chunk = model.max_chunk(layout.capacity)
  first_seen = layout.next_position - (window - 1)
  for i, placement in enumerate(layout.placements):
    later = [(p.slot, p.stop) for p in layout.placements[i + 1 :]]
    for t in range(max(0, first_seen - placement.position), placement.length):
      slot, position = placement.slot + t, placement.position + t
      last_query = position - first_seen  # the last query token that sees it
      writes = [*later, (layout.length, layout.length + last_query + chunk)]
      for begin, end in writes:
        begin = max(begin, slot + 1)
        over = begin + (slot - begin) % ring  # the first slot >= begin at index slot mod R
        if over < end:
          raise ComposeError(
            f'the row of position {position} (slot {slot}) sits at ring index {slot % ring},'
            f' which slot {over} overwrites before the query has seen it (a ring of {ring}'
            f' slots, chunks of up to {chunk}): the gap before a later block breaks the ring.'
            f' Make the last block at least {window - 1} tokens (the window less one), or use'
            " local_cache='full'"
          )


def place(
  model,
  stored: Sequence[blocks.KVBlock],
  *,
  capacity: int,
  page: int | None = None,
  slots: Sequence[int] | None = None,
  keys: Sequence[str] | None = None,
) -> tuple[list[blocks.KVBlock], Layout]:
  """Blocks already read and verified, moved to their placements; no cache is built.

  Checks the model (`check_model`), that every block was captured at slot 0 (and, off the
  chunk-invariant kernels, in a cache of `capacity` slots and prefilled in chunks of one
  recorded size), the layout
  (`plan`) and every placed block against a cache of `capacity` slots
  (`blocks.check_compatible`, on shapes only), so `install` cannot refuse what this returns.

  Returns:
    (placed, layout): block i moved to `layout.placements[i]`, for `install`.
  """
  target = model.graft_target
  page = check_model(model, page, capacity=capacity)
  names = list(keys) if keys is not None else [f'#{i}' for i in range(len(stored))]
  for key, block in zip(names, stored):
    if block.meta.start != 0:
      raise ComposeError(
        f'block {key[:12]}… was captured at slot {block.meta.start}, after other slots it may'
        ' have attended to; only blocks captured at slot 0 were computed alone'
      )
    if not target.chunk_invariant and block.meta.capacity != capacity:
      kernels = ', '.join(f'{op}={impl}' for op, impl in target.kernels)
      raise ComposeError(
        f'block {key[:12]}… was computed in a cache of {block.meta.capacity} slots, this'
        f" context has {capacity}: off the chunk-invariant kernels ({kernels}) a row's bits"
        " depend on the cache's shape; compute blocks at the capacity they are composed into"
      )
  _common_chunk(target, stored, names)
  layout = plan(
    [len(b) for b in stored],
    capacity=capacity,
    page=page,
    slots=slots,
    keys=None if keys is None else list(keys),
  )
  check_ring_window(model, layout)
  shapes = jax.eval_shape(lambda: model.init_cache(capacity=capacity))
  placed = [_placed(model, b, p) for b, p in zip(stored, layout.placements)]
  for block in placed:
    blocks.check_compatible(shapes, block, target=target)
  return placed, layout


def _common_chunk(target, stored: Sequence[blocks.KVBlock], names: Sequence[str]) -> int | None:
  """The prefill chunk size every block records, off the chunk-invariant kernels (None on
  them): the composed context is `fresh_layout`'s with it. Raises ComposeError for blocks of
  several chunk sizes, or one that records none (no one reference holds for them)."""
  if target.chunk_invariant:
    return None
  chunks = {name: block.meta.chunk_size for name, block in zip(names, stored)}
  if len(set(chunks.values())) > 1 or 0 in chunks.values():
    kernels = ', '.join(f'{op}={impl}' for op, impl in target.kernels)
    found = ', '.join(f'{name[:12]}: {chunk or "none recorded"}' for name, chunk in chunks.items())
    raise ComposeError(
      f'blocks were prefilled in chunks of other sizes ({found}): off the chunk-invariant'
      f" kernels ({kernels}) a row's bits depend on its chunk; compose blocks of one chunk size"
    )
  return next(iter(chunks.values()), None)


def install(
  model, placed: Sequence[blocks.KVBlock], *, capacity: int, query_position: int | None = None
) -> cache_lib.KVCache:
  """A fresh cache of `capacity` slots with the blocks `place` returned grafted in; blocks
  that keep fewer sliding-window rows than W - 1 (pages) only for a first query at
  `query_position` far enough (`blocks.graft`)."""
  return _install(model, model.init_cache(capacity=capacity), placed, query_position)


def _placed(model, block: blocks.KVBlock, placement: Placement) -> blocks.KVBlock:
  """`block` moved to `placement`'s position (`relocate`), slot and segment.

  Exact only for a block computed alone, moved by whole splits under split-invariant attention
  and `rope_relative` (what `compose` checks first); the slot and segment are rewritten here only,
  in a block that never leaves this module.
  """
  moved = blocks.relocate(block, placement.position, model=model)
  meta = dataclasses.replace(moved.meta, start=placement.slot, segment=placement.segment)
  return moved.replace(meta=meta)


def _install(model, cache: cache_lib.KVCache, placed, query_position=None) -> cache_lib.KVCache:
  target = model.graft_target
  chunk = _common_chunk(target, placed, [f'#{i}' for i in range(len(placed))])
  for block in placed:
    cache = blocks.graft(
      cache,
      block,
      target=target,
      allow_shifted=True,
      allow_ring_gap=True,  # the layout passed `check_ring_window` (`place`)
      chunk_size=chunk,  # the one every block records: a context of blocks alone
      query_position=query_position,
      donate=True,
    )
  return cache


def fresh_layout(
  model, token_ids: Sequence[Sequence[int]], layout: Layout, *, chunk_size: int
) -> cache_lib.KVCache:
  """The reference: each block's tokens prefilled at its slots, positions and segment.

  Off the chunk-invariant kernels (e.g. attention 'xla_split' with XLA matmuls) it is the
  reference only with the `chunk_size` the blocks were prefilled with (and their capacity, which
  `place` checks): a row's bits there depend on its chunk's row count.
  """
  if len(token_ids) != len(layout.placements):
    raise ComposeError(f'{len(token_ids)} texts for {len(layout.placements)} placements')
  check_ring_window(model, layout)
  cache = model.init_cache(capacity=layout.capacity)
  for ids, p in zip(token_ids, layout.placements):
    if len(ids) != p.length:
      raise ComposeError(f'{len(ids)} tokens for a placement of {p.length}')
    cache = cache_lib.reserve(cache, p.slot - int(cache.length), allow_ring_gap=True)
    _, cache = model.prefill(
      ids,
      cache=cache,
      chunk_size=chunk_size,
      start_position=p.position,
      logits='none',
      segment=p.segment,
    )
  return cache
