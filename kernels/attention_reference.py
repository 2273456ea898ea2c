"""Pure-jnp attention: the kernel's yardstick and the model's `xla` path.

One copy of each piece (mask, relative-rotary scores, distance bias, masked
softmax); `attention.py` re-exports them. Not chunk-invariant on XLA: its
bits depend on T and S.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp

from graftjax.kernels import dots

_HIGHEST = lax.Precision.HIGHEST
_MASKED = -2.3819763e38  # Finite, so a row with no visible key gives 0, not NaN.


def visible(
  q_pos: jax.Array,
  k_pos: jax.Array,
  window: int | None,
  q_seg: jax.Array | None = None,
  k_seg: jax.Array | None = None,
) -> jax.Array:
  """Which keys a query sees; broadcasts query operands against key operands.

  Args:
    q_pos: int32 query positions, e.g. [..., T, 1].
    k_pos: int32 slot positions, -1 for an empty slot, e.g. [..., 1, S].
    window: sliding-window length, or None for a global layer.
    q_seg: int32 query segments shaped like q_pos, or None (no segments).
    k_seg: int32 slot segments shaped like k_pos; given iff q_seg is.

  Returns:
    bool, the broadcast shape: k_pos >= 0 & k_pos <= q_pos
    (& q_pos - k_pos < window) (& (q_seg == 0 | q_seg == k_seg)).
  """
  mask = (k_pos >= 0) & (k_pos <= q_pos)
  if window is not None:
    mask = mask & (q_pos - k_pos < window)
  if q_seg is not None:
    mask = mask & ((q_seg == 0) | (q_seg == k_seg))
  return mask


def relative_scores(
  q: jax.Array,
  k: jax.Array,
  q_positions: jax.Array,
  k_positions: jax.Array,
  relative_table: tuple[jax.Array, jax.Array],
  *,
  query_block: int = 16,
  precision: lax.Precision = _HIGHEST,
) -> jax.Array:
  """Rotary scores of un-rotated q and k from integer distances: [B, K, G, T, S] float32.

  sum_i a_i cos[d, i] + b_i sin[d, i], a = q1 k1 + q2 k2, b = q1 k2 - q2 k1,
  d = q_pos - k_pos clamped to the table's rows.

  Args:
    q: [B, T, K, G, H] un-rotated (scaled) queries.
    k: [B, S, K, H] un-rotated keys.
    q_positions: [B, T]; k_positions: [B, S].
    relative_table: (cos, sin), each [D, H/2], indexed by distance.
    query_block: queries scored per step (bounds the [T, S, H/2] temporaries).
    precision: of the einsums.
  """
  batch, num_q, kv_heads, groups, head_dim = q.shape
  cos_table, sin_table = relative_table
  pad = -num_q % query_block
  qp = jnp.pad(q.astype(jnp.float32), ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0)))
  pp = jnp.pad(q_positions, ((0, 0), (0, pad)))
  k1, k2 = jnp.split(k.astype(jnp.float32), 2, axis=-1)
  score = functools.partial(jnp.einsum, 'BTKGi,BSKi,BTSi->BKGTS', precision=precision)

  def score_block(args):
    q_blk, p_blk = args  # [B, Tb, K, G, H], [B, Tb]
    q1, q2 = jnp.split(q_blk, 2, axis=-1)
    index = jnp.clip(p_blk[:, :, None] - k_positions[:, None, :], 0, cos_table.shape[0] - 1)
    cos = jnp.take(cos_table, index, axis=0)  # [B, Tb, S, H/2]
    sin = jnp.take(sin_table, index, axis=0)
    a = score(q1, k1, cos) + score(q2, k2, cos)
    b = score(q1, k2, sin) - score(q2, k1, sin)
    return a + b

  blocks_q = qp.reshape(batch, -1, query_block, kv_heads, groups, head_dim).swapaxes(0, 1)
  blocks_p = pp.reshape(batch, -1, query_block).swapaxes(0, 1)
  scores = jax.lax.map(score_block, (blocks_q, blocks_p))  # [nb, B, K, G, Tb, S]
  scores = jnp.moveaxis(scores, 0, 3)  # [B, K, G, nb, Tb, S]
  scores = scores.reshape(batch, kv_heads, groups, -1, k.shape[1])
  return scores[:, :, :, :num_q]


def distance_bias_scores(
  q_positions: jax.Array, k_positions: jax.Array, table: jax.Array
) -> jax.Array:
  """table[n, q_pos - k_pos]: [B, N, T, S] from positions [B, T], [B, S] and table [N, D].

  Distances are clamped to [0, D - 1]; those of hidden slots are never used.
  """
  distance = q_positions[:, :, None] - k_positions[:, None, :]
  index = jnp.clip(distance, 0, table.shape[1] - 1)  # [B, T, S]
  return jnp.moveaxis(jnp.take(table, index, axis=1), 0, 1)


def masked_softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
  """Softmax over the last axis of the visible entries; hidden ones (and empty rows) get 0."""
  scores = jnp.where(mask, scores, _MASKED)
  return jnp.where(mask, jax.nn.softmax(scores, axis=-1), 0.0)


def scores_and_mask(
  q: jax.Array,
  k: jax.Array,
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  q_segments: jax.Array | None,
  k_segments: jax.Array | None,
  distance_bias: jax.Array | None,
  relative_table: tuple[jax.Array, jax.Array] | None,
  window: int | None,
  precision: dots.Precision,
) -> tuple[jax.Array, jax.Array]:
  """(scores [B, K, G, T, S] float32, mask [B, 1, 1, T, S]) of q [B, T, N, H] against
  k [B, S, K, H]: q . k (or relative), plus the distance bias, and which slots each row sees."""
  batch, num_q, num_heads, head_dim = q.shape
  num_kv_heads = k.shape[2]
  q = q.reshape(batch, num_q, num_kv_heads, num_heads // num_kv_heads, head_dim)
  if relative_table is None:
    scores = dots.einsum('BTKGH,BSKH->BKGTS', q, k, precision).astype(jnp.float32)
  else:
    scores = relative_scores(
      q, k, q_positions, k_positions, relative_table, precision=dots.plain(precision)
    )
  if distance_bias is not None:
    bias = distance_bias_scores(q_positions, k_positions, distance_bias.astype(jnp.float32))
    scores = scores + bias.reshape(batch, num_kv_heads, -1, *bias.shape[2:])
  q_seg = k_seg = None
  if q_segments is not None:
    q_seg, k_seg = q_segments[:, :, None], k_segments[:, None, :]
  mask = visible(q_positions[:, :, None], k_positions[:, None, :], window, q_seg, k_seg)
  return scores, mask[:, None, None]


@functools.partial(jax.jit, static_argnames=('window', 'precision', 'compute_dtype'))
def attention_reference(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  q_positions: jax.Array,
  k_positions: jax.Array,
  *,
  q_segments: jax.Array | None = None,
  k_segments: jax.Array | None = None,
  distance_bias: jax.Array | None = None,
  relative_table: tuple[jax.Array, jax.Array] | None = None,
  window: int | None = None,
  precision: dots.Precision = _HIGHEST,
  compute_dtype: str | None = 'float32',
) -> jax.Array:
  """Masked softmax attention; same contract as `attention.attention`.

  q, k, v are first cast to `compute_dtype` (None: kept as they are, which
  is what the model's `xla` path computes). q . k comes out in q's dtype and
  is scored in float32; the probabilities are cast to v's dtype for p . v.

  Returns:
    [B, T, N, H] in q's dtype; rows that see no slot are 0.
  """
  out_dtype = q.dtype
  if compute_dtype is not None:
    q, k, v = (x.astype(compute_dtype) for x in (q, k, v))
  batch, num_q, num_heads, head_dim = q.shape
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
  probs = masked_softmax(scores, mask)
  out = dots.einsum('BKGTS,BSKH->BTKGH', probs.astype(v.dtype), v, precision)
  return out.reshape(batch, num_q, num_heads, head_dim).astype(out_dtype)
