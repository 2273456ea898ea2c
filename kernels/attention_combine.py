"""The combine kernel: sums one query block's split partials in ascending order."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


def combine_kernel(
  tiles_ref,  # [2] int32: the query block may see KV tiles [lo, hi)
  m_ref,  # [Cp, R] float32 split maxima (Cp: C splits padded, see `attention`)
  l_ref,  # [Cp, R] float32 split sums
  o_ref,  # [Cp, R, Hc] float32 unnormalised split outputs, Hc head dims
  out_ref,  # [R, Hc]
  *,
  tiles_per_split: int,
  unroll: int,
):
  """Sums the splits of one query block in ascending order, then normalises.

  With M the largest maximum among the splits a row saw (exact in any
  order, so taken over all Cp splits in one reduction), out = sum_c w_c o_c
  / sum_c w_c l_c, w_c = exp(m_c - M), summed one split after the other from
  the first. Splits a row did not see (out of the block's tile range, or
  l_c = 0; their partials may be unwritten) contribute an exact 0, so the sum
  is the same sequence of additions whichever superset of splits is walked.
  `unroll` splits per loop step (loads issued together) and the Hc columns
  per program change no bit.
  """
  rows, head_dim = out_ref.shape
  lo, hi = tiles_ref[0], tiles_ref[1]
  first = lo // tiles_per_split
  last = jnp.where(lo < hi, pl.cdiv(hi, tiles_per_split), first)

  def live(split, l):
    return (split >= first) & (split < last) & (l > 0.0)

  splits = lax.broadcasted_iota(jnp.int32, l_ref.shape, 0)  # [Cp, R]
  m_max = jnp.max(jnp.where(live(splits, l_ref[...]), m_ref[...], -jnp.inf), axis=0)  # [R]

  def sum_step(step, carry):
    o, l = carry
    for u in range(unroll):
      split = step * unroll + u
      seen = live(split, l_ref[split])  # [R]
      w = jnp.exp(jnp.where(seen, m_ref[split] - m_max, 0.0))
      l = l + jnp.where(seen, w * l_ref[split], 0.0)
      o = o + jnp.where(seen[:, None], w[:, None] * o_ref[split], 0.0)
    return o, l

  steps = (first // unroll, pl.cdiv(last, unroll))
  o, l = lax.fori_loop(
    *steps, sum_step, (jnp.zeros((rows, head_dim), jnp.float32), jnp.zeros((rows,), jnp.float32))
  )
  has_keys = l > 0.0
  out = jnp.where(has_keys[:, None], o / jnp.where(has_keys, l, 1.0)[:, None], 0.0)
  out_ref[...] = out.astype(out_ref.dtype)
