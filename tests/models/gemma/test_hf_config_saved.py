"""Gemma 4 folders written by transformers' own `save_pretrained` load, and match its logits.

transformers 5.25 writes `per_layer_config` (each global layer's `head_dim` and, where it
differs, `num_key_value_heads`) instead of `global_head_dim` / `num_global_key_value_heads`.
The fixtures (tests/fixtures/gemma4_saved/, made by
scripts/reference/make_gemma4_saved_fixture.py with torch, which these tests do not need)
are each size's structure at width 32 with a global head width of 32 (sliding 16): E2B (kv
sharing, per-layer inputs, double-wide MLP), E4B, 31B (K=V, its own global kv heads),
26B-A4B (the same, with experts), and the structure of transformers' own
`Gemma4TextConfig()` defaults (test_hf_config_defaults.py). They hold no weights: each folder's weights_header.json
(tensor names, dtypes, shapes, seed, digest) rebuilds its model.safetensors
(scripts/reference/seeded_weights.py, numpy only), the very file transformers loaded for the
recorded logits (O(10)).
"""

import dataclasses
import importlib.util
import json
import pathlib

import numpy as np
import pytest
from graftjax.models.gemma import hf_config, model
from graftjax.models.gemma import params as params_lib

_ROOT = pathlib.Path(__file__).resolve().parents[3]
_FIXTURES = _ROOT / 'tests' / 'fixtures' / 'gemma4_saved'
TOLERANCE = 2e-3  # as test_gemma4_parity
SIZES = ('e2b_like', 'e4b_like', '31b_like', '26b_a4b_like')
CASES = (*SIZES, 'defaults_like')  # and transformers' own Gemma4TextConfig() defaults


def _seeded_weights():
  path = _ROOT / 'scripts' / 'reference' / 'seeded_weights.py'
  spec = importlib.util.spec_from_file_location('seeded_weights', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


seeded_weights = _seeded_weights()


def _fixture(name):
  data = json.loads((_FIXTURES / f'{name}.json').read_text())
  for key, value in data.items():
    if key != 'meta':
      data[key] = np.asarray(value, np.float32 if key.endswith('logits') else np.int32)
  return data


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
  """name -> the case's folder with its weights rebuilt, made once per module."""
  folders = {}

  def folder(name):
    if name not in folders:
      out, written, recorded = seeded_weights.rebuild(
        _FIXTURES / name, tmp_path_factory.mktemp(name)
      )
      assert written == recorded == _fixture(name)['meta']['weights_sha256'], (
        f'{name}: the rebuilt weights are not those transformers was given (numpy changed?)'
      )
      folders[name] = out
    return folders[name]

  return folder


@pytest.fixture(scope='module')
def loaded(saved):
  """name -> the model `model.load` reads from the rebuilt folder, loaded once per module."""
  models = {}

  def load(name):
    if name not in models:
      models[name] = model.load(weights=saved(name))
    return models[name]

  return load


def _max_diff(m, fx):
  """max |Δlogit| over the recorded subset and top-20 ids, and argmax agreement."""
  tokens = fx['tokens']
  cache = m.init_cache(capacity=-(-len(tokens) // 64) * 64)
  logits, _ = m.prefill(tokens, cache=cache, chunk_size=len(tokens), logits='all')
  ours = np.asarray(logits[0])[fx['positions']]
  subset = np.abs(ours[:, fx['subset_ids']] - fx['subset_logits']).max()
  top = np.abs(np.take_along_axis(ours, fx['top_ids'], axis=-1) - fx['top_logits']).max()
  agree = float(np.mean(np.argmax(ours, axis=-1) == fx['argmax']))
  return float(max(subset, top)), agree


def test_the_fixtures_are_what_transformers_saves_less_the_weights():
  for name in CASES:
    raw = json.loads((_FIXTURES / name / 'config.json').read_text())
    assert raw['transformers_version'].startswith('5.25')
    assert 'per_layer_config' in raw and 'global_head_dim' not in raw
    assert sorted(p.name for p in (_FIXTURES / name).iterdir()) == sorted(
      (*seeded_weights.COPIED, seeded_weights.HEADER_FILE)
    )


@pytest.mark.parametrize('name', CASES)
def test_the_rebuilt_weights_have_the_recorded_header(name, saved):
  header = json.loads((_FIXTURES / name / seeded_weights.HEADER_FILE).read_text())
  rebuilt = saved(name) / seeded_weights.WEIGHTS_FILE
  assert seeded_weights.header_of(rebuilt) == header['tensors']
  assert rebuilt.stat().st_size < 1 << 20


def test_control_another_seed_gives_another_file(tmp_path):
  header = json.loads((_FIXTURES / '31b_like' / seeded_weights.HEADER_FILE).read_text())
  other = seeded_weights.write(tmp_path / 'w.safetensors', header['tensors'], header['seed'] + 1)
  assert other != header['sha256']


@pytest.mark.parametrize('name', CASES)
def test_a_saved_folder_loads_and_matches_transformers(name, loaded):
  fx = _fixture(name)
  m = loaded(name)
  assert m.config.head_dim_of(m.config.num_layers - 1) == 32 != m.config.head_dim
  assert fx['positions'].max() >= m.config.sliding_window  # the tokens run past the window
  max_diff, agree = _max_diff(m, fx)
  assert max_diff <= TOLERANCE, f'{name}: max |dlogit| {max_diff}'
  assert agree == 1.0


def test_the_structure_of_each_saved_size_is_read(loaded):
  e2b, e4b, big, moe = (loaded(n).config for n in SIZES)
  assert e2b.num_kv_shared_layers == 4 and e2b.per_layer_input_dim == 8
  assert e2b.double_wide_shared_mlp and e4b.num_kv_shared_layers == 4
  assert big.k_eq_v(5) and big.kv_heads_of(5) == 1 and big.kv_heads_of(0) == 2
  assert moe.num_experts == 8 and moe.top_k_experts == 2 and moe.k_eq_v(5)
  assert e2b.kv_heads_of(4) == e2b.num_kv_heads  # no kv-head override: the top level's


@pytest.mark.parametrize(
  'name, change',
  [
    ('31b_like', {'global_rotary_fraction': 1.0}),
    ('e2b_like', {'value_norm': False}),
    ('defaults_like', {'final_logit_softcap': 30.0}),
  ],
)
def test_control_a_changed_model_breaks_the_tolerance(name, change, loaded):
  m = loaded(name)
  broken = dataclasses.replace(m, config=m.config.replace(**change))
  max_diff, _ = _max_diff(broken, _fixture(name))
  assert max_diff > TOLERANCE


def test_the_global_width_comes_from_per_layer_config_not_the_default():
  raw = json.loads((_FIXTURES / '31b_like' / 'config.json').read_text())
  config = hf_config.config_from_hf(raw)
  assert (config.global_head_dim, config.num_global_kv_heads) == (32, 1)
  without = {k: v for k, v in raw.items() if k != 'per_layer_config'}
  assert hf_config.config_from_hf(without).global_head_dim == 512  # transformers' default


def _with_per_layer(per_layer):
  raw = json.loads((_FIXTURES / '31b_like' / 'config.json').read_text())
  return dict(raw, per_layer_config=per_layer)


@pytest.mark.parametrize(
  'per_layer, named',
  [
    ({'0': {'head_dim': 32}}, "per_layer_config['0']"),  # a sliding layer
    ({'5': {'intermediate_size': 8}}, 'intermediate_size'),
    ({'5': {'skip': ['mlp']}}, 'skip'),
    ({'9': {'head_dim': 32}}, 'no layer 9'),
    ({'x': {'head_dim': 32}}, 'layer indices'),
    ([1], 'expected an object'),
  ],
)
def test_per_layer_fields_this_model_cannot_have_are_refused(per_layer, named):
  with pytest.raises(params_lib.CheckpointError, match='per_layer_config') as e:
    hf_config.config_from_hf(_with_per_layer(per_layer))
  assert named in str(e.value)


def test_global_layers_of_different_shapes_are_refused():
  raw = json.loads((_FIXTURES / 'e2b_like' / 'config.json').read_text())
  raw['per_layer_config'] = {'4': {'head_dim': 32}, '9': {'head_dim': 64}}
  with pytest.raises(params_lib.CheckpointError, match='global layers differ'):
    hf_config.config_from_hf(raw)


def test_an_override_equal_to_the_top_level_on_a_sliding_layer_is_no_override():
  raw = _with_per_layer({'0': {'head_dim': 16}, '5': {'head_dim': 32, 'num_key_value_heads': 1}})
  assert hf_config.config_from_hf(raw).head_dim_of(0) == 16
