"""The combine kernel: sums one query block's split partials in a fixed order."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt


def combine_kernel(
  tiles_ref,  # [2] int32: the query block may see KV tiles [lo, hi)
  m_ref,  # [Cp, R] float32 split maxima (Cp: C splits padded, see `attention`)
  l_ref,  # [Cp, R] float32 split sums
  o_ref,  # [Cp, R, Hc] float32 unnormalised split outputs, Hc head dims
  out_ref,  # [R, Hc]
  *,
  tiles_per_split: int,
  group: int,
):
  """Sums the splits of one query block in a fixed order, then normalises.

  With M the largest maximum among the splits a row saw (exact in any
  order, so taken over all Cp splits in one reduction), out = sum_c w_c o_c
  / sum_c w_c l_c, w_c = exp(m_c - M). The splits are summed in aligned
  groups of `group`: each group is one [group, R, Hc] load reduced by one
  `sum` (the compiler's fixed order for that shape), and the group sums are
  added one after the other from the first; group 1 is the plain ascending
  sum. Splits a row did not see (out of the block's tile range, not read; or
  l_c = 0) are exact 0s in fixed places, so a row's bits depend on the row,
  `group`, Hc and the warps, not on which superset of groups is walked.
  """
  rows, head_dim = out_ref.shape
  lo, hi = tiles_ref[0], tiles_ref[1]
  first = lo // tiles_per_split
  last = jnp.where(lo < hi, pl.cdiv(hi, tiles_per_split), first)

  def in_range(split):
    return (split >= first) & (split < last)

  def live(split, l):
    return in_range(split) & (l > 0.0)

  splits = lax.broadcasted_iota(jnp.int32, l_ref.shape, 0)  # [Cp, R]
  m_max = jnp.max(jnp.where(live(splits, l_ref[...]), m_ref[...], -jnp.inf), axis=0)  # [R]

  def sum_group(step, carry):
    part = pl.ds(pl.multiple_of(step * group, group), group)
    split = step * group + lax.broadcasted_iota(jnp.int32, (group, rows), 0)  # [U, R]
    l_part = l_ref[part]
    seen = live(split, l_part)
    w = jnp.exp(jnp.where(seen, m_ref[part] - m_max[None, :], 0.0))
    # Splits out of the block's range are never written: their lanes load 0.
    o_part = plt.load(
      o_ref.at[part],
      mask=jnp.broadcast_to(in_range(split)[:, :, None], (group, rows, head_dim)),
      other=0.0,
    )
    o_terms = jnp.where(seen[:, :, None], w[:, :, None] * o_part, 0.0)  # [U, R, Hc]
    o, l = carry
    return o + jnp.sum(o_terms, axis=0), l + jnp.sum(jnp.where(seen, w * l_part, 0.0), axis=0)

  zeros = (jnp.zeros((rows, head_dim), jnp.float32), jnp.zeros((rows,), jnp.float32))
  o, l = lax.fori_loop(first // group, pl.cdiv(last, group), sum_group, zeros)
  has_keys = l > 0.0
  out = jnp.where(has_keys[:, None], o / jnp.where(has_keys, l, 1.0)[:, None], 0.0)
  out_ref[...] = out.astype(out_ref.dtype)
