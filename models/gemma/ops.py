"""The model's numerics-relevant ops, by implementation: 'xla' or 'pallas'.

'xla' uses jnp/XLA (fast to compile, but a row's bits depend on how many
rows a call has). 'pallas' uses the chunk-invariant kernels of
`graftjax.kernels`: fixed tiles, ascending reductions, no split-K, so a
token's bits do not depend on its chunk, its batch, or whether the keys
before it were computed in the same call or grafted. On a CPU backend the
kernels run in the Pallas interpreter.

In the interpreter (CPU) the matmul's tiles are fixed (never per call),
since there `block_k` decides the order of float32 sums. On the GPU the
tiles are free: an output's bits do not depend on them (docs/kernels.md says
why we think so; shown natively for every entry of `gpu_matmul_tiles`,
tests/models/gemma/test_matmul_tiles.py), and calls of at most 16 rows (decode)
take smaller tiles than a prefill chunk. Calls of at most 16 rows may also go
to the decode matmul (`kernels/matmul_decode.py`), whose rows carry the
prefill kernel's bits, only where that was shown natively
(`MATMUL_DECODE_SHOWN`; docs/kernels.md). The 'xla' side of each op is the
pure-jnp reference beside its kernel (`rms_norm_reference`,
`apply_rotary_reference`, `attention_reference`).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp

from graftjax.kernels import dots
from graftjax.kernels import matmul
from graftjax.kernels import rmsnorm
from graftjax.models.gemma import layers

# A call of at most this many rows is a decode step (its own tiles, and the decode matmul).
DECODE_ROWS = 16
# Tied-embedding-sized outputs (N >= this) take wider column tiles.
_WIDE_N = 65536
# A decode call contracting over at least this many features loads its tiles deeper.
_LONG_K = 8192
# Under 'pallas' the cache capacity must be a multiple of this: a multiple of
# every dtype's KV tile (`attention.default_block_sizes`).
CAPACITY_MULTIPLE = 64

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


def _interpret() -> bool:
  return jax.default_backend() != 'gpu'


def _largest_divisor(n: int, limit: int) -> int:
  return math.gcd(n, limit) if n % limit else limit


@dataclasses.dataclass(frozen=True)
class MatmulTiles:
  """`kernels.matmul.matmul`'s tile and launch keywords for one call."""

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
  if _interpret():
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
  from graftjax.kernels import matmul_decode  # pylint: disable=g-import-not-at-top

  if precision != 'highest' or not 1 <= rows.shape[0] <= matmul_decode.MAX_ROWS:
    return None, None
  variant = matmul_decode_variant(rows.dtype)
  block_n = variant and matmul_decode.block_n_for(n, transposed=variant == 'transposed')
  return (variant, block_n) if block_n else (None, None)


def _decode(rows, w, variant, block_n, w_layout):
  from graftjax.kernels import matmul_decode  # pylint: disable=g-import-not-at-top

  n = w.shape[1] if w_layout == 'kn' else w.shape[0]
  return matmul_decode.matmul_decode(
    rows,
    w,
    block_n=block_n,
    block_k=matmul_tiles(rows.dtype, rows.shape[0], rows.shape[1], n).block_k,
    transposed=variant == 'transposed',
    w_layout=w_layout,
    interpret=_interpret(),
  )


def dense(x: jax.Array, w: jax.Array, *, impl: str, precision: str) -> jax.Array:
  """Contracts x [..., D] with w [D, *out] -> [..., *out] at `precision` (`dots.NAMES`)."""
  if impl == 'xla':
    letters = 'abcdefgh'[: w.ndim - 1]
    return layers.einsum(f'...D,D{letters}->...{letters}', x, w, precision)
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
      interpret=_interpret(),
    )
  return y.reshape(x.shape[:-1] + out_shape)


def unembed(x: jax.Array, table: jax.Array, *, impl: str, precision: str) -> jax.Array:
  """x [..., D] against the tied table [V, D] -> [..., V]: `dense(x, table.T)`,
  except that the decode matmul reads the table as stored (no transposed copy)."""
  if impl == 'pallas':
    rows = x.reshape(-1, table.shape[1])
    variant, block_n = _decode_block_n(rows, table.shape[0], precision)
    if variant:
      return _decode(rows, table, variant, block_n, 'nk').reshape(x.shape[:-1] + table.shape[:1])
  return dense(x, table.T, impl=impl, precision=precision)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, *, impl: str) -> jax.Array:
  """x [..., D] / rms(x) * weight [D] (Gemma's +1 included), float32 inside."""
  if impl == 'xla':
    return rmsnorm.rms_norm_reference(x, weight, eps=eps)
  return rmsnorm.rms_norm(x, weight, eps=eps, interpret=_interpret())


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
  from graftjax.models.gemma import positions as positions_lib  # pylint: disable=g-import-not-at-top

  if impl == 'xla':
    return positions_lib.rotate_for_cache(
      x, positions, scheme='rope', theta=theta, scale=scale, fraction=fraction
    )
  from graftjax.kernels import rotary  # pylint: disable=g-import-not-at-top

  return rotary.apply_rotary(
    x, positions, theta=theta, scale=scale, fraction=fraction, interpret=_interpret()
  )


def split_slots(dtype, group: int) -> int:
  """Slots per split of the Pallas attention for `dtype` and G query heads per kv head (float32
  256, bfloat16 512): also the split of the 'xla_split' attention."""
  from graftjax.kernels import attention as attention_kernel  # pylint: disable=g-import-not-at-top

  return attention_kernel.default_block_sizes(dtype, group).block_s


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
  distance_bias=None,
  relative_table=None,
  precision: str,
):
  """The Pallas attention kernel: q [B, T, N, H], k/v [B, S, K, H] -> [B, T, N, H].

  Optional: segments q [B, T] / k [B, S], a distance bias [N, D], and for
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
    distance_bias=distance_bias,
    relative_table=relative_table,
    window=window,
    precision=dots.from_name(precision),
    interpret=_interpret(),
  )
