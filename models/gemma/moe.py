"""Gemma 4's mixture of experts (26B-A4B): a router and E gated experts beside the dense MLP.

    h       = rms(x) * router_scale / sqrt(D)            x: the residual stream [B, T, D]
    p       = softmax(h @ router)                        [B, T, E], float32
    top     = the k largest p, ties to the lower expert index (`jax.lax.top_k`'s rule)
    w       = p[top] / sum(p[top]) * expert_scale[top]
    out     = sum over top of w_e * down_e(gelu_tanh(gate_e(y)) * up_e(y))   y = ffn_norm_2(x)

as transformers' `Gemma4TextRouter` / `Gemma4TextExperts` compute it. Every
expert runs on every token and the unselected ones are weighted 0 (E / k
times the compute of a ragged dispatch, in exchange for fixed shapes): the
down projection contracts over all E * X expert units at once. Nothing mixes
rows: the matmuls are `ops.dense` (chunk-invariant under 'pallas'), and the
two sums over experts (the softmax's and the top-k normalisation's) are
pairwise sums of fixed shape, elementwise adds only. So a token's expert
choice and output bits do not depend on its chunk or batch under 'pallas'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import layers
from graftjax.models.gemma import ops


def row_sum(x: jax.Array) -> jax.Array:
  """Sum over the last axis by pairwise halving (elementwise adds, zero padding to a power
  of two): the same bits for a row whatever the other rows. x [..., E] -> [...]."""
  size = 1 << max(0, (x.shape[-1] - 1).bit_length())
  x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])
  while x.shape[-1] > 1:
    half = x.shape[-1] // 2
    x = x[..., :half] + x[..., half:]
  return x[..., 0]


def route(
  params: dict, x: jax.Array, *, config: config_lib.GemmaConfig, impl: str, precision: str
) -> tuple[jax.Array, jax.Array]:
  """(weights [B, T, k] float32, expert ids [B, T, k] int32) of the residual stream x [B, T, D]."""
  unit = jnp.ones(x.shape[-1], x.dtype)
  h = ops.rms_norm(x, unit, config.rms_norm_eps, impl=config.impl_of('norm'))
  h = h * params['router_scale'].astype(h.dtype) * jnp.asarray(config.embed_dim**-0.5, h.dtype)
  scores = ops.dense(h, params['router'], impl=impl, precision=precision).astype(jnp.float32)
  exp = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  probs = exp / row_sum(exp)[..., None]
  top, ids = jax.lax.top_k(probs, config.top_k_experts)
  weights = top / row_sum(top)[..., None]
  return weights * params['expert_scale'].astype(jnp.float32)[ids], ids


def experts(
  params: dict,
  x: jax.Array,
  y: jax.Array,
  *,
  config: config_lib.GemmaConfig,
  impl: str,
  precision: str,
) -> jax.Array:
  """The experts' weighted sum [B, T, D]: routed by the residual stream x, run on y (both
  [B, T, D])."""
  weights, ids = route(params, x, config=config, impl=impl, precision=precision)
  # [B, T, E]: each expert's weight, 0 where not chosen. The ids of a row are distinct, so
  # each sum adds one weight to zeros: exact in any order.
  onehot = jax.nn.one_hot(ids, config.num_experts, dtype=jnp.float32)
  gates = jnp.sum(weights[..., None] * onehot, axis=-2)
  gate_up = jnp.transpose(params['experts_gate_up'], (1, 0, 2))  # [E, D, 2X] -> [D, E, 2X]
  gate, up = jnp.split(ops.dense(y, gate_up, impl=impl, precision=precision), 2, axis=-1)
  hidden = layers.gelu_gate(gate, up) * gates[..., None].astype(y.dtype)  # [B, T, E, X]
  flat = hidden.reshape(hidden.shape[:-2] + (-1,))
  down = params['experts_down'].reshape(-1, config.embed_dim)  # [E * X, D]
  return ops.dense(flat, down, impl=impl, precision=precision)
