"""docs/examples/kerple_log.py: a distance-bias scheme added end to end, as docs/positions.md says.

Registered from outside the library, it runs on the tiny model under XLA and
under the Pallas kernels (interpreted on CPU), and a block grafted at
another offset equals a fresh computation there byte for byte.
"""

import importlib.util
import pathlib

import numpy as np
import pytest

from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import positions
from graftjax.models.gemma import schemes
from graftjax.studies.position import relocation

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'kerple_log.py'
BLOCK, CONT = list(range(10, 16)), list(range(40, 43))
LAYOUT = relocation.Layout(capacity=64, chunk_size=3)  # one chunk shape: one Pallas compile
OFFSETS = (64, 4096)


@pytest.fixture(scope='module')
def kerple():
  spec = importlib.util.spec_from_file_location('kerple_log', EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  scheme = module.register()
  yield module
  schemes.unregister(scheme.name)


def same_bytes(a, b):
  return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_registered_with_its_declaration(kerple):
  scheme = schemes.get('kerple_log')
  assert scheme is kerple.KERPLE_LOG and scheme.relocation_exact
  assert scheme.keys == schemes.Keys.PLAIN and scheme.uses_tables
  assert kerple.register() is scheme  # registering again is a no-op


def test_bias_table_follows_the_formula(kerple):
  model = gemma_model.tiny(position_scheme='kerple_log')
  table = np.asarray(model.tables[positions.BIAS])
  heads = model.config.num_heads
  assert table.shape == (heads, model.table_size) and table.dtype == np.float32
  d = np.arange(model.table_size)
  for n in range(heads):
    want = -(1.0 + n) * np.log(1.0 + 0.5**n * d)
    np.testing.assert_allclose(table[n], want, rtol=1e-6, atol=1e-6)
  assert (table[:, 0] == 0).all() and (np.diff(table, axis=1) < 0).all()


@pytest.mark.slow
@pytest.mark.parametrize('impl', ['xla', 'pallas'])
def test_relocation_is_exact(kerple, impl):
  model = gemma_model.tiny(position_scheme='kerple_log', impl=impl)
  for offset in OFFSETS:
    fresh = relocation.fresh_at(model, BLOCK, CONT, offset, LAYOUT)
    assert np.isfinite(fresh).all()
    assert same_bytes(relocation.relocated_to(model, BLOCK, CONT, offset, LAYOUT), fresh), offset
    assert same_bytes(relocation.own_position(model, BLOCK, CONT, offset, LAYOUT), fresh), offset


def test_pallas_computes_the_xla_model_and_the_bias_matters(kerple):
  model = gemma_model.tiny(position_scheme='kerple_log')
  xla = relocation.fresh_at(model, BLOCK, CONT, OFFSETS[0], LAYOUT)
  pallas = relocation.fresh_at(model.with_impl('pallas'), BLOCK, CONT, OFFSETS[0], LAYOUT)
  np.testing.assert_allclose(pallas, xla, rtol=1e-5, atol=1e-5)
  nope = relocation.fresh_at(model.with_position_scheme('nope'), BLOCK, CONT, OFFSETS[0], LAYOUT)
  assert np.abs(nope - xla).max() > 1e-3
