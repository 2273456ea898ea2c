"""Elementwise and dense building blocks of the Gemma 3 decoder.

Every matrix product states its precision: float32 products are computed
at HIGHEST precision, so a GPU never silently falls back to TF32. The ops
with a kernel (norm, rotary, attention) have their one pure-jnp reference in
`graftjax.kernels`, reached through `ops.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PRECISION = jax.lax.Precision.HIGHEST


def einsum(spec: str, *operands: jax.Array) -> jax.Array:
  """`jnp.einsum` at explicit HIGHEST precision."""
  return jnp.einsum(spec, *operands, precision=PRECISION)


def embed(table: jax.Array, tokens: jax.Array, embed_dim: int) -> jax.Array:
  """Looks up tokens [B, T] in table [V, D], scaled by sqrt(D) -> [B, T, D]."""
  x = jnp.take(table, tokens, axis=0)
  return x * jnp.sqrt(jnp.float32(embed_dim)).astype(x.dtype)


def gelu_gate(gate: jax.Array, up: jax.Array) -> jax.Array:
  """gelu_tanh(gate) * up, elementwise."""
  return jax.nn.gelu(gate, approximate=True) * up
