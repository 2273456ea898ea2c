"""The model's numerics-relevant ops, each by the implementation its config names.

'xla' uses jnp/XLA (fast to compile, but a row's bits depend on how many
rows a call has). 'pallas' uses the chunk-invariant kernels of
`graftjax.kernels`: fixed tiles, ascending reductions, no split-K, so a
token's bits do not depend on its chunk, its batch, or whether the keys
before it were computed in the same call or grafted. On a CPU backend the
kernels run in the Pallas interpreter. The implementations are registered
by name in `kernels/registry.py` (attention also has 'xla_split'), the matmul's
tiles and its decode kernel are chosen in `kernels/matmul_tiles.py`; the
'xla' side of each op is the pure-jnp reference beside its kernel
(`rms_norm_reference`, `apply_rotary_float32_reference`, `attention_reference`).
"""

from __future__ import annotations

import jax

from graftjax.kernels import matmul_tiles
from graftjax.kernels import registry

# Under 'pallas' the cache capacity must be a multiple of this: a multiple of
# every dtype's KV tile (`attention.default_block_sizes`).
CAPACITY_MULTIPLE = 64
# The decode matmul variant per dtype (graftjax/studies/bench_model.py records it).
matmul_decode_variant = matmul_tiles.matmul_decode_variant


def dense(x: jax.Array, w: jax.Array, *, impl: str, precision: str) -> jax.Array:
  """Contracts x [..., D] with w [D, *out] -> [..., *out] at `precision` (`dots.NAMES`)."""
  return registry.get('matmul', impl).fn(x, w, precision=precision)


def unembed(x: jax.Array, table: jax.Array, *, impl: str, precision: str) -> jax.Array:
  """x [..., D] against the tied table [V, D] -> [..., V]: `dense(x, table.T)`,
  except that the decode matmul reads the table as stored (no transposed copy)."""
  return registry.get('matmul', impl).fn(x, table, precision=precision, w_layout='nk')


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, *, impl: str) -> jax.Array:
  """x [..., D] / rms(x) * weight [D] (Gemma's +1 included), float32 inside."""
  return registry.get('norm', impl).fn(x, weight, eps=eps)


def rotate(
  x: jax.Array,
  positions: jax.Array,
  theta: float,
  *,
  impl: str,
  scale: float = 1.0,
  fraction: float = 1.0,
) -> jax.Array:
  """Absolute rotary (float32 angles) of x [B, T, N, H], positions divided by `scale`,
  `fraction` of the pairs rotating."""
  return registry.get('rotary', impl).fn(x, positions, theta=theta, scale=scale, fraction=fraction)
