"""Elementwise building blocks of the Gemma 3 decoder.

The ops with a kernel (matmul, norm, rotary, attention) are reached through
`ops.py`, which calls the implementation the config names
(`kernels/registry.py`); every matrix product there states its precision
(`GemmaConfig.dot_precision`), so a GPU never silently falls back to TF32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def embed(table: jax.Array, tokens: jax.Array, embed_dim: int) -> jax.Array:
  """Looks up tokens [B, T] in table [V, D], scaled by sqrt(D) -> [B, T, D]."""
  x = jnp.take(table, tokens, axis=0)
  return x * jnp.sqrt(jnp.float32(embed_dim)).astype(x.dtype)


def gelu_gate(gate: jax.Array, up: jax.Array) -> jax.Array:
  """gelu_tanh(gate) * up, elementwise."""
  return jax.nn.gelu(gate, approximate=True) * up
