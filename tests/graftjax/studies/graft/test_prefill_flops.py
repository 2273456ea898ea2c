"""prefill_flops: the matmul weights from the params' own shapes, attention by brute force."""

import numpy as np
import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import params as params_lib
from graftjax.studies.graft import prefill_flops

TABLES = {'embedding', 'per_layer_embedding'}  # looked up, not multiplied
EXPERTS = {'experts_gate_up', 'experts_down'}  # [E, ...]: top-k of E count


def _matmul_weights(config) -> float:
  total = 0.0
  for spec in params_lib.param_specs(config):
    if len(spec.shape) < 2 or spec.key[-1] in TABLES:
      continue
    share = config.top_k_experts / config.num_experts if spec.key[-1] in EXPERTS else 1
    total += np.prod(spec.shape) * share
  return total


def _attention(config, tokens: int, start: int) -> int:
  total = 0
  for layer in range(config.num_layers):
    for p in range(start, start + tokens):
      keys = [
        q for q in range(p + 1) if config.window(layer) is None or q > p - config.window(layer)
      ]
      total += 4 * config.num_heads * config.head_dim_of(layer) * len(keys)
  return total


@pytest.mark.parametrize(
  'make',
  [
    config_lib.tiny,
    config_lib.tiny_gemma4_31b,
    config_lib.tiny_gemma4_26b,
    config_lib.tiny_gemma4_e2b,
  ],
)
@pytest.mark.parametrize('tokens, start, logits', [(1, 0, 1), (21, 0, 0), (13, 6, 2)])
def test_prefill_flops_counts_the_params_shapes_and_every_key_seen(make, tokens, start, logits):
  config = make()
  assert prefill_flops.matmul_params_per_token(config) == _matmul_weights(config)
  want = (
    2 * _matmul_weights(config) * tokens
    + _attention(config, tokens, start)
    + 2 * config.embed_dim * config.vocab_size * logits
  )
  got = prefill_flops.prefill_flops(config, tokens, start=start, logits_tokens=logits)
  assert got == want


def test_a_dense_gemma3_counts_twice_its_weights_less_the_table_per_token():
  config = config_lib.gemma3_270m()
  params = sum(np.prod(s.shape) for s in params_lib.param_specs(config) if len(s.shape) > 1)
  embedding = config.vocab_size * config.embed_dim
  assert prefill_flops.matmul_params_per_token(config) == params - embedding


def test_peak_flops_on_cpu_is_none_with_a_reason():
  assert prefill_flops.peak_flops('NVIDIA H100 80GB HBM3', 'gpu') == (989.4e12, None)
  assert prefill_flops.peak_flops('NVIDIA H200', 'gpu') == (989.4e12, None)
  peak, why = prefill_flops.peak_flops('cpu', 'cpu')
  assert peak is None and 'CPU' in why
  peak, why = prefill_flops.peak_flops('Some GPU', 'gpu')
  assert peak is None and 'Some GPU' in why
