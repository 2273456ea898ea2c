"""The combine kernel: sums one query block's split partials in a fixed order."""

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
  tree: bool,
):
  """Sums the splits of one query block in a fixed order, then normalises.

  With M the largest maximum among the splits a row saw (exact in any
  order, so taken over all Cp splits in one reduction), out = sum_c w_c o_c
  / sum_c w_c l_c, w_c = exp(m_c - M), summed one split after the other from
  the first. Splits a row did not see (out of the block's tile range, or
  l_c = 0; their partials may be unwritten) contribute an exact 0, so the sum
  is the same sequence of additions whichever superset of splits is walked.
  `unroll` splits per loop step (loads issued together) and the Hc columns
  per program change no bit.

  With `tree`, each step's `unroll` splits (an aligned group) are first
  summed pairwise, split c with c + unroll/2 and so on, and the group sums
  then one after the other. Absent splits are exact 0s in fixed places, so a
  row's bits still depend only on the row, but on `unroll` too: it is fixed
  like the block sizes.
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
    terms = []  # (o term [R, Hc], l term [R]) per split of the step
    for u in range(unroll):
      split = step * unroll + u
      seen = live(split, l_ref[split])  # [R]
      w = jnp.exp(jnp.where(seen, m_ref[split] - m_max, 0.0))
      o_term = jnp.where(seen[:, None], w[:, None] * o_ref[split], 0.0)
      terms.append((o_term, jnp.where(seen, w * l_ref[split], 0.0)))
    if tree:
      terms = [_pairwise_sum(terms)]
    o, l = carry
    for o_term, l_term in terms:
      o, l = o + o_term, l + l_term
    return o, l

  steps = (first // unroll, pl.cdiv(last, unroll))
  o, l = lax.fori_loop(
    *steps, sum_step, (jnp.zeros((rows, head_dim), jnp.float32), jnp.zeros((rows,), jnp.float32))
  )
  has_keys = l > 0.0
  out = jnp.where(has_keys[:, None], o / jnp.where(has_keys, l, 1.0)[:, None], 0.0)
  out_ref[...] = out.astype(out_ref.dtype)


def _pairwise_sum(terms: list) -> tuple:
  """The sum of a power-of-2 list of (o, l) pairs, element c with c + n/2 first."""
  while len(terms) > 1:
    half = len(terms) // 2
    terms = [(o_a + o_b, l_a + l_b) for (o_a, l_a), (o_b, l_b) in zip(terms[:half], terms[half:])]
  return terms[0]
