"""Decode matmul: x [M <= 16, K] @ w [K, N] with the prefill kernel's row bits.

`matmul.matmul` pads every call to 64-row tiles, so a decoded token pays for
64 rows. This kernel takes 1-16 rows in 16-row tiles (the smallest a Triton
dot takes) with the prefill kernel's contraction: the same `block_k` steps in
ascending K, `acc + dot_general(...)` at the same precision, float32
accumulation, no split-K. An output element is its own dot product in either
tile, so its bits can only change if the dot instruction rounds differently
at another tile shape: `transposed=True` computes w^T x^T so that the dot's M
side is 64 (Hopper's warpgroup MMA, as for the prefill tiles) rather than 16.
Whether a variant's rows are equal is shown natively per dtype
(tests/kernels/test_matmul_decode.py; docs/kernels.md has the argument).

One row is read unpadded and broadcast to the tile in the kernel; 2-16 rows
are zero-padded. `w_layout='nk'` reads w as [N, K] (the tied embedding table
as stored, no transposed copy per call).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from graftjax.kernels import _common
from graftjax.kernels import dots
from graftjax.kernels import matmul

_HIGHEST = lax.Precision.HIGHEST
# Rows of x per call; the tile height (a Triton dot needs 16).
MAX_ROWS = 16
# With transposed=True, block_n is the dot's M side: the warpgroup MMA's 64.
TRANSPOSED_BLOCK_N_MULTIPLE = 64


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the decode matmul.

  Attributes:
    block_n: columns of w per program (free: per-element bits do not depend
      on it); N must be a multiple.
    block_k: contraction step; must be the prefill kernel's for equal bits.
  """

  block_n: int = 32
  block_k: int = matmul.DEFAULT_BLOCK_SIZES.block_k


DEFAULT_BLOCK_SIZES = BlockSizes()


def block_n_for(cols: int, *, transposed: bool) -> int | None:
  """The column tile for N = cols (the default, or the largest power of 2
  >= 16 below it that divides N; transposed: 64), or None if none fits."""
  if transposed:
    multiple = TRANSPOSED_BLOCK_N_MULTIPLE
    return multiple if cols % multiple == 0 else None
  block = math.gcd(cols, DEFAULT_BLOCK_SIZES.block_n)
  return block if block >= 16 else None


def _decode_kernel(
  x_ref,  # [1 or MAX_ROWS, K]
  w_ref,  # [K, block_n] ('kn') or [block_n, K] ('nk')
  o_ref,  # [MAX_ROWS, block_n]
  *,
  block_k: int,
  transposed: bool,
  w_layout: str,
  precision: dots.Precision,
):
  w_k = 0 if w_layout == 'kn' else 1  # w's contraction axis
  depth = w_ref.shape[w_k]
  block_n = w_ref.shape[1 - w_k]

  def body(step, acc):
    cols = pl.ds(pl.multiple_of(step * block_k, block_k), block_k)
    x = jnp.broadcast_to(x_ref[:, cols], (MAX_ROWS, block_k))
    w = w_ref[cols, :] if w_layout == 'kn' else w_ref[:, cols]
    if transposed:  # [block_n, MAX_ROWS] = w^T x^T
      dims = (((w_k,), (1,)), ((), ()))
      product = dots.dot_general(w, x, dims, precision)
    else:  # [MAX_ROWS, block_n] = x w
      dims = (((1,), (w_k,)), ((), ()))
      product = dots.dot_general(x, w, dims, precision)
    return acc + product

  shape = (block_n, MAX_ROWS) if transposed else (MAX_ROWS, block_n)
  acc = lax.fori_loop(0, depth // block_k, body, jnp.zeros(shape, jnp.float32))
  o_ref[...] = (acc.T if transposed else acc).astype(o_ref.dtype)


@functools.partial(
  jax.jit,
  static_argnames=(
    'block_n',
    'block_k',
    'transposed',
    'w_layout',
    'precision',
    'out_dtype',
    'num_warps',
    'num_stages',
    'interpret',
  ),
)
def matmul_decode(
  x: jax.Array,
  w: jax.Array,
  *,
  block_n: int = DEFAULT_BLOCK_SIZES.block_n,
  block_k: int = DEFAULT_BLOCK_SIZES.block_k,
  transposed: bool = False,
  w_layout: str = 'kn',
  precision: dots.Precision = _HIGHEST,
  out_dtype: jnp.dtype | None = None,
  num_warps: int = 4,
  num_stages: int = 5,
  interpret: bool = False,
) -> jax.Array:
  """x @ w for a few rows, contraction as in `matmul.matmul`.

  Args:
    x: [M, K], 1 <= M <= MAX_ROWS.
    w: [K, N] (w_layout 'kn') or [N, K] ('nk', e.g. a tied embedding table
      read as it is stored), the same dtype as x.
    block_n: columns per program (N must be a multiple; with transposed, a
      multiple of 64 on the GPU).
    block_k: contraction step (K must be a multiple); the prefill kernel's
      for equal bits.
    transposed: compute each tile as w^T x^T (see the module doc).
    w_layout: 'kn' or 'nk', how w is laid out.
    precision: of each tile product (`dots`); HIGHEST = IEEE float32 for float32.
    out_dtype: result dtype, x's by default.
    num_warps: Triton only.
    num_stages: Triton only: tiles loaded ahead (the sums stay in order).
    interpret: run the kernel in the Pallas interpreter (CPU).

  Returns:
    [M, N] in out_dtype.
  """
  if w_layout not in ('kn', 'nk'):
    raise ValueError(f"w_layout must be 'kn' or 'nk', got {w_layout!r}")
  w_k = 0 if w_layout == 'kn' else 1
  if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[w_k]:
    raise ValueError(f'need x [M, K] and w {w_layout.upper()}, got {x.shape} and {w.shape}')
  if x.dtype != w.dtype:
    raise ValueError(f'x and w must share a dtype, got {x.dtype} and {w.dtype}')
  dots.check(precision)
  rows, depth = x.shape
  cols = w.shape[1 - w_k]
  if not 1 <= rows <= MAX_ROWS:
    raise ValueError(f'M={rows} rows: the decode matmul takes 1 to {MAX_ROWS}')
  if min(block_n, block_k) <= 0:
    raise ValueError(f'block sizes must be positive: {block_n=} {block_k=}')
  if depth % block_k:
    raise ValueError(f'K={depth} must be a multiple of {block_k=}')
  if cols % block_n:
    raise ValueError(f'N={cols} must be a multiple of {block_n=}')
  if not interpret:
    for name, size in (('block_n', block_n), ('block_k', block_k)):
      if not _common.is_power_of_2(size) or size < 16:
        raise ValueError(f'{name}={size} must be a power of 2 and >= 16 for the GPU kernel')
    if transposed and block_n % TRANSPOSED_BLOCK_N_MULTIPLE:
      raise ValueError(
        f'transposed needs block_n={block_n} a multiple of {TRANSPOSED_BLOCK_N_MULTIPLE}'
      )
  out_dtype = x.dtype if out_dtype is None else jnp.dtype(out_dtype)

  if rows > 1:
    x = jnp.pad(x, ((0, MAX_ROWS - rows), (0, 0)))
  out = pl.pallas_call(
    functools.partial(
      _decode_kernel,
      block_k=block_k,
      transposed=transposed,
      w_layout=w_layout,
      precision=precision,
    ),
    grid=(cols // block_n,),
    in_specs=[
      pl.BlockSpec(x.shape, lambda j: (0, 0)),
      pl.BlockSpec((depth, block_n), lambda j: (0, j))
      if w_layout == 'kn'
      else pl.BlockSpec((block_n, depth), lambda j: (j, 0)),
    ],
    out_specs=pl.BlockSpec((MAX_ROWS, block_n), lambda j: (0, j)),
    out_shape=jax.ShapeDtypeStruct((MAX_ROWS, cols), out_dtype),
    compiler_params=(None if interpret else _common.gpu_compiler_params(num_warps, num_stages)),
    interpret=interpret,
    name='graftjax_matmul_decode',
  )(x, w)
  return out[:rows]
