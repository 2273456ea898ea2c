"""GemmaConfig.dot_precision: float32 products split into bfloat16 pieces."""

import numpy as np
import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

IDS = np.random.default_rng(2).integers(3, 256, 12).astype(np.int32)
# Two layers, one sliding and one global: both kinds of layer, at a third of the tiny
# model's six layers (the Pallas interpreter's time grows with the layers).
TWO_LAYERS = dict(attention_types=config_lib.attention_pattern(2, 1))


def test_the_default_keeps_its_digest_form():
  """'highest' is absent from the config JSON, so recorded fingerprints still match."""
  cfg = config_lib.tiny()
  assert 'dot_precision' not in cfg.to_json()
  split = cfg.replace(dot_precision='bf16x3')
  assert split.to_json()['dot_precision'] == 'bf16x3'
  assert split.digest() != cfg.digest()
  assert split.replace(dot_precision='highest').digest() == cfg.digest()


def test_unknown_precisions_are_refused():
  with pytest.raises(ValueError, match='dot_precision must be one of'):
    config_lib.tiny().replace(dot_precision='tf32')


@pytest.mark.slow
@pytest.mark.parametrize('impl', ['xla', 'pallas'])
def test_split_logits_repeat_and_stay_close_to_ieee(impl):
  ieee = gemma_model.tiny(impl=impl, **TWO_LAYERS)
  split = ieee.with_dot_precision('bf16x3')
  assert split.fingerprint != ieee.fingerprint

  def logits(model):
    out, _ = model.prefill(IDS, cache=model.init_cache(capacity=64), chunk_size=4, logits='all')
    return np.asarray(out)

  got = logits(split)
  np.testing.assert_array_equal(logits(split), got)  # fresh vs fresh
  want = logits(ieee)
  assert not np.array_equal(got, want)  # the split is another computation...
  np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-3)  # ...close to IEEE float32
