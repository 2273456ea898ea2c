"""graftjax.kernels.rmsnorm: against the reference and row-invariance."""

import jax.numpy as jnp
import numpy as np
import pytest

import kernel_testing

from graftjax.kernels import rmsnorm

INTERPRET = kernel_testing.INTERPRET


def _kernel(**static):
  return kernel_testing.jitted(rmsnorm.rms_norm, **static)


FEATURES = 640  # gemma-3-270m hidden size: not a power of 2
TOLERANCE = {
  jnp.float32: dict(rtol=1e-5, atol=1e-5),
  jnp.bfloat16: dict(rtol=2e-2, atol=2e-2),
}


def _data(rng, shape, dtype):
  x = jnp.asarray(rng.standard_normal(shape) * 3.0 + 0.5, dtype)
  w = jnp.asarray(1.0 + 0.1 * rng.standard_normal(shape[-1]), jnp.float32)
  return x, w


def _run(x, w, block_d=None):
  return np.asarray(_kernel(block_d=block_d)(x, w).astype(jnp.float32))


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('features,block_d', [(FEATURES, None), (48, 16)])
def test_matches_reference(dtype, features, block_d):
  x, w = _data(np.random.default_rng(0), (2, 5, features), dtype)
  out = _run(x, w, block_d=block_d)
  ref = rmsnorm.rms_norm_reference(x, w)
  assert out.shape == x.shape
  np.testing.assert_allclose(out, np.asarray(ref.astype(jnp.float32)), **TOLERANCE[dtype])


def test_default_block_d():
  assert rmsnorm.default_block_d(640) == 128
  assert rmsnorm.default_block_d(1152) == 128
  assert rmsnorm.default_block_d(4096) == 1024
  assert rmsnorm.default_block_d(48) == 16


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_rows_do_not_depend_on_batch(dtype):
  x, w = _data(np.random.default_rng(1), (4, 64, FEATURES), dtype)
  full = _run(x, w)
  np.testing.assert_array_equal(_run(x[3, 10:11], w), full[3, 10:11])
  np.testing.assert_array_equal(_run(x[3, 5:12], w), full[3, 5:12])
  np.testing.assert_array_equal(_run(x[:1], w), full[:1])


def test_shape_errors():
  with pytest.raises(ValueError, match='w'):
    rmsnorm.rms_norm(jnp.zeros((2, 64)), jnp.zeros((32,)), interpret=INTERPRET)
  with pytest.raises(ValueError, match='multiple of block_d'):
    rmsnorm.rms_norm(jnp.zeros((2, 64)), jnp.zeros((64,)), block_d=48, interpret=INTERPRET)
