"""Elementwise and dense building blocks of the Gemma 3 decoder.

Every matrix product states its precision (`GemmaConfig.dot_precision`):
float32 products are IEEE float32 unless a bfloat16 split is asked for, so a
GPU never silently falls back to TF32. The ops
with a kernel (norm, rotary, attention) have their one pure-jnp reference in
`graftjax.kernels`, reached through `ops.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from graftjax.kernels import dots


def einsum(spec: str, x: jax.Array, w: jax.Array, precision: str) -> jax.Array:
  """`jnp.einsum` of two operands at an explicit precision (a name in `dots.NAMES`)."""
  return dots.einsum(spec, x, w, dots.from_name(precision))


def embed(table: jax.Array, tokens: jax.Array, embed_dim: int) -> jax.Array:
  """Looks up tokens [B, T] in table [V, D], scaled by sqrt(D) -> [B, T, D]."""
  x = jnp.take(table, tokens, axis=0)
  return x * jnp.sqrt(jnp.float32(embed_dim)).astype(x.dtype)


def gelu_gate(gate: jax.Array, up: jax.Array) -> jax.Array:
  """gelu_tanh(gate) * up, elementwise."""
  return jax.nn.gelu(gate, approximate=True) * up
