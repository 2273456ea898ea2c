"""The matmul's GPU tiles are speed only: `ops.dense` under the GPU tile table gives the
bytes of the fixed tiles, for decode and prefill row counts, at gemma-3-270m's shapes and a
long contraction of gemma3-12b.

Natively only: in the interpreter (CPU) `block_k` changes the order of the float32 sums,
so there `matmul_tiles.matmul_tiles` (kernels/matmul_tiles.py) keeps the fixed tiles
(checked below on any machine).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.kernels import dots
from graftjax.kernels import matmul
from graftjax.kernels import matmul_tiles
from graftjax.models.gemma import ops

GPU = jax.default_backend() == 'gpu'
# (K, N): gemma-3-270m's q, k/v, o, gate/up, down, the tied unembedding; gemma3-12b's down
# (a long contraction: its decode tiles load deeper).
SHAPES = [
  (640, 1024),
  (640, 256),
  (1024, 640),
  (640, 2048),
  (2048, 640),
  (640, 262144),
  (15360, 3840),
]
ROWS = (1, 7, 16, 17, 128)


def _operands(dtype, k, n):
  rng = np.random.default_rng(k * 7 + n)
  x = jnp.asarray(rng.standard_normal((max(ROWS), k)), dtype)
  w = jnp.asarray(rng.standard_normal((k, n)) * k**-0.5, dtype)
  return x, w


def _fixed(x, w, precision='highest'):
  tiles = matmul_tiles.MatmulTiles().fit(*w.shape)
  return np.asarray(
    matmul.matmul(
      x,
      w,
      **dataclasses.asdict(tiles),
      precision=dots.from_name(precision),
      interpret=not GPU,
    )
  )


def _bytes(a) -> bytes:
  return np.asarray(a).tobytes()


@pytest.fixture(autouse=True)
def _forget_programs_traced_here():
  yield
  jax.clear_caches()


@pytest.mark.skipif(
  not GPU, reason='GPU tiles run natively only (the interpreter keeps fixed tiles)'
)
@pytest.mark.parametrize(
  ('dtype', 'precision'),
  [('float32', 'highest'), ('bfloat16', 'highest'), ('float32', 'bf16x3'), ('float32', 'bf16x6')],
)
@pytest.mark.parametrize(('k', 'n'), SHAPES, ids=[f'{k}x{n}' for k, n in SHAPES])
def test_gpu_tiles_keep_the_fixed_tiles_bits(dtype, precision, k, n):
  x, w = _operands(dtype, k, n)
  want = _fixed(x, w, precision)
  for rows in ROWS:
    got = ops.dense(x[:rows], w, impl='pallas', precision=precision)
    assert _bytes(got) == _bytes(want[:rows]), (
      f'{rows} rows: {matmul_tiles.matmul_tiles(dtype, rows, k, n, precision)}'
    )


def test_comparison_catches_another_reduction_order():
  """Summing K in two halves (a split-K) changes bytes: the comparison above can fail."""
  x, w = _operands(jnp.float32, 640, 256)
  half = 320
  split = _fixed(x[:, :half], w[:half]) + _fixed(x[:, half:], w[half:])
  assert _bytes(split) != _bytes(_fixed(x, w))


@pytest.mark.parametrize(
  ('dtype', 'precision'), [('float32', 'highest'), ('bfloat16', 'highest'), ('float32', 'bf16x3')]
)
@pytest.mark.parametrize('rows', ROWS)
@pytest.mark.parametrize(('k', 'n'), SHAPES, ids=[f'{k}x{n}' for k, n in SHAPES])
def test_gpu_tiles_fit_the_kernel(dtype, precision, rows, k, n):
  tiles = matmul_tiles.gpu_matmul_tiles(dtype, rows, k, n, precision)
  assert k % tiles.block_k == 0 and n % tiles.block_n == 0
  for size in (tiles.block_m, tiles.block_n, tiles.block_k):
    assert size >= 16 and size & (size - 1) == 0
  assert (tiles.block_m == 16) == (rows <= matmul_tiles.DECODE_ROWS)
  if precision != 'highest':  # a split's block_k groups its sums (natively shown above)
    assert tiles.block_k == matmul_tiles.MatmulTiles().block_k


@pytest.mark.skipif(GPU, reason='checks the interpreter path')
def test_interpreter_keeps_the_fixed_tiles():
  for rows in ROWS:
    assert matmul_tiles.matmul_tiles(jnp.bfloat16, rows, 640, 2048) == matmul_tiles.MatmulTiles()
  assert matmul_tiles.matmul_tiles(jnp.float32, 1, 640, 48) == matmul_tiles.MatmulTiles(block_n=16)
