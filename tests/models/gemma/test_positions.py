"""The position scheme registry: declarations, refusals, and what each scheme computes."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import positions
from graftjax.models.gemma import schemes
from graftjax.studies.position import position_sweep
from graftjax.studies.position import training

BUILT_IN = ('rope', 'rope_f64', 'rope_relative', 'alibi', 'nope')
# tokenizer.digest() of gemma-3-270m (tests/models/gemma/test_tokenizer.py checks it).
GEMMA3_VOCAB_DIGEST = 'bc9f5616aeb3698b0d4456a1e9f9e6a0f0b9d7f92f52b8b8d4b981ee40c03cac'


def test_built_in_schemes_are_registered():
  assert set(BUILT_IN) <= set(schemes.names())
  for name in schemes.names():
    scheme = schemes.get(name)
    assert scheme.name == name and scheme.summary
    assert scheme.relocation_exact == (scheme.keys != schemes.Keys.ABSOLUTE)


@pytest.mark.parametrize(
  'call',
  [
    lambda: schemes.get('rotary9'),
    lambda: schemes.get(schemes.Scheme('rotary9', schemes.Keys.PLAIN, relocation_exact=True)),
    lambda: config_lib.tiny(position_scheme='rotary9'),
    lambda: gemma_model.tiny().with_position_scheme('rotary9'),
    lambda: positions.rotate_for_cache(
      jnp.ones((1, 2, 1, 4)), jnp.zeros((1, 2), jnp.int32), scheme='rotary9', theta=1e4
    ),
    lambda: positions.relocate_keys(jnp.ones((2, 1, 4)), 3, scheme='rotary9', theta=1e4),
    lambda: training.small_config('tiny', scheme='rotary9'),
  ],
)
def test_unknown_scheme_is_an_error_naming_the_registered_ones(call):
  with pytest.raises(schemes.UnknownSchemeError, match=r"'rotary9'.*registered: \(.*'alibi'"):
    call()


def test_a_declaration_other_than_the_registered_one_is_unknown():
  other = schemes.Scheme('alibi', schemes.Keys.PLAIN, relocation_exact=True)
  with pytest.raises(schemes.UnknownSchemeError, match='registered'):
    schemes.get(other)
  assert schemes.get(schemes.ALIBI) is schemes.ALIBI


def test_contradictory_declarations_are_refused():
  bad = [
    schemes.Scheme(
      'absolute_exact', schemes.Keys.ABSOLUTE, relocation_exact=True, angles='float32'
    ),
    schemes.Scheme('plain_inexact', schemes.Keys.PLAIN, relocation_exact=False),
    schemes.Scheme('no_angles', schemes.Keys.ABSOLUTE, relocation_exact=False),
    schemes.Scheme('odd_angles', schemes.Keys.ABSOLUTE, relocation_exact=False, angles='float16'),
    schemes.Scheme('plain_angles', schemes.Keys.PLAIN, relocation_exact=True, angles='float64'),
    schemes.Scheme('not a name', schemes.Keys.PLAIN, relocation_exact=True),
    schemes.Scheme('alibi', schemes.Keys.PLAIN, relocation_exact=True),  # taken
  ]
  for scheme in bad:
    with pytest.raises(schemes.SchemeDeclarationError, match=repr(scheme.name)):
      schemes.register(scheme)
  assert schemes.names()[: len(BUILT_IN)] == BUILT_IN
  assert schemes.register(schemes.ALIBI) is schemes.ALIBI  # the same declaration again


def test_a_bias_of_the_wrong_shape_or_not_finite_is_refused():
  for bias in (
    lambda d, n: np.zeros((n, d.size), np.float64),
    lambda d, n: np.zeros((d.size,), np.float32),
    lambda d, n: np.full((n, d.size), np.inf, np.float32),
  ):
    scheme = schemes.Scheme('odd_bias', schemes.Keys.PLAIN, relocation_exact=True, bias=bias)
    with pytest.raises(schemes.SchemeDeclarationError, match='odd_bias'):
      positions.bias_table(scheme, 4, 16)


def test_alibi_bias_table_is_minus_slope_times_distance():
  model = gemma_model.tiny(position_scheme='alibi')
  table = np.asarray(model.tables[positions.BIAS])
  slopes = np.asarray(schemes.alibi_slopes(model.config.num_heads))
  d = np.arange(model.table_size, dtype=np.float32)
  np.testing.assert_array_equal(table, -(slopes[:, None] * d[None, :]))
  assert table.dtype == np.float32


@pytest.mark.parametrize('name', BUILT_IN)
def test_tables_are_built_exactly_for_what_the_scheme_declares(name):
  scheme = schemes.get(name)
  tabs = positions.tables(config_lib.tiny(position_scheme=name), 32)
  assert (tabs is not None) == scheme.uses_tables
  assert (tabs is not None and positions.BIAS in tabs) == (scheme.bias is not None)
  if tabs is not None:
    assert positions.table_rows(tabs) == 32


def test_a_bias_scheme_refuses_positions_beyond_its_table():
  model = gemma_model.tiny(position_scheme='alibi')
  model = dataclasses.replace(model, table_size=32)
  model.forward(np.full((1, 1), 5), np.full((1, 1), 31), model.init_cache(capacity=8))
  with pytest.raises(ValueError, match='position table of 32 rows'):
    model.forward(np.full((1, 1), 5), np.full((1, 1), 32), model.init_cache(capacity=8))


def test_the_config_records_the_scheme_name():
  for name in BUILT_IN:
    cfg = config_lib.tiny(position_scheme=name)
    assert cfg.position_scheme == name and cfg.to_json()['position_scheme'] == name
    assert json.dumps(cfg.to_json())  # a plain string, as before the registry


def test_committed_fingerprints_are_unchanged():
  """Fingerprints in committed results recompute from their parts under the registry."""
  root = position_sweep.REPO_ROOT
  sweeps = position_sweep.committed(root, 'relocation_270m_*.json')
  records = position_sweep.committed(root, 'trained_*_model.json')
  if not sweeps or not records:
    pytest.skip('no committed relocation sweep of gemma3-270m or trained-model record here')
  for path in sweeps:
    for entry in json.loads(path.read_text())['models']:
      config = config_lib.gemma3_270m(position_scheme=entry['scheme'])
      digest = gemma_model.model_fingerprint(
        config.digest(), entry['params_sha256'], GEMMA3_VOCAB_DIGEST
      )
      assert digest == entry['fingerprint'], (path.name, entry['scheme'])
  for path in records:
    record = json.loads(path.read_text())
    config = training.config_from_json(record['config'])
    digest = gemma_model.model_fingerprint(config.digest(), record['params_sha256'], 'none')
    assert digest == record['model_fingerprint'], path.name


def test_the_guide_covers_every_built_in_scheme_and_quotes_the_example():
  docs = position_sweep.REPO_ROOT / 'docs'
  guide = (docs / 'positions.md').read_text()
  for name in BUILT_IN:
    assert f'| `{name}` |' in guide, name
  example = (docs / 'examples' / 'kerple_log.py').read_text()
  declaration = guide.split('KERPLE_LOG = schemes.Scheme(')[1].split('```')[0]
  assert 'KERPLE_LOG = schemes.Scheme(' + declaration in example
