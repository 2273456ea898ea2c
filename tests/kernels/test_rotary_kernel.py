"""graftjax.kernels.rotary: against the reference and row-invariance."""

import jax.numpy as jnp
import numpy as np
import pytest

import kernel_testing

from graftjax.kernels import rotary

INTERPRET = kernel_testing.INTERPRET


def _kernel(**static):
  return kernel_testing.jitted(rotary.apply_rotary, **static)


HEADS, HEAD_DIM = 4, 256
TOLERANCE = {
  # cos/sin of angles up to 3e4 rad: a few float32 ulps of the argument.
  jnp.float32: dict(rtol=1e-5, atol=2e-5),
  jnp.bfloat16: dict(rtol=2e-2, atol=2e-2),
}


def _data(rng, batch, num_t, dtype):
  x = jnp.asarray(rng.standard_normal((batch, num_t, HEADS, HEAD_DIM)), dtype)
  positions = jnp.asarray(rng.integers(0, 32768, (batch, num_t)), jnp.int32)
  return x, positions


def _run(x, positions, theta=10_000.0):
  return np.asarray(_kernel(theta=theta)(x, positions).astype(jnp.float32))


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('theta', [10_000.0, 1_000_000.0])
def test_matches_reference(dtype, theta):
  x, positions = _data(np.random.default_rng(0), 2, 9, dtype)
  out = _run(x, positions, theta)
  ref = rotary.apply_rotary_reference(x, positions, theta=theta)
  np.testing.assert_allclose(out, np.asarray(ref.astype(jnp.float32)), **TOLERANCE[dtype])


def test_formula():
  """Position 0 is the identity; rotation keeps each pair's norm; the first
  frequency is 1 rad per position."""
  x, _ = _data(np.random.default_rng(1), 1, 9, jnp.float32)
  np.testing.assert_array_equal(_run(x, jnp.zeros((1, 9), jnp.int32)), np.asarray(x))
  positions = jnp.arange(9, dtype=jnp.int32)[None]
  out = _run(x, positions)
  half = HEAD_DIM // 2
  xn = np.asarray(x)
  np.testing.assert_allclose(
    np.hypot(out[..., :half], out[..., half:]), np.hypot(xn[..., :half], xn[..., half:]), rtol=1e-5
  )
  angle = np.arange(9)[:, None]
  expect = xn[0, :, :, 0] * np.cos(angle) - xn[0, :, :, half] * np.sin(angle)
  np.testing.assert_allclose(out[0, :, :, 0], expect, rtol=1e-5, atol=1e-5)
  inv_freq = rotary.rotary_inv_freq(HEAD_DIM, 10_000.0)
  assert inv_freq.dtype == np.float32 and inv_freq.shape == (half,)
  assert inv_freq[0] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_rows_do_not_depend_on_chunk_or_batch(dtype):
  x, positions = _data(np.random.default_rng(2), 4, 64, dtype)
  full = _run(x, positions)
  np.testing.assert_array_equal(_run(x[2:3, 20:21], positions[2:3, 20:21]), full[2:3, 20:21])
  np.testing.assert_array_equal(_run(x[2:3, 17:24], positions[2:3, 17:24]), full[2:3, 17:24])
  np.testing.assert_array_equal(_run(x[:1], positions[:1]), full[:1])


def test_shape_errors():
  with pytest.raises(ValueError, match='positions'):
    rotary.apply_rotary(
      jnp.zeros((1, 4, 2, 8)), jnp.zeros((1, 5), jnp.int32), theta=1e4, interpret=INTERPRET
    )
  with pytest.raises(ValueError, match='even'):
    rotary.apply_rotary(
      jnp.zeros((1, 4, 2, 7)), jnp.zeros((1, 4), jnp.int32), theta=1e4, interpret=INTERPRET
    )
