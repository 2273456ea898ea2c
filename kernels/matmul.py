"""Row-invariant matmul: x [M, K] @ w [K, N] with fixed tiles.

XLA picks its matmul algorithm per shape (on CPU row 0 of [M, K] @ [K, N]
changes bits between M = 1 and M >= 2; on GPU cuBLAS/Triton choose tiles and
split-K per M), so a token's projection depends on how many tokens share the
call. This kernel fixes the arithmetic instead:

* one program per [block_m, block_n] output tile, with tile sizes the caller
  gives (the kernel never adapts them to M); M is padded up to a multiple of
  block_m with zero rows that are sliced off, so a row's bits do not depend on
  M or on the other rows;
* the contraction walks K in ascending `block_k` steps and accumulates in
  float32, with no split-K;
* the precision of each tile product is explicit (`HIGHEST`: IEEE float32 for
  float32 inputs; bfloat16 inputs multiply exactly and add in float32).

On the GPU the tiles were shown not to change the bits either (natively, at
the model's shapes), so `matmul_tiles.py` picks them per
call size there; in the interpreter `block_k` groups the sums and must stay
fixed (docs/kernels.md, "Matmul tiles are free on the GPU").
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from graftjax.kernels import _common
from graftjax.kernels import dots

_HIGHEST = lax.Precision.HIGHEST
_DIMS = (((1,), (0,)), ((), ()))  # x [M, K] . w [K, N]


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the matmul (in the interpreter block_k is numerics-relevant: keep it fixed).

  Attributes:
    block_m: rows of x per program; M is padded to a multiple.
    block_n: columns of w per program; N must be a multiple.
    block_k: contraction step; K must be a multiple.
  """

  block_m: int = 64
  block_n: int = 64
  block_k: int = 32


DEFAULT_BLOCK_SIZES = BlockSizes()


def _matmul_kernel(
  x_ref,  # [block_m, K]
  w_ref,  # [K, block_n]
  o_ref,  # [block_m, block_n]
  *,
  block_k: int,
  precision: dots.Precision,
):
  block_m, depth = x_ref.shape
  block_n = w_ref.shape[1]

  def body(step, acc):
    cols = pl.ds(pl.multiple_of(step * block_k, block_k), block_k)
    return acc + dots.dot_general(x_ref[:, cols], w_ref[cols, :], _DIMS, precision)

  acc = jnp.zeros((block_m, block_n), jnp.float32)
  acc = lax.fori_loop(0, depth // block_k, body, acc)
  o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(
  jax.jit,
  static_argnames=(
    'block_m',
    'block_n',
    'block_k',
    'precision',
    'out_dtype',
    'num_warps',
    'num_stages',
    'interpret',
  ),
)
def matmul(
  x: jax.Array,
  w: jax.Array,
  *,
  block_m: int = DEFAULT_BLOCK_SIZES.block_m,
  block_n: int = DEFAULT_BLOCK_SIZES.block_n,
  block_k: int = DEFAULT_BLOCK_SIZES.block_k,
  precision: dots.Precision = _HIGHEST,
  out_dtype: jnp.dtype | None = None,
  num_warps: int = 4,
  num_stages: int = 3,
  interpret: bool = False,
) -> jax.Array:
  """x @ w with fixed tiles, ascending K, float32 accumulation.

  Args:
    x: [M, K].
    w: [K, N], the same dtype as x.
    block_m: rows per program (M is padded to a multiple).
    block_n: columns per program (N must be a multiple).
    block_k: contraction step (K must be a multiple).
    precision: of each tile product (`dots`); HIGHEST = IEEE float32 for float32.
    out_dtype: result dtype, x's by default.
    num_warps: Triton only.
    num_stages: Triton only.
    interpret: run the kernel in the Pallas interpreter (CPU).

  Returns:
    [M, N] in out_dtype.
  """
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
    raise ValueError(f'need x [M, K] and w [K, N], got {x.shape} and {w.shape}')
  if x.dtype != w.dtype:
    raise ValueError(f'x and w must share a dtype, got {x.dtype} and {w.dtype}')
  dots.check(precision)
  rows, depth = x.shape
  cols = w.shape[1]
  if min(block_m, block_n, block_k) <= 0:
    raise ValueError(f'block sizes must be positive: {block_m=} {block_n=} {block_k=}')
  if depth % block_k:
    raise ValueError(f'K={depth} must be a multiple of {block_k=}')
  if cols % block_n:
    raise ValueError(f'N={cols} must be a multiple of {block_n=}')
  if not interpret:
    for name, size in (('block_m', block_m), ('block_n', block_n), ('block_k', block_k)):
      if not _common.is_power_of_2(size) or size < 16:
        raise ValueError(f'{name}={size} must be a power of 2 and >= 16 for the GPU kernel')
  out_dtype = x.dtype if out_dtype is None else jnp.dtype(out_dtype)

  padded = pl.cdiv(max(rows, 1), block_m) * block_m
  if padded != rows:
    x = jnp.pad(x, ((0, padded - rows), (0, 0)))
  out = pl.pallas_call(
    functools.partial(_matmul_kernel, block_k=block_k, precision=precision),
    grid=(padded // block_m, cols // block_n),
    in_specs=[
      pl.BlockSpec((block_m, depth), lambda i, j: (i, 0)),
      pl.BlockSpec((depth, block_n), lambda i, j: (0, j)),
    ],
    out_specs=pl.BlockSpec((block_m, block_n), lambda i, j: (i, j)),
    out_shape=jax.ShapeDtypeStruct((padded, cols), out_dtype),
    compiler_params=(None if interpret else _common.gpu_compiler_params(num_warps, num_stages)),
    interpret=interpret,
    name='graftjax_matmul',
  )(x, w)
  return out[:rows]


@functools.partial(jax.jit, static_argnames=('precision', 'out_dtype'))
def matmul_reference(
  x: jax.Array,
  w: jax.Array,
  *,
  precision: dots.Precision = _HIGHEST,
  out_dtype: jnp.dtype | None = None,
) -> jax.Array:
  """XLA's x [M, K] @ w [K, N] in float32; not row-invariant (see module doc)."""
  out_dtype = x.dtype if out_dtype is None else jnp.dtype(out_dtype)
  out = dots.dot_general(x, w, _DIMS, precision)
  return out.astype(out_dtype)
