"""Our Gemma 4 against transformers' Gemma4ForCausalLM, every size's structure.

The fixtures (tests/fixtures/gemma4_parity/*.json, made by
scripts/reference/make_gemma4_parity_fixture.py with torch, which these
tests do not need) hold transformers' float32 logits and greedy ids for our
seeded random weights, exported as a `Gemma4ForCausalLM` safetensors
checkpoint that transformers loaded with its own `from_pretrained`. Each
fixture carries the config.json and seed that regenerate the weights. The
reduced cases keep a size's structure at width 64: E2B (4 : 1 layers, kv
sharing with the double-wide MLP, per-layer inputs), E4B (5 : 1, kv sharing,
per-layer inputs), 31B (K=V global layers with their own kv heads), 26B-A4B
(the same, and 128 experts, top 8); all with global head size 512, partial
rotary, the value norm, attention scaling 1 and the soft-cap, run past the
window. No full-size Gemma 4 fits this CPU in float32 (E2B alone is ~20 GB).

Negative tests show the comparison has teeth: without the value norm, with
full rotary on global layers, without the soft-cap, the per-layer inputs or
the layer scalar, or with values from another projection than the keys', the
2e-3 tolerance breaks.
"""

import dataclasses
import functools
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
from graftjax.models.gemma import hf_config, model

_FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'gemma4_parity'
TOLERANCE = 2e-3
CASES = ('e2b_reduced', 'e4b_reduced', '31b_reduced', '26b_reduced')


def _fixture(name):
  """The case's recorded outputs: arrays (float32 logits, int32 ids) and its `meta`."""
  data = json.loads((_FIXTURES / f'{name}.json').read_text())
  for key, value in data.items():
    if key not in ('meta', 'greedy_prefix'):
      data[key] = np.asarray(value, np.float32 if key.endswith('logits') else np.int32)
  return data


# Every prefill runs chunks of one shape over one capacity (the 320 tokens of a case, and the
# 48-token greedy prefix), so a model compiles one prefill program and one decode step.
CHUNK, CAPACITY = 16, 320


def _logits(m, tokens):
  """Our float32 logits [T, V] of `tokens`, in chunks of `CHUNK`."""
  logits, _ = m.prefill(
    tokens, cache=m.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='all'
  )
  return np.asarray(logits[0])


def _compare(fx, logits):
  """(max |Δlogit| over subset and top-20, argmax agreement) at the positions computed."""
  rows = fx['positions'] < len(logits)
  ours = logits[fx['positions'][rows]]
  subset = np.abs(ours[:, fx['subset_ids']] - fx['subset_logits'][rows]).max()
  top_ours = np.take_along_axis(ours, fx['top_ids'][rows], axis=-1)
  top = np.abs(top_ours - fx['top_logits'][rows]).max()
  agree = float(np.mean(np.argmax(ours, axis=-1) == fx['argmax'][rows]))
  return float(max(subset, top)), agree


@functools.lru_cache(maxsize=len(CASES))
def _random(name):
  fx = _fixture(name)
  return model.random(hf_config.config_from_hf(fx['meta']['config_json']), seed=fx['meta']['seed'])


def _model(name, **overrides):
  """The case's model (its weights drawn once), with config fields changed by `overrides`."""
  m = _random(name)
  return dataclasses.replace(m, config=m.config.replace(**overrides)) if overrides else m


def _greedy(m, prefix, steps):
  """Greedy ids after `prefix`: one prefill, then one token per forward (our cache)."""
  cache = m.init_cache(capacity=CAPACITY)
  logits, cache = m.prefill(prefix, cache=cache, chunk_size=CHUNK, logits='all')
  logits = logits[:, -1]
  out = []
  for i in range(steps):
    token = int(jnp.argmax(logits[0]))
    out.append(token)
    position = len(prefix) + i
    logits, cache = m.forward([[token]], [[position]], cache, logits='last')
  return out


# The 31B case runs in the fast tier; the others take tens of seconds each on two cores.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
  'name', [n if n == '31b_reduced' else pytest.param(n, marks=_SLOW) for n in CASES]
)
def test_reduced_sizes_match_transformers(name):
  fx = _fixture(name)
  m = _model(name)
  assert m.params_digest == fx['meta']['params_digest']  # the very weights transformers ran
  assert fx['positions'].max() >= fx['meta']['config_json']['sliding_window']
  max_diff, agree = _compare(fx, _logits(m, fx['tokens']))
  assert max_diff <= TOLERANCE, f'{name}: max |dlogit| {max_diff}'
  assert agree == 1.0, f'{name}: argmax agreement {agree}'
  # Greedy decoding, one token per forward over our cache, against transformers' generate.
  prefix = fx['tokens'][: fx['greedy_prefix']]
  assert _greedy(m, prefix, len(fx['greedy_ids'])) == fx['greedy_ids'].tolist()


@pytest.mark.parametrize(
  'name, change',
  [
    ('31b_reduced', {'value_norm': False}),
    ('31b_reduced', {'global_rotary_fraction': 1.0}),
    ('26b_reduced', {'final_logit_softcap': None}),
    ('e2b_reduced', {'per_layer_input_dim': 0}),
    ('e4b_reduced', {'layer_scalar': False}),
  ],
)
def test_without_a_feature_the_case_breaks(name, change):
  fx = _fixture(name)
  max_diff, _ = _compare(fx, _logits(_model(name, **change), fx['tokens'][:160]))
  assert max_diff > TOLERANCE, f'{name} with {change}: max |dlogit| {max_diff}'


def test_values_from_another_projection_break_the_31b_case():
  """K=V: values from a projection other than the keys' (the global layer's first query
  heads) break parity."""
  fx = _fixture('31b_reduced')
  m = _model('31b_reduced')
  layer = m.config.num_layers - 1
  weights = m.params['layers'][layer]
  heads = m.config.kv_heads_of(layer)
  layers = list(m.params['layers'])
  layers[layer] = dict(weights, v=weights['q'][:, :heads])
  broken = dataclasses.replace(
    m, config=m.config.replace(attention_k_eq_v=False), params=dict(m.params, layers=tuple(layers))
  )
  max_diff, _ = _compare(fx, _logits(broken, fx['tokens'][:160]))
  assert max_diff > TOLERANCE
