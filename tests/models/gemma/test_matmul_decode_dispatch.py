"""ops.dense sends Pallas calls of <= 16 rows to the decode matmul when a variant is set.

Natively (GPU) the bits must not change, for the variants that
tests/kernels/test_matmul_decode.py shows equal there. In the interpreter an
XLA CPU dot's row bits depend on the tile's shape for some shapes (see that
test), so there the results are only compared within float32 rounding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.kernels import matmul_decode
from graftjax.kernels import matmul_tiles
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops

INTERPRET = jax.default_backend() != 'gpu'
IDS = np.random.default_rng(1).integers(3, 256, 5).astype(np.int32)


@pytest.fixture(autouse=True)
def _forget_programs_traced_here():
  """The variant is read at trace time: programs traced under a patched setting would
  otherwise stay cached and serve later tests (a Pallas invariance test then failed)."""
  yield
  jax.clear_caches()


def _spy(monkeypatch) -> list:
  """Records (x shape, w layout) of every decode-matmul call (at trace time)."""
  calls = []
  real = matmul_decode.matmul_decode

  def spy(x, w, **static):
    calls.append((x.shape, static['w_layout']))
    return real(x, w, **static)

  monkeypatch.setattr(matmul_decode, 'matmul_decode', spy)
  return calls


def _assert_same(got, want):
  """Bit-equal natively; within float32 rounding in the interpreter."""
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  if INTERPRET:
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  else:
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_few_rows_go_to_the_decode_kernel_with_the_same_bits(monkeypatch):
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((32, 4, 16)) / 6, jnp.float32)
  xs = [jnp.asarray(rng.standard_normal((1, t, 32)), jnp.float32) for t in (1, 5, 17)]
  monkeypatch.setattr(matmul_tiles, '_MATMUL_DECODE_OVERRIDE', 'off')
  calls = _spy(monkeypatch)
  want = [ops.dense(x, w, impl='pallas', precision='highest') for x in xs]
  assert not calls
  monkeypatch.setattr(matmul_tiles, '_MATMUL_DECODE_OVERRIDE', 'rows')
  got = [ops.dense(x, w, impl='pallas', precision='highest') for x in xs]
  assert calls == [((1, 32), 'kn'), ((5, 32), 'kn')]  # 17 rows stay on the prefill kernel
  for g, h in zip(got, want):
    assert g.shape == h.shape
    _assert_same(g, h)


_OFF_LOGITS = []  # the prefill kernel's logits, computed once


def _logits(model, monkeypatch, setting):
  monkeypatch.setattr(matmul_tiles, '_MATMUL_DECODE_OVERRIDE', setting)
  jax.clear_caches()  # the setting is read at trace time
  out, _ = model.prefill(IDS, cache=model.init_cache(capacity=64), chunk_size=1, logits='all')
  return np.asarray(out)


@pytest.mark.slow
@pytest.mark.parametrize('variant', matmul_tiles.MATMUL_DECODE_VARIANTS)
def test_pallas_model_keeps_its_bits(monkeypatch, variant):
  if INTERPRET and variant == 'transposed':
    pytest.skip('the transposed tile runs natively only (tests/kernels/test_matmul_decode.py)')
  # The tiny model at two layers (one sliding, one global): every dense kind, few programs.
  model = gemma_model.tiny(attention_types=config_lib.attention_pattern(2, 1), impl='pallas')
  if not _OFF_LOGITS:
    _OFF_LOGITS.append(_logits(model, monkeypatch, 'off'))
  calls = _spy(monkeypatch)
  got = _logits(model, monkeypatch, variant)
  assert {shape[0] for shape, _ in calls} == {1}
  assert {layout for _, layout in calls} == {'kn', 'nk'}  # nk: the tied output projection
  _assert_same(got, _OFF_LOGITS[0])


def test_variant_comes_from_the_shown_table_unless_overridden(monkeypatch):
  monkeypatch.setattr(matmul_tiles, '_MATMUL_DECODE_OVERRIDE', None)
  monkeypatch.setattr(
    matmul_tiles, 'MATMUL_DECODE_SHOWN', {(jax.default_backend(), 'float32'): 'rows'}
  )
  assert matmul_tiles.matmul_decode_variant(jnp.float32) == 'rows'
  assert matmul_tiles.matmul_decode_variant(jnp.bfloat16) is None
  monkeypatch.setattr(matmul_tiles, '_MATMUL_DECODE_OVERRIDE', 'off')
  assert matmul_tiles.matmul_decode_variant(jnp.float32) is None
  assert ops.matmul_decode_variant is matmul_tiles.matmul_decode_variant  # what results record


def test_bad_override_is_refused(monkeypatch):
  monkeypatch.setenv(matmul_tiles.MATMUL_DECODE_ENV, 'columns')
  with pytest.raises(ValueError, match='GRAFTJAX_MATMUL_DECODE'):
    matmul_tiles._decode_override()
  monkeypatch.setenv(matmul_tiles.MATMUL_DECODE_ENV, 'transposed')
  assert matmul_tiles._decode_override() == 'transposed'
