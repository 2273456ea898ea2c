"""transformers' own Gemma 4 defaults: the config.json of `Gemma4Config()` loads, and so does
its structure at reduced width.

tests/fixtures/gemma4_transformers_defaults.json is `Gemma4Config().to_json_string()` of
transformers 5.25 (every field, written by scripts/reference/make_gemma4_saved_fixture.py): a
multimodal config (no `architectures`, `per_layer_config` keyed by zero-padded layer indices)
whose text model has per-layer inputs, no kv sharing and no final soft-capping. The saved
case `defaults_like` (tests/fixtures/gemma4_saved/) is that structure at width 32, whose logits
test_hf_config_saved.py matches against transformers'.
"""

import json
import pathlib

import numpy as np
from graftjax.models.gemma import hf_config, model

_FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'fixtures'
_DEFAULTS = _FIXTURES / 'gemma4_transformers_defaults.json'
_SAVED = _FIXTURES / 'gemma4_saved' / 'defaults_like' / 'config.json'
# Fields that say what a Gemma 4 computes rather than how wide it is.
STRUCTURE = (
  'attention_k_eq_v',
  'enable_moe_block',
  'final_logit_softcapping',
  'hidden_activation',
  'num_kv_shared_layers',
  'rope_parameters',
  'use_bidirectional_attention',
  'use_double_wide_mlp',
)


def _defaults():
  return json.loads(_DEFAULTS.read_text())


def _global_width(text):
  widths = {entry['head_dim'] for entry in text['per_layer_config'].values()}
  assert len(widths) == 1
  return widths.pop()


def test_the_defaults_are_read_as_transformers_wrote_them():
  raw = _defaults()
  text = raw['text_config']
  assert raw['architectures'] is None and raw['model_type'] == 'gemma4'
  assert any(key != str(int(key)) for key in text['per_layer_config'])  # zero-padded indices
  config = hf_config.config_from_hf(raw)
  assert (config.embed_dim, config.hidden_dim) == (text['hidden_size'], text['intermediate_size'])
  assert (config.num_layers, config.vocab_size) == (text['num_hidden_layers'], text['vocab_size'])
  assert (config.num_heads, config.num_kv_heads) == (
    text['num_attention_heads'],
    text['num_key_value_heads'],
  )
  assert config.head_dim == text['head_dim'] and config.global_head_dim == _global_width(text)
  assert config.per_layer_input_dim == text['hidden_size_per_layer_input']
  assert config.final_logit_softcap is None is text['final_logit_softcapping']
  assert config.num_kv_shared_layers == text['num_kv_shared_layers']
  globals_ = [i for i, t in enumerate(text['layer_types']) if t == 'full_attention']
  assert [int(key) for key in sorted(text['per_layer_config'])] == globals_
  assert [i for i in range(config.num_layers) if config.is_global(i)] == globals_


def test_the_saved_case_has_the_structure_of_the_defaults():
  text, saved = _defaults()['text_config'], json.loads(_SAVED.read_text())
  assert {k: saved[k] for k in STRUCTURE} == {k: text[k] for k in STRUCTURE}
  assert bool(saved['hidden_size_per_layer_input']) == bool(text['hidden_size_per_layer_input'])
  period = lambda types: types.index('full_attention') + 1
  assert period(saved['layer_types']) == period(text['layer_types'])
  ratio = lambda c: c['num_attention_heads'] / c['num_key_value_heads']
  assert ratio(saved) == ratio(text)
  assert _global_width(saved) / saved['head_dim'] == _global_width(text) / text['head_dim']


def test_the_defaults_at_reduced_width_run():
  raw = _defaults()
  text = raw['text_config']
  layers = text['layer_types'].index('full_attention') + 1
  text.update(
    hidden_size=32,
    intermediate_size=64,
    vocab_size=256,
    vocab_size_per_layer_input=256,
    num_hidden_layers=layers,
    layer_types=text['layer_types'][:layers],
    hidden_size_per_layer_input=8,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=8,
    per_layer_config={f'{layers - 1:02d}': {'head_dim': 32}},
  )
  config = hf_config.config_from_hf(raw)
  assert config.global_head_dim == 32 and config.final_logit_softcap is None
  m = model.random(config, seed=0)
  logits, _ = m.prefill(np.arange(2, 14), cache=m.init_cache(capacity=64), chunk_size=12)
  assert np.isfinite(np.asarray(logits)).all()
