"""The model's numerics-relevant ops, by implementation: 'xla' or 'pallas'.

'xla' uses jnp/XLA (fast to compile, but a row's bits depend on how many
rows a call has). 'pallas' uses the chunk-invariant kernels of
`graftjax.kernels`: fixed tiles, ascending reductions, no split-K, so a
token's bits do not depend on its chunk, its batch, or whether the keys
before it were computed in the same call or grafted. On a CPU backend the
kernels run in the Pallas interpreter.

Tile sizes are fixed per weight shape (never per call), since they decide
the order of float32 sums. The 'xla' side of each op is the pure-jnp
reference beside its kernel (`rms_norm_reference`, `apply_rotary_reference`,
`attention_reference`).
"""

from __future__ import annotations

import math

import jax

from graftjax.kernels import rmsnorm
from graftjax.models.gemma import layers

_MATMUL_BLOCK_N = 64
_MATMUL_BLOCK_K = 32
# Under 'pallas' the cache capacity must be a multiple of this: a multiple of
# every dtype's KV tile (`attention.default_block_sizes`).
CAPACITY_MULTIPLE = 64


def _interpret() -> bool:
  return jax.default_backend() != 'gpu'


def _largest_divisor(n: int, limit: int) -> int:
  return math.gcd(n, limit) if n % limit else limit


def dense(x: jax.Array, w: jax.Array, *, impl: str) -> jax.Array:
  """Contracts x [..., D] with w [D, *out] -> [..., *out]."""
  if impl == 'xla':
    letters = 'abcdefgh'[: w.ndim - 1]
    return layers.einsum(f'...D,D{letters}->...{letters}', x, w)
  from graftjax.kernels import matmul  # pylint: disable=g-import-not-at-top

  d, out_shape = w.shape[0], w.shape[1:]
  n = math.prod(out_shape)
  rows = x.reshape(-1, d)
  y = matmul.matmul(
    rows,
    w.reshape(d, n),
    block_n=_largest_divisor(n, _MATMUL_BLOCK_N),
    block_k=_largest_divisor(d, _MATMUL_BLOCK_K),
    interpret=_interpret(),
  )
  return y.reshape(x.shape[:-1] + out_shape)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, *, impl: str) -> jax.Array:
  """x [..., D] / rms(x) * weight [D] (Gemma's +1 included), float32 inside."""
  if impl == 'xla':
    return rmsnorm.rms_norm_reference(x, weight, eps=eps)
  return rmsnorm.rms_norm(x, weight, eps=eps, interpret=_interpret())


def rotate(x: jax.Array, positions: jax.Array, theta: float, *, impl: str) -> jax.Array:
  """Absolute rotary (float32 angles) of x [B, T, N, H]."""
  from graftjax.models.gemma import positions as positions_lib  # pylint: disable=g-import-not-at-top

  if impl == 'xla':
    return positions_lib.rotate_for_cache(
      x, positions, scheme=positions_lib.Scheme.ROPE, theta=theta
    )
  from graftjax.kernels import rotary  # pylint: disable=g-import-not-at-top

  return rotary.apply_rotary(x, positions, theta=theta, interpret=_interpret())


def attention(
  q,
  k,
  v,
  q_positions,
  k_positions,
  window,
  *,
  q_segments=None,
  k_segments=None,
  alibi_slopes=None,
  relative_table=None,
):
  """The Pallas attention kernel: q [B, T, N, H], k/v [B, S, K, H] -> [B, T, N, H].

  Optional: segments q [B, T] / k [B, S], ALiBi slopes [N], and for
  un-rotated q/k the (cos, sin) [D, H/2] distance table (see the kernel).
  """
  from graftjax.kernels import attention as attention_kernel  # pylint: disable=g-import-not-at-top

  return attention_kernel.attention(
    q,
    k,
    v,
    q_positions,
    k_positions,
    q_segments=q_segments,
    k_segments=k_segments,
    alibi_slopes=alibi_slopes,
    relative_table=relative_table,
    window=window,
    interpret=_interpret(),
  )
