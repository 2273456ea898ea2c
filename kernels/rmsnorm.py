"""RMS norm, one row per program: x * rsqrt(mean(x^2) + eps) * w.

`w` is the final scale (for Gemma it already includes the +1). Row-invariant
by construction: every program normalizes exactly one row with the same code,
so a row's bits depend only on that row. The row is read in `block_d`-wide
chunks (block_d is a power of 2 dividing D, so D = 640 works on Triton, which
only has power-of-2 tensors); the sum of squares is accumulated in float32
chunk by chunk in ascending order, each chunk reduced by one fixed tree.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from graftjax.kernels import _common


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the RMS norm (numerics-relevant: keep them fixed).

  Attributes:
    block_d: features per chunk; None = the largest power of 2 that divides
      D, at most `max_block_d`.
    max_block_d: cap for the automatic block_d.
  """

  block_d: int | None = None
  max_block_d: int = 1024


DEFAULT_BLOCK_SIZES = BlockSizes()


def default_block_d(features: int, max_block_d: int = 1024) -> int:
  """The largest power of 2 that divides `features`, capped at max_block_d."""
  block = features & -features
  while block > max_block_d:
    block //= 2
  return block


def _rms_norm_kernel(x_ref, w_ref, o_ref, *, eps: float, block_d: int):
  """x_ref [D], w_ref [D], o_ref [D]: one row."""
  features = x_ref.shape[0]
  chunks = [pl.ds(c * block_d, block_d) for c in range(features // block_d)]
  xs = [x_ref[chunk].astype(jnp.float32) for chunk in chunks]  # the row, read once
  sum_sq = jnp.zeros((), jnp.float32)
  for x in xs:
    sum_sq = sum_sq + jnp.sum(x * x)
  inv = lax.rsqrt(sum_sq / features + eps)
  for chunk, x in zip(chunks, xs):
    o_ref[chunk] = (x * inv * w_ref[chunk].astype(jnp.float32)).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=('eps', 'block_d', 'num_warps', 'interpret'))
def rms_norm(
  x: jax.Array,
  w: jax.Array,
  *,
  eps: float = 1e-6,
  block_d: int | None = DEFAULT_BLOCK_SIZES.block_d,
  num_warps: int = 4,
  interpret: bool = False,
) -> jax.Array:
  """RMS norm over the last axis, float32 inside, one row per program.

  Args:
    x: [..., D].
    w: [D] scale (Gemma's 1 + weight).
    eps: added to the mean square.
    block_d: chunk width, a divisor of D; None = default_block_d(D).
    num_warps: Triton only.
    interpret: run the kernel in the Pallas interpreter (CPU).

  Returns:
    [..., D] in x's dtype.
  """
  if x.ndim < 1 or w.shape != x.shape[-1:]:
    raise ValueError(f'need x [..., D] and w [D], got {x.shape} and {w.shape}')
  features = x.shape[-1]
  if block_d is None:
    block_d = default_block_d(features, DEFAULT_BLOCK_SIZES.max_block_d)
  if block_d <= 0 or features % block_d:
    raise ValueError(f'D={features} must be a multiple of {block_d=}')
  if not interpret and block_d & (block_d - 1):
    raise ValueError(f'{block_d=} must be a power of 2 for the GPU kernel')
  rows = x.reshape(-1, features)
  num_rows = rows.shape[0]
  if interpret and num_rows == 1:
    # The interpreter's grid is an XLA loop; with one program XLA inlines it
    # and fuses the body with its neighbours, which changes the bits of the
    # row's reduction. Two programs keep the loop, so one row alone matches
    # the same row among many.
    rows = jnp.pad(rows, ((0, 1), (0, 0)))
  out = pl.pallas_call(
    functools.partial(_rms_norm_kernel, eps=eps, block_d=block_d),
    grid=(rows.shape[0],),
    in_specs=[
      pl.BlockSpec((None, features), lambda i: (i, 0)),
      pl.BlockSpec((features,), lambda i: (0,)),
    ],
    out_specs=pl.BlockSpec((None, features), lambda i: (i, 0)),
    out_shape=jax.ShapeDtypeStruct(rows.shape, x.dtype),
    compiler_params=None if interpret else _common.gpu_compiler_params(num_warps),
    interpret=interpret,
    name='graftjax_rms_norm',
  )(rows, w)
  return out[:num_rows].reshape(x.shape)


@functools.partial(jax.jit, static_argnames=('eps',))
def rms_norm_reference(x: jax.Array, w: jax.Array, *, eps: float = 1e-6) -> jax.Array:
  """Pure jnp: x * rsqrt(mean(x^2) + eps) * w in float32, cast back."""
  xf = x.astype(jnp.float32)
  inv = lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return (xf * inv * w.astype(jnp.float32)).astype(x.dtype)
