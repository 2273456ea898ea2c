"""Gemma 4 configs and checkpoints: named sizes, config.json, safetensors round trips."""

import json

import jax
import numpy as np
import pytest
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import hf_config, safetensors_io
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import params as params_lib
from safetensors.numpy import load_file, save_file

G = config_lib.AttentionType.GLOBAL


def test_named_sizes_have_the_published_structure():
  e2b, e4b = config_lib.gemma4_e2b(), config_lib.gemma4_e4b()
  big, moe = config_lib.gemma4_31b(), config_lib.gemma4_26b_a4b()
  assert [c.num_layers for c in (e2b, e4b, big, moe)] == [35, 42, 60, 30]
  assert [sum(t == G for t in c.attention_types) for c in (e2b, e4b, big, moe)] == [7, 7, 10, 5]
  assert all(c.attention_types[-1] == G for c in (e2b, e4b, big, moe))
  assert (e2b.kv_source(15), e2b.kv_source(19), e2b.kv_source(34)) == (13, 14, 14)
  assert len(e4b.cached_layers) == 24 and e4b.kv_source(41) == 23
  assert e2b.mlp_dim(0) == 6144 and e2b.mlp_dim(20) == 12_288 and e4b.mlp_dim(30) == 10_240
  assert (big.kv_heads_of(0), big.head_dim_of(0), big.kv_heads_of(5), big.head_dim_of(5)) == (
    16,
    256,
    4,
    512,
  )
  assert big.k_eq_v(5) and not big.k_eq_v(0) and big.rotary_fraction(5) == 0.25
  assert (moe.num_experts, moe.top_k_experts, moe.expert_dim, moe.hidden_dim) == (128, 8, 704, 2112)
  assert all(c.query_scale == 1.0 and c.final_logit_softcap == 30.0 for c in (e2b, big, moe))


def test_gemma4_fields_enter_the_digest_by_rule_2_and_gemma3_digests_stay():
  assert 'digest_rule' not in config_lib.gemma3_1b().to_json()  # no rule-2 field set
  assert 'global_head_dim' not in config_lib.tiny().to_json()
  as_json = config_lib.tiny_gemma4_31b().to_json()
  assert as_json['digest_rule'] == config_lib.DIGEST_RULE and as_json['attention_k_eq_v'] is True
  assert 'num_experts' not in as_json  # at its default


@pytest.mark.parametrize('name', ['gemma4-e2b', 'gemma4-e4b', 'gemma4-31b', 'gemma4-26b-a4b'])
def test_config_json_round_trips(name):
  config = config_lib.get_config(name)
  assert hf_config.config_from_hf(hf_config.config_to_hf(config)) == config


def test_the_text_config_of_a_multimodal_file_is_read():
  text = hf_config.config_to_hf(config_lib.gemma4_31b())
  raw = {'model_type': 'gemma4', 'text_config': text, 'vision_config': {'hidden_size': 1152}}
  assert hf_config.config_from_hf(raw) == config_lib.gemma4_31b()


def test_num_global_kv_heads_counts_only_with_k_eq_v_as_in_transformers():
  text = dict(hf_config.config_to_hf(config_lib.gemma4_31b()), attention_k_eq_v=False)
  assert hf_config.config_from_hf(text).kv_heads_of(5) == 16


@pytest.mark.parametrize(
  'key, value, message',
  [
    ('hidden_activation', 'silu', 'gelu_pytorch_tanh'),
    ('use_bidirectional_attention', 'all', 'causal'),
    ('vocab_size_per_layer_input', 7, 'must equal'),
  ],
)
def test_what_is_not_implemented_is_refused_by_name(key, value, message):
  text = dict(hf_config.config_to_hf(config_lib.gemma4_e2b()), **{key: value})
  with pytest.raises(params_lib.CheckpointError, match=message):
    hf_config.config_from_hf(text)


def test_other_rope_types_are_refused():
  text = hf_config.config_to_hf(config_lib.gemma4_31b())
  text['rope_parameters']['full_attention']['rope_type'] = 'yarn'
  with pytest.raises(params_lib.CheckpointError, match='yarn'):
    hf_config.config_from_hf(text)


def _same(a, b):
  leaves = jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(x, y), a, b))
  return jax.tree.structure(a) == jax.tree.structure(b) and all(leaves)


@pytest.mark.parametrize('name', ['tiny-gemma4-e2b', 'tiny-gemma4-26b'])
def test_export_loads_back_byte_equal(name, tmp_path):
  m = gemma_model.random(config_lib.get_config(name), seed=2)
  safetensors_io.save(m.params, m.config, tmp_path / 'ckpt')
  back = gemma_model.load(weights=tmp_path / 'ckpt')
  assert back.config == m.config and _same(back.params, m.params)


def test_a_31b_structure_export_at_reduced_width_loads_back_byte_equal(tmp_path):
  config = config_lib.gemma4_31b(
    embed_dim=64, hidden_dim=128, vocab_size=512, attention_types=config_lib.attention_pattern(6, 5)
  )
  m = gemma_model.random(config, seed=4)
  folder = safetensors_io.save(m.params, config, tmp_path / 'ckpt', max_shard_bytes=1 << 20)
  back = gemma_model.load(weights=folder)
  assert back.config == config and _same(back.params, m.params)
  assert back.params_digest != m.params_digest  # digests name what they hash: weights vs recipe
  names = set(json.loads((folder / 'model.safetensors.index.json').read_text())['weight_map'])
  assert 'model.layers.5.self_attn.v_proj.weight' not in names  # K=V: no value projection
  assert 'model.layers.5.layer_scalar' in names


def test_multimodal_text_model_loads_and_towers_and_shared_kv_tensors_are_ignored(tmp_path):
  config = config_lib.tiny_gemma4_e2b()
  m = gemma_model.random(config, seed=6)
  safetensors_io.save(m.params, config, tmp_path / 'text')
  tensors = load_file(tmp_path / 'text' / 'model.safetensors')
  renamed = {'model.language_model.' + k[len('model.') :]: v for k, v in tensors.items()}
  renamed['model.vision_tower.patch.weight'] = np.zeros((2, 2), np.float32)
  # A kv-shared layer (9) with key/value tensors some checkpoints still carry.
  renamed['model.language_model.layers.9.self_attn.k_proj.weight'] = np.zeros((32, 32), np.float32)
  folder = tmp_path / 'multimodal'
  folder.mkdir()
  save_file(renamed, str(folder / 'model.safetensors'))
  raw = {'model_type': 'gemma4', 'text_config': hf_config.config_to_hf(config)}
  (folder / 'config.json').write_text(json.dumps(raw))
  back = gemma_model.load(weights=folder)
  assert _same(back.params, m.params)


@pytest.mark.parametrize('where', ['top level', 'text_config'])
def test_a_quantized_checkpoint_is_refused_naming_its_quantization(where, tmp_path):
  config = config_lib.tiny_gemma4_e2b()
  folder = safetensors_io.save(gemma_model.random(config, seed=6).params, config, tmp_path / 'q')
  tensors = load_file(folder / 'model.safetensors')
  # compressed-tensors' packed 4-bit layout: int32 words and a scale in place of the weight.
  for name in [n for n in tensors if n.endswith('q_proj.weight')]:
    out, inner = tensors.pop(name).shape
    tensors[name.replace('.weight', '.weight_packed')] = np.zeros((out, inner // 8), np.int32)
    tensors[name.replace('.weight', '.weight_scale')] = np.ones((out, 1), np.float32)
  save_file(tensors, str(folder / 'model.safetensors'))
  text = hf_config.config_to_hf(config)
  quant = {'quant_method': 'compressed-tensors', 'format': 'pack-quantized'}
  raw = {'model_type': 'gemma4', 'text_config': text, 'quantization_config': quant}
  if where == 'text_config':
    raw = dict(text, quantization_config=quant)
  (folder / 'config.json').write_text(json.dumps(raw))
  with pytest.raises(params_lib.CheckpointError, match='quantization_config') as e:
    gemma_model.load(weights=folder)
  assert "'compressed-tensors'" in str(e.value)


def test_an_empty_quantization_config_is_no_quantization():
  raw = dict(hf_config.config_to_hf(config_lib.tiny_gemma4_e2b()), quantization_config=None)
  assert hf_config.config_from_hf(raw) == config_lib.tiny_gemma4_e2b()


def test_gemma4_norms_are_stored_as_they_act():
  """transformers' Gemma4RMSNorm multiplies by its weight (Gemma 3's by 1 + weight)."""
  config = config_lib.tiny_gemma4_31b()
  spec = next(s for s in params_lib.param_specs(config) if s.key == ('final_norm',))
  value = np.float32([1.25, 0.5])
  assert np.array_equal(safetensors_io.to_ours(spec, value, plus_one=False), value)
  assert np.array_equal(safetensors_io.to_ours(spec, value), value + 1)
