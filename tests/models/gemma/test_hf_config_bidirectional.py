"""`use_bidirectional_attention` in a Gemma 4 config.json: 'vision' is read (text stays causal),
other values that change text attention are refused."""

import json
import pathlib

import numpy as np
import pytest
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import hf_config, model
from graftjax.models.gemma import params as params_lib

_SAVED = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'gemma4_saved'
_SIZES = ('gemma4-e2b', 'gemma4-e4b', 'gemma4-31b', 'gemma4-26b-a4b')


def _saved(name='31b_like'):
  return json.loads((_SAVED / name / 'config.json').read_text())


def test_transformers_gives_text_the_same_logits_with_vision():
  for name in ('e2b_like', 'e4b_like', '31b_like', '26b_a4b_like'):
    fixture = json.loads((_SAVED / f'{name}.json').read_text())
    assert fixture['meta']['vision_logits_equal'] is True


def test_vision_reads_as_the_same_text_model():
  raw = _saved()
  assert hf_config.config_from_hf(dict(raw, use_bidirectional_attention='vision')) == (
    hf_config.config_from_hf(raw)
  )


@pytest.mark.parametrize('value', ['all', True, 'text', 1])
def test_other_values_are_refused_naming_the_value(value):
  with pytest.raises(params_lib.CheckpointError, match='use_bidirectional_attention') as e:
    hf_config.config_from_hf(dict(_saved(), use_bidirectional_attention=value))
  assert repr(value) in str(e.value) and "'vision'" in str(e.value)


def _multimodal(name):
  """A `Gemma4ForConditionalGeneration` config.json of a named size, its text config marked
  'vision' as every published one is."""
  text = dict(
    hf_config.config_to_hf(config_lib.get_config(name)), use_bidirectional_attention='vision'
  )
  return {
    'architectures': ['Gemma4ForConditionalGeneration'],
    'model_type': 'gemma4',
    'text_config': text,
    'vision_config': {'model_type': 'gemma4_vision', 'hidden_size': 768},
  }


@pytest.mark.parametrize('name', _SIZES)
def test_each_size_with_vision_loads_and_runs_at_reduced_width(name):
  raw = _multimodal(name)
  assert hf_config.config_from_hf(raw) == config_lib.get_config(name)
  text = raw['text_config']
  layers = 6 + text['num_kv_shared_layers'] // 5
  text.update(
    hidden_size=32,
    intermediate_size=64,
    vocab_size=256,
    vocab_size_per_layer_input=256,
    num_hidden_layers=layers,
    layer_types=text['layer_types'][:layers],
    num_kv_shared_layers=min(text['num_kv_shared_layers'], 2),
    hidden_size_per_layer_input=min(text['hidden_size_per_layer_input'], 8),
    head_dim=16,
    global_head_dim=32,
    num_attention_heads=4,
    num_key_value_heads=min(text['num_key_value_heads'], 2),
    moe_intermediate_size=text['moe_intermediate_size'] and 16,
    num_experts=text['num_experts'] and 8,
    top_k_experts=text['top_k_experts'] and 2,
  )
  m = model.random(hf_config.config_from_hf(raw), seed=0)
  logits, _ = m.prefill(np.arange(2, 12), cache=m.init_cache(capacity=64), chunk_size=10)
  assert np.isfinite(np.asarray(logits)).all()
