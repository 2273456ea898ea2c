"""Gemma 3 1B-27B configs, linear rope scaling, and the versioned config digest."""

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.kernels import rotary
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import hf_config
from graftjax.models.gemma import model
from graftjax.models.gemma import ops
from graftjax.models.gemma import params as params_lib

G, L = config_lib.AttentionType.GLOBAL, config_lib.AttentionType.LOCAL_SLIDING

# The text part of the published config.json files, as they are (keys they
# leave out take transformers' Gemma3TextConfig defaults).
PUBLISHED = {
  'gemma3-1b': {
    'architectures': ['Gemma3ForCausalLM'],
    'head_dim': 256,
    'hidden_size': 1152,
    'intermediate_size': 6912,
    'num_attention_heads': 4,
    'num_hidden_layers': 26,
    'num_key_value_heads': 1,
    'query_pre_attn_scalar': 256,
    'rope_local_base_freq': 10000,
    'rope_scaling': None,
    'rope_theta': 1000000,
    'sliding_window': 512,
    'sliding_window_pattern': 6,
    'vocab_size': 262144,
    'eos_token_id': [1, 106],
  },
  'gemma3-4b': {
    'architectures': ['Gemma3ForConditionalGeneration'],
    'text_config': {
      'hidden_size': 2560,
      'intermediate_size': 10240,
      'model_type': 'gemma3_text',
      'num_hidden_layers': 34,
      'rope_scaling': {'factor': 8.0, 'rope_type': 'linear'},
      'sliding_window': 1024,
    },
  },
  'gemma3-12b': {
    'text_config': {
      'hidden_size': 3840,
      'intermediate_size': 15360,
      'num_attention_heads': 16,
      'num_hidden_layers': 48,
      'num_key_value_heads': 8,
      'rope_scaling': {'factor': 8.0, 'rope_type': 'linear'},
      'sliding_window': 1024,
    },
  },
  'gemma3-27b': {
    'text_config': {
      'head_dim': 128,
      'hidden_size': 5376,
      'intermediate_size': 21504,
      'num_attention_heads': 32,
      'num_hidden_layers': 62,
      'num_key_value_heads': 16,
      'query_pre_attn_scalar': 168,
      'rope_scaling': {'factor': 8.0, 'rope_type': 'linear'},
      'sliding_window': 1024,
    },
  },
}


@pytest.mark.parametrize('name', sorted(PUBLISHED))
def test_named_config_is_the_published_one(name):
  ours = config_lib.get_config(name)
  found = hf_config.config_from_hf(PUBLISHED[name])
  hf_config.check_same_architecture(ours, found, name)
  assert ours.attention_types == tuple((L,) * 5 + (G,)) * (ours.num_layers // 6) + (L,) * (
    ours.num_layers % 6
  )


def test_size_specific_values():
  one, four, twelve, big = (
    config_lib.get_config(f'gemma3-{s}') for s in ('1b', '4b', '12b', '27b')
  )
  assert (one.vocab_size, one.sliding_window, one.rope_scale_factor) == (262_144, 512, 1.0)
  for cfg in (four, twelve, big):
    assert (cfg.vocab_size, cfg.sliding_window, cfg.rope_scale_factor) == (262_208, 1024, 8.0)
  assert [c.num_kv_heads for c in (one, four, twelve, big)] == [1, 4, 8, 16]
  assert (big.head_dim, big.query_scale) == (128, 168**-0.5)
  assert four.rope_scale(5) == 8.0 and four.rope_scale(4) == 1.0  # global layers only
  assert (one.local_rope_theta, one.global_rope_theta) == (10_000.0, 1_000_000.0)


def test_existing_digests_unchanged():
  # Computed by the code before rope_scale_factor existed: adding a field
  # at its default must leave every committed fingerprint as it was.
  assert config_lib.gemma3_270m().digest() == (
    '323684bf123aac8425a99c52203e575ad21eaeb30c35afbb4f6c408676ae0a4c'
  )
  assert config_lib.tiny().digest() == (
    '191f253cf976ca32a280b56ab000ae56bcbcce3109f7ba61f0d983fa0d38b61f'
  )
  assert config_lib.tiny(impl='pallas').digest() == (
    'd546d33a14c2a73541f86bc6c534d8439cf30dea6e416fa69db758af774fdcaf'
  )


def test_new_field_set_enters_digest_with_its_rule():
  scaled = config_lib.tiny(rope_scale_factor=8.0)
  assert scaled.to_json()['digest_rule'] == config_lib.DIGEST_RULE
  assert 'digest_rule' not in config_lib.tiny().to_json()
  assert 'rope_scale_factor' not in config_lib.tiny().to_json()
  assert scaled.digest() != config_lib.tiny().digest()


def test_rope_scale_factor_checked():
  with pytest.raises(ValueError, match='rope_scale_factor'):
    config_lib.tiny(rope_scale_factor=0.5)
  with pytest.raises(ValueError, match='float32 angles'):
    config_lib.tiny(rope_scale_factor=8.0, position_scheme='rope_relative')


def test_rope_scaling_divides_positions():
  """Scale 8 at position 8p rotates as scale 1 at p (a power of two: exact)."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 4, 2, 16)), jnp.float32)
  pos = jnp.asarray([[0, 3, 17, 100]], jnp.int32)
  for impl in ('xla', 'pallas'):
    scaled = ops.rotate(x, pos * 8, 1e6, impl=impl, scale=8.0)
    plain = ops.rotate(x, pos, 1e6, impl=impl)
    np.testing.assert_allclose(np.asarray(scaled), np.asarray(plain), atol=2e-6)
    assert not np.allclose(np.asarray(ops.rotate(x, pos * 8, 1e6, impl=impl)), np.asarray(plain))
  ref = rotary.apply_rotary_reference(
    x, pos, theta=1e6, inv_freq=jnp.asarray(rotary.rotary_inv_freq(16, 1e6) / 8)
  )
  kernel = rotary.apply_rotary(x, pos, theta=1e6, scale=8.0, interpret=True)
  assert np.array_equal(np.asarray(ref), np.asarray(kernel))


def test_rope_scaling_reaches_global_layers_only():
  base = model.random(config_lib.tiny(), seed=1)
  scaled = model.random(config_lib.tiny(rope_scale_factor=8.0), seed=1)
  ids = np.arange(1, 13)
  outs = []
  for m in (base, scaled):
    logits, cache = m.prefill(ids, cache=m.init_cache(capacity=16), chunk_size=12, logits='all')
    outs.append((np.asarray(logits), np.asarray(cache.k)))
  assert not np.array_equal(outs[0][0], outs[1][0])
  assert np.array_equal(outs[0][1][:5], outs[1][1][:5])  # local layers' keys
  assert not np.array_equal(outs[0][1][5], outs[1][1][5])  # the global layer's


def test_unknown_config_name_and_random_needs_a_name():
  with pytest.raises(ValueError, match='known'):
    config_lib.get_config('gemma3-2b')
  with pytest.raises(ValueError, match='config name'):
    model.load(weights='random')
  with pytest.raises(ValueError, match="weights='random'"):
    model.load('gemma3-4b')


@pytest.mark.parametrize(
  ('key', 'value'),
  [
    ('final_logit_softcapping', 30.0),
    ('hidden_activation', 'relu'),
    ('rope_scaling', {'rope_type': 'yarn', 'factor': 8.0}),
    ('layer_types', ['chunked_attention'] * 6),
    ('tie_word_embeddings', False),
    ('use_bidirectional_attention', True),
  ],
)
def test_unimplemented_config_keys_refused(key, value):
  raw = {**hf_config.config_to_hf(config_lib.tiny()), key: value}
  with pytest.raises(params_lib.CheckpointError, match=key.split('_')[0]):
    hf_config.config_from_hf(raw)


@pytest.mark.parametrize('name', ['gemma3-270m', 'gemma3-1b', 'gemma3-27b', 'tiny'])
def test_hf_config_round_trip(name):
  cfg = config_lib.get_config(name)
  assert hf_config.config_from_hf(hf_config.config_to_hf(cfg)) == cfg


def test_relocating_keys_follows_the_scaled_rotation():
  """Keys moved by delta match keys computed at the later positions, global layer included."""
  m = model.random(config_lib.tiny(rope_scale_factor=8.0), seed=3)
  ids, delta = np.arange(1, 9), 40

  def keys(start):
    _, cache = m.prefill(ids, cache=m.init_cache(capacity=16), chunk_size=8, start_position=start)
    return np.asarray(cache.k[:, 0, :8])  # [L, n, K, H]

  moved = np.asarray(m.relocate_keys(keys(0), delta))
  np.testing.assert_allclose(moved, keys(delta), atol=1e-5)
  unscaled = np.asarray(model.random(config_lib.tiny(), seed=3).relocate_keys(keys(0), delta))
  assert np.abs(unscaled[5] - keys(delta)[5]).max() > 1e-3  # the global layer is scaled


@pytest.mark.parametrize(
  ('raw', 'match'),
  [
    ([1, 2], 'expected an object'),
    ({'hidden_size': 'wide'}, 'ValueError'),
    ({'num_attention_heads': 3, 'num_key_value_heads': 2}, 'not a multiple'),
    ({'rope_theta': 'big'}, 'ValueError'),
    ({'rope_scaling': {'rope_type': 'linear', 'factor': None}}, 'TypeError'),
    ({'query_pre_attn_scalar': 0}, 'query_pre_attn_scalar=0: must be a finite number > 0'),
    ({'query_pre_attn_scalar': -256}, 'query_pre_attn_scalar=-256: must be a finite'),
    ({'query_pre_attn_scalar': float('nan')}, 'query_pre_attn_scalar=nan: must be a finite'),
    ({'query_pre_attn_scalar': float('inf')}, 'query_pre_attn_scalar=inf: must be a finite'),
    ({'query_pre_attn_scalar': True}, 'query_pre_attn_scalar=True: must be a finite'),
    ({'rms_norm_eps': -1e-6}, 'rms_norm_eps=-1e-06: must be a finite number >= 0'),
    ({'rms_norm_eps': float('nan')}, 'rms_norm_eps=nan: must be a finite number >= 0'),
    ({'sliding_window': 0}, 'sliding_window=0: must be an int > 0'),
    ({'sliding_window': -512}, 'sliding_window=-512: must be an int > 0'),
    ({'eos_token_id': []}, r'eos_token_id=\[\]: names no end-of-sequence token'),
  ],
)
def test_malformed_config_json_is_a_checkpoint_error(raw, match):
  with pytest.raises(params_lib.CheckpointError, match=match):
    hf_config.config_from_hf(raw)
