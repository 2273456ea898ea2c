"""Our Gemma 3 against transformers' Gemma3ForCausalLM, every size's features.

The fixtures (tests/fixtures/gemma3_parity/*.json, made by
scripts/reference/make_gemma3_parity_fixture.py with torch, which these
tests do not need) hold transformers' float32 logits for our seeded random
weights, exported as a safetensors checkpoint that transformers loaded with
its own `from_pretrained`. Each fixture carries the config.json and seed that
regenerate the weights. Reduced cases keep a size's structure (kv heads,
head_dim, query_pre_attn_scalar, sliding window, linear rope scaling) at
width 64 and run past the window; `1b_full` is the published 1B config, whose
first `FULL_1B_TOKENS` tokens are compared (its weights, drawn anew, are the cost).

Negative tests show the comparison has teeth: without the 4B's rope scaling,
or with the 27B's queries scaled by head_dim instead of 168, the 2e-3
tolerance breaks.
"""

import json
import pathlib

import jax
import numpy as np
import pytest

from graftjax.models.gemma import hf_config
from graftjax.models.gemma import model

_FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'gemma3_parity'
TOLERANCE = 2e-3
REDUCED = ('1b_reduced', '4b_reduced', '12b_reduced', '27b_reduced')
FULL_1B_TOKENS = 64


def _fixture(name):
  """The case's recorded outputs: arrays (float32 logits, int32 ids) and its `meta`."""
  data = json.loads((_FIXTURES / f'{name}.json').read_text())
  for key, value in data.items():
    if key != 'meta':
      data[key] = np.asarray(value, np.float32 if key.endswith('logits') else np.int32)
  return data


def _logits(config, seed, tokens):
  """Our float32 logits [T, V] for the case's regenerated weights."""
  m = model.random(config, seed=seed)
  capacity = -(-len(tokens) // 64) * 64
  cache = m.init_cache(capacity=capacity)
  logits, _ = m.prefill(tokens, cache=cache, chunk_size=len(tokens), logits='all')
  return np.asarray(logits[0]), m.params_digest


def _compare(fx, logits):
  """(max |Δlogit| over subset and top-20, argmax agreement) at the positions computed."""
  rows = fx['positions'] < len(logits)
  ours = logits[fx['positions'][rows]]
  subset = np.abs(ours[:, fx['subset_ids']] - fx['subset_logits'][rows]).max()
  top_ours = np.take_along_axis(ours, fx['top_ids'][rows], axis=-1)
  top = np.abs(top_ours - fx['top_logits'][rows]).max()
  agree = float(np.mean(np.argmax(ours, axis=-1) == fx['argmax'][rows]))
  return float(max(subset, top)), agree


def _case(name, length=None, **overrides):
  """(fixture, our logits for its first `length` tokens, our params digest)."""
  fx = _fixture(name)
  config = hf_config.config_from_hf(fx['meta']['config_json'])
  if overrides:
    config = config.replace(**overrides)
  logits, digest = _logits(config, fx['meta']['seed'], fx['tokens'][:length])
  return fx, logits, digest


@pytest.mark.parametrize('name', REDUCED)
def test_reduced_sizes_match_transformers(name):
  fx, logits, digest = _case(name)
  assert digest == fx['meta']['params_digest']  # the very weights transformers ran
  assert (
    len(fx['positions']) >= 200
    and fx['positions'].max() >= fx['meta']['config_json']['sliding_window']
  )
  max_diff, agree = _compare(fx, logits)
  assert max_diff <= TOLERANCE, f'{name}: max |dlogit| {max_diff}'
  assert agree == 1.0, f'{name}: argmax agreement {agree}'


@pytest.mark.slow
def test_full_1b_config_matches_transformers():
  if jax.devices()[0].platform == 'cpu' and _free_gib() < 8:
    pytest.skip(f'the full 1B needs ~8 GiB of free memory, {_free_gib():.1f} GiB free')
  fx, logits, _ = _case('1b_full', length=FULL_1B_TOKENS)
  assert fx['meta']['config_json']['num_hidden_layers'] == 26
  assert (fx['positions'] < FULL_1B_TOKENS).sum() >= FULL_1B_TOKENS // 2
  max_diff, agree = _compare(fx, logits)
  assert max_diff <= TOLERANCE, f'max |dlogit| {max_diff}'
  assert agree == 1.0


def test_without_rope_scaling_the_4b_case_breaks():
  fx, logits, _ = _case('4b_reduced', length=256, rope_scale_factor=1.0)
  assert _compare(fx, logits)[0] > TOLERANCE


def test_with_head_dim_query_scale_the_27b_case_breaks():
  fx, logits, _ = _case('27b_reduced', length=256, query_scale=128**-0.5)
  assert _compare(fx, logits)[0] > TOLERANCE


def _free_gib() -> float:
  try:
    for line in pathlib.Path('/proc/meminfo').read_text().splitlines():
      if line.startswith('MemAvailable:'):
        return int(line.split()[1]) / 2**20
  except OSError:
    pass
  return float('inf')
