"""A Hugging Face Gemma 3 `config.json` <-> `GemmaConfig`.

Reads both the text config of `Gemma3ForCausalLM` and the `text_config` of
`Gemma3ForConditionalGeneration` (4B and up), in the legacy keys
(`rope_theta`, `rope_local_base_freq`, `rope_scaling`, `sliding_window_pattern`)
and the newer ones (`rope_parameters` per layer type, `layer_types`). Keys a
published file leaves out take transformers' `Gemma3TextConfig` defaults.
Anything this model does not implement (soft-capping, other activations,
other rope types) is refused, naming the key.
"""

from __future__ import annotations

from typing import Any

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import params as params_lib

AttentionType = config_lib.AttentionType

# transformers' Gemma3TextConfig defaults, for keys a config.json leaves out.
_DEFAULTS = {
  'vocab_size': 262_208,
  'hidden_size': 2304,
  'intermediate_size': 9216,
  'num_hidden_layers': 26,
  'num_attention_heads': 8,
  'num_key_value_heads': 4,
  'head_dim': 256,
  'rms_norm_eps': 1e-6,
  'rope_theta': 1_000_000.0,
  'rope_local_base_freq': 10_000.0,
  'query_pre_attn_scalar': 256,
  'sliding_window': 4096,
  'sliding_window_pattern': 6,
  'pad_token_id': 0,
  'eos_token_id': 1,
  'bos_token_id': 2,
}
_LAYER_TYPES = {
  'sliding_attention': AttentionType.LOCAL_SLIDING,
  'full_attention': AttentionType.GLOBAL,
}


def _error(key: str, value: Any, why: str) -> params_lib.CheckpointError:
  return params_lib.CheckpointError(f'config.json: {key}={value!r}: {why}')


def _rope(cfg: dict, layer_type: str) -> tuple[float, float]:
  """(theta, linear scale factor) of one layer type."""
  params = (cfg.get('rope_parameters') or {}).get(layer_type)
  if params is None:  # legacy keys
    local = layer_type == 'sliding_attention'
    theta = cfg.get('rope_local_base_freq' if local else 'rope_theta')
    theta = _DEFAULTS['rope_local_base_freq' if local else 'rope_theta'] if theta is None else theta
    params = {'rope_theta': theta, **({} if local else (cfg.get('rope_scaling') or {}))}
  rope_type = params.get('rope_type', params.get('type', 'default'))
  if rope_type not in ('default', 'linear'):
    raise _error(f'rope ({layer_type})', rope_type, 'only default and linear rope are implemented')
  factor = float(params.get('factor', 1.0)) if rope_type == 'linear' else 1.0
  return float(params['rope_theta']), factor


def config_from_hf(raw: dict) -> config_lib.GemmaConfig:
  """The GemmaConfig of a Gemma 3 config.json (dict).

  Raises:
    CheckpointError: for a key this model does not implement, or a value
      of the wrong type or out of range (named).
  """
  text = raw.get('text_config', raw) if isinstance(raw, dict) else None
  if not isinstance(text, dict):
    raise params_lib.CheckpointError(f'config.json: expected an object, got {type(raw).__name__}')
  try:
    return _config_from_text(text)
  except (TypeError, ValueError, KeyError) as e:
    if isinstance(e, params_lib.CheckpointError):
      raise
    raise params_lib.CheckpointError(f'config.json: {type(e).__name__}: {e}') from None


def _check_values(cfg: dict) -> None:
  """Raises CheckpointError naming the first value no model can have: a query scale,
  epsilon or window out of range or not finite, or no end-of-sequence token."""
  number = lambda key: isinstance(cfg[key], (int, float)) and not isinstance(cfg[key], bool)
  scalar = cfg['query_pre_attn_scalar']
  if not number('query_pre_attn_scalar') or not 0 < scalar < float('inf'):
    raise _error('query_pre_attn_scalar', scalar, 'must be a finite number > 0')
  eps = cfg['rms_norm_eps']
  if not number('rms_norm_eps') or not 0 <= eps < float('inf'):
    raise _error('rms_norm_eps', eps, 'must be a finite number >= 0')
  window = cfg['sliding_window']
  if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
    raise _error('sliding_window', window, 'must be an int > 0')
  eos = cfg['eos_token_id']
  if isinstance(eos, (list, tuple)) and not eos:
    raise _error('eos_token_id', eos, 'names no end-of-sequence token')


def _config_from_text(text: dict) -> config_lib.GemmaConfig:
  cfg = {**_DEFAULTS, **text}
  _check_values(cfg)
  for key in ('final_logit_softcapping', 'attn_logit_softcapping'):
    if cfg.get(key) is not None:
      raise _error(key, cfg[key], 'soft-capping is not implemented (Gemma 3 has none)')
  if cfg.get('tie_word_embeddings', True) is False:
    raise _error('tie_word_embeddings', False, 'Gemma 3 unembeds with its embedding table')
  if cfg.get('use_bidirectional_attention'):
    raise _error('use_bidirectional_attention', True, 'only causal attention is implemented')
  activation = cfg.get('hidden_activation') or cfg.get('hidden_act') or 'gelu_pytorch_tanh'
  if activation != 'gelu_pytorch_tanh':
    raise _error('hidden_activation', activation, 'only gelu_pytorch_tanh is implemented')
  num_layers = int(cfg['num_hidden_layers'])
  if cfg.get('layer_types'):
    unknown = sorted(set(cfg['layer_types']) - set(_LAYER_TYPES))
    if unknown:
      raise _error('layer_types', unknown, f'known: {sorted(_LAYER_TYPES)}')
    types = tuple(_LAYER_TYPES[t] for t in cfg['layer_types'])
  else:
    pattern = int(cfg['sliding_window_pattern'])
    types = tuple(
      AttentionType.GLOBAL if (i + 1) % pattern == 0 else AttentionType.LOCAL_SLIDING
      for i in range(num_layers)
    )
  if len(types) != num_layers:
    raise _error('layer_types', len(types), f'num_hidden_layers is {num_layers}')
  local_theta, local_factor = _rope(cfg, 'sliding_attention')
  global_theta, global_factor = _rope(cfg, 'full_attention')
  if local_factor != 1.0:
    raise _error('rope (sliding_attention)', local_factor, 'local layers are never scaled')
  eos = cfg['eos_token_id']
  eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
  return config_lib.GemmaConfig(
    vocab_size=int(cfg['vocab_size']),
    embed_dim=int(cfg['hidden_size']),
    hidden_dim=int(cfg['intermediate_size']),
    num_heads=int(cfg['num_attention_heads']),
    num_kv_heads=int(cfg['num_key_value_heads']),
    head_dim=int(cfg['head_dim']),
    attention_types=types,
    sliding_window=int(cfg['sliding_window']),
    local_rope_theta=local_theta,
    global_rope_theta=global_theta,
    rope_scale_factor=global_factor,
    query_scale=float(cfg['query_pre_attn_scalar']) ** -0.5,
    rms_norm_eps=float(cfg['rms_norm_eps']),
    bos_id=int(cfg['bos_token_id']),
    eos_id=int(eos[0]),
    pad_id=int(cfg['pad_token_id']),
    end_of_turn_id=int(eos[1]) if len(eos) > 1 else None,
  )


def config_to_hf(config: config_lib.GemmaConfig) -> dict:
  """A `Gemma3ForCausalLM` config.json (dict) that `config_from_hf` reads back equal.

  Raises:
    CheckpointError: if `config.query_scale` is not q ** -0.5 of any float q.
  """
  scalar = config.query_scale**-2.0
  if float(round(scalar)) ** -0.5 == config.query_scale:
    scalar = round(scalar)
  elif scalar**-0.5 != config.query_scale:
    raise params_lib.CheckpointError(
      f'query_scale={config.query_scale} is not query_pre_attn_scalar ** -0.5 of any float'
    )
  eos = [config.eos_id] + ([config.end_of_turn_id] if config.end_of_turn_id is not None else [])
  rope_scaling = None
  if config.rope_scale_factor != 1.0:
    rope_scaling = {'rope_type': 'linear', 'factor': config.rope_scale_factor}
  return {
    'architectures': ['Gemma3ForCausalLM'],
    'model_type': 'gemma3_text',
    'vocab_size': config.vocab_size,
    'hidden_size': config.embed_dim,
    'intermediate_size': config.hidden_dim,
    'num_hidden_layers': config.num_layers,
    'num_attention_heads': config.num_heads,
    'num_key_value_heads': config.num_kv_heads,
    'head_dim': config.head_dim,
    'hidden_activation': 'gelu_pytorch_tanh',
    'layer_types': [
      'full_attention' if t == AttentionType.GLOBAL else 'sliding_attention'
      for t in config.attention_types
    ],
    'sliding_window': config.sliding_window,
    'rope_theta': config.global_rope_theta,
    'rope_local_base_freq': config.local_rope_theta,
    'rope_scaling': rope_scaling,
    'query_pre_attn_scalar': scalar,
    'rms_norm_eps': config.rms_norm_eps,
    'final_logit_softcapping': None,
    'attn_logit_softcapping': None,
    'tie_word_embeddings': True,
    'bos_token_id': config.bos_id,
    'eos_token_id': eos if len(eos) > 1 else eos[0],
    'pad_token_id': config.pad_id,
    'torch_dtype': 'float32',
  }


_ARCHITECTURE_FIELDS = (
  'vocab_size',
  'embed_dim',
  'hidden_dim',
  'num_heads',
  'num_kv_heads',
  'head_dim',
  'attention_types',
  'sliding_window',
  'local_rope_theta',
  'global_rope_theta',
  'rope_scale_factor',
  'query_scale',
  'rms_norm_eps',
)


def check_same_architecture(
  expected: config_lib.GemmaConfig, found: config_lib.GemmaConfig, source: str
) -> None:
  """Raises CheckpointError naming every architecture field where the two differ."""
  diffs = [
    f'{name}: {getattr(found, name)!r} (expected {getattr(expected, name)!r})'
    for name in _ARCHITECTURE_FIELDS
    if getattr(expected, name) != getattr(found, name)
  ]
  if diffs:
    raise params_lib.CheckpointError(f'{source} is another model: ' + '; '.join(diffs))
