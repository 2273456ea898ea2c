"""The split kernel: a partial online softmax of one query block over one split of S.

Also `tile_ranges`, the KV tiles each query block walks (a superset of those
its rows see). See docs/kernels.md for why the bits depend on nothing else.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from graftjax.kernels import dots
from graftjax.kernels.attention_reference import visible


def relative_scores_tile(
  q_ref, k_ref, slots, distance, cos_ref, sin_ref, *, block_h: int
) -> jax.Array:
  """[R, block_k] float32 rotary scores of un-rotated q and k from distances.

  Args:
    q_ref: [R, H] queries.
    k_ref: [S, H] keys; `slots` selects the tile.
    slots: the tile's slot range.
    distance: [R, block_k] int32 q_pos - k_pos.
    cos_ref, sin_ref: [D, H/2] float32, indexed by distance.
    block_h: head-dim pairs per step.
  """
  rows, head_dim = q_ref.shape
  half = head_dim // 2
  index = jnp.clip(distance, 0, cos_ref.shape[0] - 1)

  def step(c, s):
    first = pl.ds(pl.multiple_of(c * block_h, block_h), block_h)
    second = pl.ds(pl.multiple_of(half + c * block_h, block_h), block_h)
    q1 = q_ref[:, first].astype(jnp.float32)[:, None, :]  # [R, 1, block_h]
    q2 = q_ref[:, second].astype(jnp.float32)[:, None, :]
    k1 = k_ref[slots, first].astype(jnp.float32)[None]  # [1, block_k, block_h]
    k2 = k_ref[slots, second].astype(jnp.float32)[None]
    a = q1 * k1 + q2 * k2  # [R, block_k, block_h]
    b = q1 * k2 - q2 * k1
    terms = a * cos_ref[index, first] + b * sin_ref[index, first]
    return s + jnp.sum(terms, axis=2)

  return lax.fori_loop(0, half // block_h, step, jnp.zeros((rows, index.shape[1]), jnp.float32))


def split_kernel(
  q_ref,  # [R, H], R = block_q * G query rows
  q_pos_ref,  # [R] int32
  q_seg_ref,  # [R] int32, or None
  bias_ref,  # [G * D] float32 distance bias of this kv head's G query heads, or None
  k_ref,  # [S, H]
  v_ref,  # [S, H]
  k_pos_ref,  # [S] int32
  k_seg_ref,  # [S] int32, or None
  table_refs,  # (cos, sin) [D, H/2] float32, or None
  tiles_ref,  # [2] int32: the query block may see KV tiles [lo, hi)
  m_ref,  # [R] float32 out: running max of the split
  l_ref,  # [R] float32 out: sum of exp(s - m) of the split
  o_ref,  # [R, H] float32 out: unnormalised output of the split
  *,
  block_k: int,
  block_h: int,
  tiles_per_split: int,
  window: int | None,
  group: int,
  precision: dots.Precision,
):
  """Online softmax of one query block over the tiles of one split."""
  rows, head_dim = q_ref.shape
  split = pl.program_id(3)
  q = q_ref[...] if table_refs is None else None
  lo = jnp.maximum(tiles_ref[0], split * tiles_per_split)
  hi = jnp.minimum(tiles_ref[1], (split + 1) * tiles_per_split)
  q_pos = q_pos_ref[...]
  q_seg = None if q_seg_ref is None else q_seg_ref[...][:, None]
  bias_base = bias_last = None
  if bias_ref is not None:  # row r is head r % G: its table starts at (r % G) * D
    bias_last = bias_ref.shape[0] // group - 1
    bias_base = (lax.broadcasted_iota(jnp.int32, (rows, 1), 0) % group) * (bias_last + 1)

  def body(tile, carry):
    """One online-softmax step; rows that see nothing in the tile keep carry."""
    o, m, l = carry
    slots = pl.ds(pl.multiple_of(tile * block_k, block_k), block_k)
    k_pos = k_pos_ref[slots]
    k_seg = None if k_seg_ref is None else k_seg_ref[slots][None, :]
    mask = visible(q_pos[:, None], k_pos[None, :], window, q_seg, k_seg)
    distance = q_pos[:, None] - k_pos[None, :]  # [R, block_k] int32
    if table_refs is None:
      s = dots.dot_general(q, k_ref[slots, :], (((1,), (1,)), ((), ())), precision)  # [R, block_k]
    else:
      s = relative_scores_tile(q_ref, k_ref, slots, distance, *table_refs, block_h=block_h)
    if bias_ref is not None:
      s = s + bias_ref[bias_base + jnp.clip(distance, 0, bias_last)]
    s = jnp.where(mask, s, -jnp.inf)
    v = v_ref[slots, :]
    row_live = jnp.max(mask.astype(jnp.int32), axis=1) > 0  # [R]
    m_next = jnp.maximum(m, jnp.max(s, axis=1))  # == m where not live
    # exp(-inf - finite) = 0 on a row's first live tile; hidden slots get an
    # exact 0 whatever their (finite or not) logits.
    alpha = jnp.exp(m - m_next)
    p = jnp.where(mask, jnp.exp(s - m_next[:, None]), 0.0)
    pv = dots.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision)  # [R, H]
    l_next = jnp.where(row_live, alpha * l + jnp.sum(p, axis=1), l)
    o_next = jnp.where(row_live[:, None], alpha[:, None] * o + pv, o)
    return o_next, m_next, l_next

  # Splits outside [lo, hi) write nothing: the sum never counts them.
  @pl.when(lo < hi)
  def _():
    o = jnp.zeros((rows, head_dim), jnp.float32)
    m = jnp.full((rows,), -jnp.inf, jnp.float32)
    l = jnp.zeros((rows,), jnp.float32)
    o, m, l = lax.fori_loop(lo, hi, body, (o, m, l))
    m_ref[...] = m
    l_ref[...] = l
    o_ref[...] = o


def tile_ranges(
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  window: int | None,
  block_q: int,
  block_k: int,
) -> jax.Array:
  """[B, T / block_q, 2] int32: the KV tiles [lo, hi) each query block visits.

  A superset of the tiles any row of the block can see (bounds from the
  blocks' and tiles' min/max positions), so visiting it is exact: tiles in
  [lo, hi) that a row cannot see are exact no-ops for that row, and tiles
  outside it are invisible to every row of the block. (B, T) must already be
  padded to a multiple of block_q; S to a multiple of block_k.
  """
  batch, num_q = q_positions.shape
  big = jnp.iinfo(jnp.int32).max
  qb = q_positions.reshape(batch, num_q // block_q, block_q)
  q_max = jnp.max(qb, axis=-1)  # -1 if the block is all padding
  q_min = jnp.min(jnp.where(qb >= 0, qb, big), axis=-1)
  kb = k_positions.reshape(batch, -1, block_k)
  k_any = jnp.any(kb >= 0, axis=-1)
  k_min = jnp.min(jnp.where(kb >= 0, kb, big), axis=-1)
  k_max = jnp.max(kb, axis=-1)
  maybe = k_any[:, None, :] & (q_max[:, :, None] >= 0)
  maybe &= k_min[:, None, :] <= q_max[:, :, None]
  if window is not None:
    maybe &= k_max[:, None, :] > q_min[:, :, None] - window
  num_tiles = kb.shape[1]
  tiles = jnp.arange(num_tiles, dtype=jnp.int32)
  lo = jnp.min(jnp.where(maybe, tiles, num_tiles), axis=-1)
  hi = jnp.max(jnp.where(maybe, tiles + 1, 0), axis=-1)
  lo = jnp.minimum(lo, hi)  # an empty range is [hi, hi)
  return jnp.stack([lo, hi], axis=-1).astype(jnp.int32)
