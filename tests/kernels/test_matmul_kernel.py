"""graftjax.kernels.matmul: against XLA, row-invariance, and XLA's lack of it."""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_testing

from graftjax import determinism
from graftjax.kernels import dots
from graftjax.kernels import matmul as mm

INTERPRET = kernel_testing.INTERPRET


def _kernel(**static):
  return kernel_testing.jitted(mm.matmul, **static)


DEPTH, COLS = 640, 128  # gemma-3-270m's hidden size as the contraction
TOLERANCE = {
  jnp.float32: dict(rtol=1e-5, atol=1e-4),
  jnp.bfloat16: dict(rtol=2e-2, atol=1e-1),
}


def _data(rng, rows, dtype):
  x = jnp.asarray(rng.standard_normal((rows, DEPTH)), dtype)
  w = jnp.asarray(rng.standard_normal((DEPTH, COLS)) * DEPTH**-0.5, dtype)
  return x, w


def _run(x, w, precision=lax.Precision.HIGHEST):
  return np.asarray(_kernel(precision=precision)(x, w).astype(jnp.float32))


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_matches_reference(dtype):
  x, w = _data(np.random.default_rng(0), 70, dtype)  # two row blocks, padded
  out = _run(x, w)
  ref = np.asarray(mm.matmul_reference(x, w).astype(jnp.float32))
  assert out.shape == (70, COLS)
  np.testing.assert_allclose(out, ref, **TOLERANCE[dtype])
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  np.testing.assert_allclose(out, exact, **TOLERANCE[dtype])


@pytest.mark.parametrize(
  'dtype,precision',
  [
    (jnp.float32, 'highest'),
    (jnp.bfloat16, 'highest'),
    (jnp.float32, 'bf16x3'),
    (jnp.float32, 'bf16x6'),
  ],
)
@pytest.mark.slow
def test_rows_do_not_depend_on_m(dtype, precision):
  x, w = _data(np.random.default_rng(1), 70, dtype)
  precision = dots.from_name(precision)
  full = _run(x, w, precision)
  for rows in (1, 7, 64):
    np.testing.assert_array_equal(_run(x[:rows], w, precision), full[:rows])
  # A row moved to another place in the batch keeps its bits.
  np.testing.assert_array_equal(_run(x[5:12], w, precision), full[5:12])


def test_xla_matmul_is_not_row_invariant():
  """The failure the kernel exists to prevent: XLA's row 0 of [M, K] @ [K, N]
  changes bits with M (measured on CPU and H200), so the invariance tests
  above can fail."""
  rng = np.random.default_rng(2)
  dot = jax.jit(lambda a, b: jnp.dot(a, b, precision=lax.Precision.HIGHEST))
  differs = []
  for depth, cols in ((256, 256), (640, 2048)):
    x = jnp.asarray(rng.standard_normal((1024, depth)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((depth, cols)), jnp.float32)
    alone = np.asarray(dot(x[:1], w))[0]
    for rows in (2, 7, 33, 256, 1024):
      if not np.array_equal(np.asarray(dot(x[:rows], w))[0], alone):
        differs.append((depth, cols, rows))
  if not differs:  # a fact about XLA on this processor, like every CPU bit pattern
    pytest.skip(
      'XLA matmul is row-invariant for every M tried on this CPU kind'
      f' ({determinism.cpu_kind()}, {jax.default_backend()}): the failure the kernel'
      ' prevents does not occur here, so it cannot be shown here'
    )


@pytest.mark.parametrize(
  'x_shape,w_shape,match',
  [
    ((4, 640), (320, 128), 'need x'),
    ((4, 640), (640, 100), 'multiple of block_n'),
    ((4, 100), (100, 128), 'multiple of block_k'),
  ],
)
def test_shape_errors(x_shape, w_shape, match):
  with pytest.raises(ValueError, match=match):
    mm.matmul(jnp.zeros(x_shape), jnp.zeros(w_shape), interpret=INTERPRET)
