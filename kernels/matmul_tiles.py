"""Which matmul kernel and tiles a call takes: `kernels.matmul` or, for few rows, `matmul_decode`.

In the interpreter (CPU) the matmul's tiles are fixed (never per call),
since there `block_k` decides the order of float32 sums. On the GPU the
tiles are free: an output's bits do not depend on them (docs/kernels.md says
why we think so; shown natively for every entry of `gpu_matmul_tiles`,
tests/models/gemma/test_matmul_tiles.py), and calls of at most 16 rows (decode)
take smaller tiles than a prefill chunk. Calls of at most 16 rows may also go
to the decode matmul (`matmul_decode.py`), whose rows carry the prefill
kernel's bits, only where that was shown natively (`MATMUL_DECODE_SHOWN`;
docs/kernels.md).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp

from graftjax.kernels import _common
from graftjax.kernels import dots
from graftjax.kernels import matmul
from graftjax.kernels import matmul_decode

# A call of at most this many rows is a decode step (its own tiles, and the decode matmul).
DECODE_ROWS = 16
# Tied-embedding-sized outputs (N >= this) take wider column tiles.
_WIDE_N = 65536
# A decode call contracting over at least this many features loads its tiles deeper.
_LONG_K = 8192

MATMUL_DECODE_VARIANTS = ('rows', 'transposed')
# (backend, dtype) -> the decode matmul variant used there: its row bits equal
# the prefill kernel's, shown by tests/kernels/test_matmul_decode.py run
# natively (on a GPU: docs/device.md), and it is faster. On the
# H200 both variants were shown in both dtypes; float32 'rows' cut decode's
# invariance cost from 3.38 to 2.55, while in bfloat16 'rows' (0.97) and
# 'transposed' (1.09) were slower than the prefill kernel (0.58), so bfloat16
# keeps it (experiments/results/invariance_cost/runs/matmul_decode_h200_bfloat16_*.json).
MATMUL_DECODE_SHOWN: dict[tuple[str, str], str] = {('gpu', 'float32'): 'rows'}
# Overrides the table for every dtype, read once at import: 'off', or a
# variant (to measure it before it is shown; bits may then differ).
MATMUL_DECODE_ENV = 'GRAFTJAX_MATMUL_DECODE'


def _decode_override() -> str | None:
  value = os.environ.get(MATMUL_DECODE_ENV) or None
  if value not in (None, 'off', *MATMUL_DECODE_VARIANTS):
    raise ValueError(f'{MATMUL_DECODE_ENV}={value!r}: use off or one of {MATMUL_DECODE_VARIANTS}')
  return value


_MATMUL_DECODE_OVERRIDE = _decode_override()


def _largest_divisor(n: int, limit: int) -> int:
  return math.gcd(n, limit) if n % limit else limit


@dataclasses.dataclass(frozen=True)
class MatmulTiles:
  """`matmul.matmul`'s tile and launch keywords for one call."""

  block_m: int = matmul.DEFAULT_BLOCK_SIZES.block_m
  block_n: int = matmul.DEFAULT_BLOCK_SIZES.block_n
  block_k: int = matmul.DEFAULT_BLOCK_SIZES.block_k
  num_warps: int = 4
  num_stages: int = 3

  def fit(self, k: int, n: int) -> MatmulTiles:
    """block_n and block_k cut down to divide N and K."""
    return dataclasses.replace(
      self, block_n=_largest_divisor(n, self.block_n), block_k=_largest_divisor(k, self.block_k)
    )


def gpu_matmul_tiles(dtype, rows: int, k: int, n: int, precision: str = 'highest') -> MatmulTiles:
  """The GPU tiles of x [rows, K] @ w [K, N] (speed only: see the module doc).

  The fastest candidates at gemma-3-270m's shapes on the H200
  (experiments/results/invariance_cost/bench_matmul_tiles_h200*.json). Under a bfloat16
  split (`dots`) each K step sums its piece products before adding them to
  the accumulator, so block_k groups the sums: it stays the fixed one.
  """
  tiles = _gpu_tiles(dtype, rows, k, n)
  if precision in dots.SPLITS:
    tiles = dataclasses.replace(tiles, block_k=MatmulTiles().block_k)
  return tiles.fit(k, n)


def _gpu_tiles(dtype, rows: int, k: int, n: int) -> MatmulTiles:
  wide = n >= _WIDE_N
  if jnp.dtype(dtype) == jnp.float32:
    if rows <= DECODE_ROWS:
      tiles = MatmulTiles(16, 128 if wide else 32, 64)
    else:
      tiles = MatmulTiles()
  elif rows <= DECODE_ROWS:
    # A long contraction (gemma3-12b's down projection, K = 15,360) streams its tiles
    # best 5 deep: 50 us against 70 at 3 on the H100, bits equal
    # (experiments/results/scale/runs/bench_matmul_tiles_gemma3-12b_decode_stages_h100.json).
    tiles = MatmulTiles(16, 128 if wide else 32, 128, num_stages=5 if k >= _LONG_K else 3)
  else:
    tiles = MatmulTiles(128, 128, 64, num_warps=8) if wide else MatmulTiles(64, 64, 128)
  return tiles


def matmul_tiles(dtype, rows: int, k: int, n: int, precision: str = 'highest') -> MatmulTiles:
  """The tiles of a Pallas matmul call: `gpu_matmul_tiles` on the GPU, else the fixed ones."""
  if _common.interpret_here():
    return MatmulTiles().fit(k, n)
  return gpu_matmul_tiles(dtype, rows, k, n, precision)


def matmul_decode_variant(dtype) -> str | None:
  """The decode matmul variant for calls of <= 16 rows in `dtype`, or None
  (the prefill kernel): the override if set, else `MATMUL_DECODE_SHOWN`."""
  if _MATMUL_DECODE_OVERRIDE is not None:
    return None if _MATMUL_DECODE_OVERRIDE == 'off' else _MATMUL_DECODE_OVERRIDE
  return MATMUL_DECODE_SHOWN.get((jax.default_backend(), jnp.dtype(dtype).name))


def _decode_block_n(rows: jax.Array, n: int, precision: str) -> tuple[str, int] | tuple[None, None]:
  """(variant, block_n) when rows [M, D] go to the decode matmul, else (None, None).

  Only IEEE products go there: its bits were shown at 'highest' only.
  """
  if precision != 'highest' or not 1 <= rows.shape[0] <= matmul_decode.MAX_ROWS:
    return None, None
  variant = matmul_decode_variant(rows.dtype)
  block_n = variant and matmul_decode.block_n_for(n, transposed=variant == 'transposed')
  return (variant, block_n) if block_n else (None, None)


def _decode(rows, w, variant, block_n, w_layout):
  n = w.shape[1] if w_layout == 'kn' else w.shape[0]
  return matmul_decode.matmul_decode(
    rows,
    w,
    block_n=block_n,
    block_k=matmul_tiles(rows.dtype, rows.shape[0], rows.shape[1], n).block_k,
    transposed=variant == 'transposed',
    w_layout=w_layout,
    interpret=_common.interpret_here(),
  )


def dense(x: jax.Array, w: jax.Array, *, precision: str, w_layout: str = 'kn') -> jax.Array:
  """x [..., D] contracted by the Pallas matmul at `precision` (`dots.NAMES`).

  `w_layout` 'kn': w [D, *out] -> [..., *out]. 'nk': w is a table [V, D] (the tied
  embedding) -> [..., V]; the decode matmul reads it as stored, the prefill kernel
  computes x @ w.T.
  """
  if w_layout == 'nk':
    rows = x.reshape(-1, w.shape[1])
    variant, block_n = _decode_block_n(rows, w.shape[0], precision)
    if variant:
      return _decode(rows, w, variant, block_n, 'nk').reshape(x.shape[:-1] + w.shape[:1])
    w = w.T
  d, out_shape = w.shape[0], w.shape[1:]
  n = math.prod(out_shape)
  rows = x.reshape(-1, d)
  variant, block_n = _decode_block_n(rows, n, precision)
  if variant:
    y = _decode(rows, w.reshape(d, n), variant, block_n, 'kn')
  else:
    tiles = matmul_tiles(rows.dtype, rows.shape[0], d, n, precision)
    y = matmul.matmul(
      rows,
      w.reshape(d, n),
      **dataclasses.asdict(tiles),
      precision=dots.from_name(precision),
      interpret=_common.interpret_here(),
    )
  return y.reshape(x.shape[:-1] + out_shape)
