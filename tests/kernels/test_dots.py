"""graftjax.kernels.dots: float32 dots split into bfloat16 pieces, against float64 and IEEE."""

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.kernels import dots

DIMS = (((1,), (0,)), ((), ()))


def _operands(dtype=jnp.float32, k=2048):
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((8, k)), dtype)
  b = jnp.asarray(rng.standard_normal((k, 64)) * k**-0.5, dtype)
  return a, b


def _error(precision):
  a, b = _operands()
  got = jax.jit(lambda x, y: dots.dot_general(x, y, DIMS, precision))(a, b)
  exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  return float(np.abs(np.asarray(got, np.float64) - exact).max())


def test_split_errors_against_float64():
  """bf16x6 is about as close as IEEE float32; bf16x3 keeps ~16 bits, so it is
  measurably coarser, yet far closer than one bfloat16 product."""
  ieee = _error(lax.Precision.HIGHEST)
  assert _error('bf16x6') < 4 * ieee
  x3 = _error('bf16x3')
  assert 4 * ieee < x3 < 1e-4
  a, b = _operands()
  one_bf16 = dots.dot_general(
    a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), DIMS, lax.Precision.HIGHEST
  )
  exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  assert 50 * x3 < np.abs(np.asarray(one_bf16, np.float64) - exact).max()


def test_pieces_are_bfloat16_and_sum_back():
  x = jnp.asarray(np.random.default_rng(1).standard_normal(1000), jnp.float32)
  pieces = dots._pieces(x, 3)
  assert all(p.dtype == jnp.bfloat16 for p in pieces)
  total = sum(p.astype(jnp.float32) for p in reversed(pieces))
  np.testing.assert_array_equal(np.asarray(total), np.asarray(x))


def test_einsum_and_dot_general_agree():
  a, b = _operands(k=256)
  for name in dots.SPLITS:
    got = dots.einsum('mk,kn->mn', a, b, name)
    want = dots.dot_general(a, b, DIMS, name)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_bfloat16_operands_take_the_plain_dot():
  a, b = _operands(jnp.bfloat16, k=256)
  plain = dots.dot_general(a, b, DIMS, lax.Precision.HIGHEST)
  for name in dots.SPLITS:
    assert np.asarray(dots.dot_general(a, b, DIMS, name)).tobytes() == np.asarray(plain).tobytes()
  assert dots.einsum('mk,kn->mn', a, b, 'bf16x3').dtype == jnp.bfloat16


@pytest.mark.parametrize('name', ['bf16x2', 'HIGHEST', None])
def test_unknown_precision_is_refused(name):
  a, b = _operands(k=256)
  with pytest.raises(ValueError, match='precision'):
    dots.dot_general(a, b, DIMS, name)
  with pytest.raises(ValueError, match='precision name'):
    dots.from_name(name)
