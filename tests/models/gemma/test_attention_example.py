"""docs/examples/logged_attention.py: an attention implementation added from outside the library,
as docs/kernels.md says.

Registered under a new name, the tiny model runs on it with the logits' bytes of 'xla' and
another fingerprint; a wrapper that changes the computation is caught by the same comparison.
"""

import importlib.util
import pathlib

import numpy as np
import pytest

from graftjax.kernels import registry
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'examples' / 'logged_attention.py'
TOKENS = list(range(10, 30))  # 20 tokens: more than the window of 8


@pytest.fixture(scope='module')
def example():
  spec = importlib.util.spec_from_file_location('logged_attention', EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  impl = module.register()
  yield module
  registry.unregister('attention', impl.name)


def _logits(model) -> np.ndarray:
  cache = model.init_cache(capacity=64)
  out, _ = model.prefill(TOKENS, cache=cache, chunk_size=4, logits='all')
  return np.asarray(out)


@pytest.fixture(scope='module')
def xla():
  return gemma_model.tiny().with_local_cache('ring', chunk_size=4)


def test_registered_under_its_name(example):
  assert registry.get('attention', 'xla_logged') is example.XLA_LOGGED
  assert example.register() is example.XLA_LOGGED  # registering again is a no-op
  assert 'xla_logged' in registry.names('attention')
  config = config_lib.tiny().with_impl('xla', attention='xla_logged')
  assert config.impl_of('attention') == 'xla_logged' and config.impl_of('matmul') == 'xla'
  assert config.to_json()['attention_impl'] == 'xla_logged'  # the name enters the digest
  with pytest.raises(ValueError, match=r"attention_impl must be one of \('xla', .*'xla_logged'"):
    config_lib.tiny().with_impl('xla', attention='xla_loged')


def test_the_tiny_model_gives_the_bytes_of_xla(example, xla):
  logged = xla.with_impl('xla', attention='xla_logged')
  del example.CALLS[:]
  got, want = _logits(logged), _logits(xla)
  assert np.isfinite(want).all() and got.tobytes() == want.tobytes()
  assert logged.fingerprint != xla.fingerprint
  target = logged.graft_target
  assert not target.chunk_invariant and not target.split_invariant
  # One traced call per layer: the sliding-window layers over their rings, the global one
  # over the whole capacity.
  config = xla.config
  assert len(example.CALLS) == config.num_layers
  ring = xla.ring_capacity(64)
  for layer, (q_shape, k_shape, window) in enumerate(example.CALLS):
    assert window == config.window(layer)
    assert q_shape == (1, 4, config.num_heads, config.head_dim)
    assert k_shape == (1, 64 if window is None else ring, config.num_kv_heads, config.head_dim)
  assert ring < 64


def test_the_comparison_catches_another_computation(example, xla):
  """A wrapper that forgets the window computes other logits: the bytes tell."""

  def windowless(q, k, v, q_positions, k_positions, window, *, precision, **optional):
    return example.logged_attention(
      q, k, v, q_positions, k_positions, None, **optional, precision=precision
    )

  impl = registry.register(registry.Implementation('attention', 'test_windowless', windowless))
  try:
    other = _logits(xla.with_local_cache('full').with_impl('xla', attention='test_windowless'))
  finally:
    registry.unregister('attention', impl.name)
  assert other.tobytes() != _logits(xla.with_local_cache('full')).tobytes()
