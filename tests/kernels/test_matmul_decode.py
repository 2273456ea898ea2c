"""graftjax.kernels.matmul_decode: its rows carry matmul.matmul's bits, per variant.

Natively (GPU) the reference is the prefill kernel at its own 64-row tiles:
these tests decide whether the model may use a variant (`models/gemma/ops.py`,
`MATMUL_DECODE_SHOWN`), per dtype and variant. In the interpreter a tile is an XLA CPU dot,
whose row bits depend on the tile's shape for some shapes (measured: a
[16, 32] @ [32, 32] tile differs from a [64, 32] one): there the reference is
the prefill kernel at the decode kernel's own tile (block_m=16, same
block_n), which checks the kernel's loop, padding and broadcast but leaves the
tile-size claim to the GPU; the transposed tile and w read as [N, K]
(`w_layout='nk'`, differing there for float32) have no such counterpart and
run natively only. The comparison is of the float32 accumulators
(out_dtype=float32), bit for bit.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import kernel_testing

from graftjax.kernels import matmul as mm
from graftjax.kernels import matmul_decode as md

INTERPRET = kernel_testing.INTERPRET
VARIANTS = {'rows': False, 'transposed': True}
# (K, N): gemma-3-270m's hidden size and MLP width as contractions, and a short K.
SHAPES = [(640, 128), (2048, 64), (64, 32)]
ROWS = (1, 2, 7, 16)


def _prefill(x, w, **static):
  return np.asarray(kernel_testing.jitted(mm.matmul, out_dtype=jnp.float32, **static)(x, w))


def _reference_rows(x, w):
  """The prefill kernel's rows: natively at the model's tiles (64 rows, as
  models/gemma/ops.py picks block_n); in the interpreter at the rows
  variant's tile (see the module doc)."""
  cols = w.shape[1]
  if not INTERPRET:
    return _prefill(x, w, block_n=math.gcd(cols, mm.DEFAULT_BLOCK_SIZES.block_n))
  block_n = md.block_n_for(cols, transposed=False)
  return _prefill(x, w, block_m=md.MAX_ROWS, block_n=block_n)


def _decode(x, w, variant, w_layout='kn'):
  transposed = VARIANTS[variant]
  cols = w.shape[0] if w_layout == 'nk' else w.shape[1]
  block_n = md.block_n_for(cols, transposed=transposed)
  kernel = kernel_testing.jitted(
    md.matmul_decode,
    block_n=block_n,
    transposed=transposed,
    w_layout=w_layout,
    out_dtype=jnp.float32,
  )
  return np.asarray(kernel(x, w))


def _data(rng, rows, depth, cols, dtype):
  x = jnp.asarray(rng.standard_normal((rows, depth)), dtype)
  w = jnp.asarray(rng.standard_normal((depth, cols)) * depth**-0.5, dtype)
  return x, w


def bits_differ(got: np.ndarray, want: np.ndarray) -> int:
  """How many float32 elements differ in their bits (shapes must match)."""
  assert got.shape == want.shape and got.dtype == want.dtype == np.float32
  return int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))


@pytest.mark.slow
@pytest.mark.parametrize('variant', list(VARIANTS))
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('depth,cols', SHAPES)
def test_row_bits_equal_prefill_kernel(depth, cols, dtype, variant):
  if INTERPRET and variant == 'transposed':
    pytest.skip('the transposed tile has no prefill counterpart in the interpreter (GPU only)')
  if md.block_n_for(cols, transposed=VARIANTS[variant]) is None:
    pytest.skip(f'N={cols} has no {variant} tile: the model keeps it on the prefill kernel')
  x, w = _data(np.random.default_rng(depth + cols), 70, depth, cols, jnp.dtype(dtype))
  full = _reference_rows(x, w)  # several row blocks, the last one padded
  weights = {'kn': w, 'nk': jnp.asarray(np.asarray(w).T)}  # 'nk': stored like the embedding
  for layout in ['kn'] if INTERPRET else weights:
    for rows in ROWS:
      got = _decode(x[:rows], weights[layout], variant, w_layout=layout)
      assert bits_differ(got, full[:rows]) == 0, (layout, rows)
  assert bits_differ(_decode(x[5:12], w, variant), full[5:12]) == 0  # rows moved


def test_comparison_catches_another_reduction_order():
  """The same sums in reverse K order differ in their bits, and the test above
  would see it: its comparison can fail."""
  x, w = _data(np.random.default_rng(3), 16, 640, 128, jnp.float32)
  want = _prefill(x, w)
  for variant in VARIANTS:
    got = _decode(x[:, ::-1], w[::-1], variant)
    assert bits_differ(got, want) > 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('variant', list(VARIANTS))
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_matches_reference(dtype, variant):
  x, w = _data(np.random.default_rng(4), 3, 640, 128, dtype)
  transposed = VARIANTS[variant]
  block_n = md.block_n_for(128, transposed=transposed)
  out = kernel_testing.jitted(md.matmul_decode, block_n=block_n, transposed=transposed)(x, w)
  assert out.shape == (3, 128) and out.dtype == dtype
  tolerance = dict(rtol=1e-5, atol=1e-4) if dtype == jnp.float32 else dict(rtol=2e-2, atol=1e-1)
  ref = mm.matmul_reference(x, w)
  np.testing.assert_allclose(
    np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)), **tolerance
  )


def test_block_n_for():
  assert md.block_n_for(2048, transposed=False) == 32
  assert md.block_n_for(16, transposed=False) == 16
  assert md.block_n_for(8, transposed=False) is None
  assert md.block_n_for(640, transposed=True) == 64
  assert md.block_n_for(16, transposed=True) is None


@pytest.mark.parametrize(
  'x_shape,w_shape,static,match',
  [
    ((4, 640), (320, 128), {}, 'need x'),
    ((4, 640), (640, 128), {'w_layout': 'nk'}, 'need x'),
    ((4, 640), (640, 128), {'w_layout': 'kk'}, 'w_layout'),
    ((17, 640), (640, 128), {}, 'rows'),
    ((4, 640), (640, 100), {}, 'multiple of block_n'),
    ((4, 100), (100, 128), {}, 'multiple of block_k'),
    ((4, 640), (640, 128), dict(block_n=32, transposed=True, interpret=False), 'transposed'),
  ],
)
def test_shape_errors(x_shape, w_shape, static, match):
  static = dict(dict(interpret=INTERPRET), **static)
  with pytest.raises(ValueError, match=match):
    md.matmul_decode(jnp.zeros(x_shape), jnp.zeros(w_shape), **static)
