"""Attention in pure jnp whose sums over cache slots are anchored at absolute splits.

The model's 'xla_split' attention. Same contract as `attention_reference`, but the
reduction over the S slots is cut the way the Pallas kernel cuts it: the cache is viewed as
C = S / block_s splits of `block_s` slots; each split's partial online softmax (its max m_c,
its sum l_c of exp(s - m_c), its unnormalised p . v o_c) is computed for all splits at once by
the same batched ops, then the splits are folded one after the other in ascending order
(`lax.scan`), a split a row sees nothing of adding an exact 0. So a row's bits depend on which
slots it sees relative to the split grid and on the shapes of the call, not on which split
holds them: a block moved by whole splits in a cache of the same shape computes the same bits.
That is what composition needs (docs/composition.md). Rows still depend on the chunk's row
count T and on S, as every XLA op here does: the block and its reference must share the cache
capacity and the prefill's chunk schedule.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from graftjax.kernels import dots
from graftjax.kernels.attention_reference import scores_and_mask

_HIGHEST = lax.Precision.HIGHEST


@functools.partial(jax.jit, static_argnames=('window', 'block_s', 'precision'))
def attention_xla_split(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  block_s: int,
  q_segments: jax.Array | None = None,
  k_segments: jax.Array | None = None,
  distance_bias: jax.Array | None = None,
  relative_table: tuple[jax.Array, jax.Array] | None = None,
  window: int | None = None,
  precision: dots.Precision = _HIGHEST,
) -> jax.Array:
  """Masked softmax attention summed split by split; the contract of `attention_reference`
  (computed in the operands' dtype, scores and softmax in float32).

  Args:
    q: [B, T, N, H] queries, scaled (and rotated unless `relative_table` is given).
    k, v: [B, S, K, H]; S is padded with empty slots to a multiple of `block_s`.
    q_positions: [B, T]; k_positions: [B, S] (-1: empty slot).
    block_s: slots per split; the unit by which a block may move and keep its bits.
    q_segments, k_segments, distance_bias, relative_table, window, precision: as
      `attention_reference`.

  Returns:
    [B, T, N, H] in q's dtype; rows that see no slot are 0.
  """
  if block_s <= 0:
    raise ValueError(f'block_s must be positive, got {block_s}')
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads = k.shape[2]
  pad = -k.shape[1] % block_s
  if pad:  # empty slots: hidden from every row
    k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (k, v))
    k_positions = jnp.pad(k_positions, ((0, 0), (0, pad)), constant_values=-1)
    if k_segments is not None:
      k_segments = jnp.pad(k_segments, ((0, 0), (0, pad)))
  splits = k.shape[1] // block_s
  scores, mask = scores_and_mask(
    q,
    k,
    q_positions,
    k_positions,
    q_segments=q_segments,
    k_segments=k_segments,
    distance_bias=distance_bias,
    relative_table=relative_table,
    window=window,
    precision=precision,
  )
  mask = jnp.broadcast_to(mask, scores.shape)
  # [B, K, G, T, S] -> [B, K, C, G, T, s]: the split axis batches every op below.
  cut = lambda x: jnp.moveaxis(x.reshape(*x.shape[:-1], splits, block_s), -2, 2)
  scores, mask = cut(scores), cut(mask)
  m = jnp.max(jnp.where(mask, scores, -jnp.inf), axis=-1)  # [B, K, C, G, T]
  p = jnp.where(mask, jnp.exp(scores - jnp.where(jnp.isfinite(m), m, 0.0)[..., None]), 0.0)
  l = jnp.sum(p, axis=-1)
  v_splits = v.reshape(batch, splits, block_s, num_kv_heads, head_dim).transpose(0, 3, 1, 2, 4)
  o = dots.dot_general(
    p.astype(v.dtype), v_splits, (((5,), (3,)), ((0, 1, 2), (0, 1, 2))), precision
  )
  # o: [B, K, C, G, T, H] float32. Fold the splits in ascending order, weighted by exp(m_c - M).
  live = l > 0.0
  top = jnp.max(jnp.where(live, m, -jnp.inf), axis=2, keepdims=True)
  w = jnp.where(live, jnp.exp(m - jnp.where(live, top, 0.0)), 0.0)
  terms_o = jnp.where(live[..., None], w[..., None] * o, 0.0)
  terms_l = jnp.where(live, w * l, 0.0)

  def fold(carry, term):
    return (carry[0] + term[0], carry[1] + term[1]), None

  zeros = (jnp.zeros_like(terms_o[:, :, 0]), jnp.zeros_like(terms_l[:, :, 0]))
  (o, l), _ = lax.scan(fold, zeros, (jnp.moveaxis(terms_o, 2, 0), jnp.moveaxis(terms_l, 2, 0)))
  seen = l > 0.0
  out = jnp.where(seen[..., None], o / jnp.where(seen, l, 1.0)[..., None], 0.0)  # [B, K, G, T, H]
  out = out.transpose(0, 3, 1, 2, 4).reshape(batch, num_q, num_heads, head_dim)
  return out.astype(q.dtype)
