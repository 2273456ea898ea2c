"""Per-op implementations: each op can run on its Pallas kernel alone."""

import json

from absl import flags
import numpy as np
import pytest

from graftjax.studies.common import impl_flags
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

IDS = np.random.default_rng(1).integers(3, 256, 12).astype(np.int32)
# Two layers, one sliding and one global: each op's code paths, at a third of the tiny
# model's six layers (the Pallas interpreter's time grows with the layers).
TWO_LAYERS = dict(attention_types=config_lib.attention_pattern(2, 1))


def test_single_impl_configs_keep_their_digest_form():
  """No per-op keys unless set, so fingerprints of recorded blocks still match."""
  for impl in config_lib.IMPLS:
    assert not any(key.endswith('_impl') for key in config_lib.tiny(impl=impl).to_json())
  mixed = config_lib.tiny().with_impl('xla', attention='pallas').to_json()
  assert mixed['attention_impl'] == 'pallas' and 'matmul_impl' not in mixed


def test_settings_are_normalized_to_one_form():
  cfg = config_lib.tiny()
  every_op = cfg.with_impl('xla', **{op: 'pallas' for op in config_lib.OPS})
  assert (
    every_op == cfg.with_impl('pallas') and every_op.digest() == cfg.with_impl('pallas').digest()
  )
  assert cfg.with_impl('pallas', norm='pallas') == cfg.with_impl('pallas')
  assert cfg.with_impl('xla', norm='pallas').with_impl('xla') == cfg  # with_impl sets every op
  mixed = cfg.with_impl('pallas', rotary='xla')
  assert [mixed.impl_of(op) for op in config_lib.OPS] == ['pallas', 'pallas', 'pallas', 'xla']


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match='impl must be one of'):
    config_lib.tiny(impl='triton')
  with pytest.raises(ValueError, match='attention_impl must be one of'):
    config_lib.tiny(attention_impl='cuda')
  with pytest.raises(ValueError, match='unknown ops'):
    config_lib.tiny().with_impl('xla', softmax='pallas')
  with pytest.raises(ValueError, match='unknown op'):
    config_lib.tiny().impl_of('softmax')


@pytest.mark.slow
@pytest.mark.parametrize('op', config_lib.OPS)
def test_one_op_on_pallas_runs_and_stays_close_to_xla(op):
  xla = gemma_model.tiny(**TWO_LAYERS)
  mixed = xla.with_impl('xla', **{op: 'pallas'})
  assert mixed.fingerprint != xla.fingerprint
  cache = lambda m: m.init_cache(capacity=64)
  want, _ = xla.prefill(IDS, cache=cache(xla), chunk_size=4, logits='all')
  got, _ = mixed.prefill(IDS, cache=cache(mixed), chunk_size=4, logits='all')
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)


def test_flags_give_with_impl_arguments():
  values = flags.FlagValues()
  parsed = impl_flags.define(default='pallas', flag_values=values)
  values(['prog', '--rotary_impl=xla'])
  assert parsed.value == ('pallas', {'rotary': 'xla'})
  assert parsed.as_json() == {
    'attention': 'pallas',
    'matmul': 'pallas',
    'norm': 'pallas',
    'rotary': 'xla',
  }
  assert json.dumps(parsed.as_json())  # recorded in results as it is
  model = parsed.apply(gemma_model.tiny())
  assert model.config == config_lib.tiny().with_impl('pallas', rotary='xla')


def test_xla_split_is_an_attention_impl_close_to_xla():
  xla = gemma_model.tiny(**TWO_LAYERS)
  split = xla.with_impl('xla', attention='xla_split')
  assert split.config.impl_of('attention') == 'xla_split' and split.fingerprint != xla.fingerprint
  with pytest.raises(ValueError, match='matmul_impl must be one of'):
    config_lib.tiny(matmul_impl='xla_split')
  with pytest.raises(ValueError, match='impl must be one of'):
    config_lib.tiny(impl='xla_split')
  cache = lambda m: m.init_cache(capacity=64)
  want, _ = xla.prefill(IDS, cache=cache(xla), chunk_size=4, logits='all')
  got, _ = split.prefill(IDS, cache=cache(split), chunk_size=4, logits='all')
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)
