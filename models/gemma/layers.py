"""Elementwise and dense building blocks of the Gemma 3 decoder.

Every matrix product states its precision: float32 products are computed
at HIGHEST precision, so a GPU never silently falls back to TF32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PRECISION = jax.lax.Precision.HIGHEST


def einsum(spec: str, *operands: jax.Array) -> jax.Array:
  """`jnp.einsum` at explicit HIGHEST precision."""
  return jnp.einsum(spec, *operands, precision=PRECISION)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """x / rms(x) * weight over the last axis, computed in float32.

  Args:
    x: [..., D] activations of any float dtype.
    weight: [D] scale; the GGUF weights already include Gemma's +1.
    eps: added to the mean square.
  Returns:
    [..., D] in x's dtype.
  """
  x32 = x.astype(jnp.float32)
  mean_square = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  normed = x32 * jax.lax.rsqrt(mean_square + eps)
  return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def embed(table: jax.Array, tokens: jax.Array, embed_dim: int) -> jax.Array:
  """Looks up tokens [B, T] in table [V, D], scaled by sqrt(D) -> [B, T, D]."""
  x = jnp.take(table, tokens, axis=0)
  return x * jnp.sqrt(jnp.float32(embed_dim)).astype(x.dtype)


def gelu_gate(gate: jax.Array, up: jax.Array) -> jax.Array:
  """gelu_tanh(gate) * up, elementwise."""
  return jax.nn.gelu(gate, approximate=True) * up
