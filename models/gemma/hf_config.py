"""A Hugging Face Gemma 3 or Gemma 4 `config.json` <-> `GemmaConfig`.

Reads both the text config of `Gemma3ForCausalLM` and the `text_config` of
`Gemma3ForConditionalGeneration` (4B and up), in the legacy keys
(`rope_theta`, `rope_local_base_freq`, `rope_scaling`, `sliding_window_pattern`)
and the newer ones (`rope_parameters` per layer type, `layer_types`). Keys a
published file leaves out take transformers' `Gemma3TextConfig` defaults.
Anything this model does not implement (soft-capping, other activations,
other rope types) is refused, naming the key.

A Gemma 4 file (`model_type` 'gemma4_text', or 'gemma4' with a
`text_config`: `Gemma4ForCausalLM`, `Gemma4ForConditionalGeneration`) is read
with transformers' `Gemma4TextConfig` defaults: `global_head_dim` (512),
`num_global_key_value_heads` (used only with `attention_k_eq_v`, as
transformers does), 'proportional' rope on full-attention layers, the final
logit soft-cap, kv sharing, per-layer inputs and the mixture of experts.
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


# transformers' Gemma4TextConfig defaults, for keys a Gemma 4 config.json leaves out.
_GEMMA4_DEFAULTS = {
  'vocab_size': 262_144,
  'hidden_size': 2304,
  'intermediate_size': 9216,
  'num_hidden_layers': 30,
  'num_attention_heads': 8,
  'num_key_value_heads': 4,
  'head_dim': 256,
  'global_head_dim': 512,
  'num_global_key_value_heads': None,
  'rms_norm_eps': 1e-6,
  'sliding_window': 512,
  'pad_token_id': 0,
  'eos_token_id': 1,
  'bos_token_id': 2,
  'attention_k_eq_v': False,
  'num_kv_shared_layers': 0,
  'use_double_wide_mlp': False,
  'hidden_size_per_layer_input': 256,
  'vocab_size_per_layer_input': 262_144,
  'final_logit_softcapping': None,
  'enable_moe_block': False,
  'num_experts': None,
  'top_k_experts': None,
  'moe_intermediate_size': None,
}
_GEMMA4_ROPE = {
  'sliding_attention': {'rope_type': 'default', 'rope_theta': 10_000.0},
  'full_attention': {
    'rope_type': 'proportional',
    'partial_rotary_factor': 0.25,
    'rope_theta': 1_000_000.0,
  },
}


def is_gemma4_file(raw: dict) -> bool:
  """Whether a config.json (dict) is a Gemma 4 one (its `model_type`)."""
  return str(raw.get('model_type', '')).startswith('gemma4')


def is_gemma4(config: config_lib.GemmaConfig) -> bool:
  """Whether `config` sets a Gemma 4 field (it is then written as a Gemma 4 config.json, its
  norm weights stored as they act, without Gemma 3's +1)."""
  defaults = {f.name: f.default for f in config_lib.dataclasses.fields(config)}
  return any(getattr(config, name) != defaults[name] for name in config_lib.GEMMA4_FIELDS)


def config_from_hf(raw: dict) -> config_lib.GemmaConfig:
  """The GemmaConfig of a Gemma 3 or Gemma 4 config.json (dict).

  Raises:
    CheckpointError: for a key this model does not implement (quantized weights
      among them), or a value of the wrong type or out of range (named).
  """
  text = raw.get('text_config', raw) if isinstance(raw, dict) else None
  if not isinstance(text, dict):
    raise params_lib.CheckpointError(f'config.json: expected an object, got {type(raw).__name__}')
  for where in (raw, text):
    quant = where.get('quantization_config')
    if quant:
      method = quant.get('quant_method') if isinstance(quant, dict) else quant
      raise _error('quantization_config', method, 'quantized weights are not implemented')
  try:
    if is_gemma4_file(raw) or is_gemma4_file(text):
      return _gemma4_from_text(text)
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
  return config_lib.GemmaConfig(
    **_shared_fields(cfg, types),
    local_rope_theta=local_theta,
    global_rope_theta=global_theta,
    rope_scale_factor=global_factor,
    query_scale=float(cfg['query_pre_attn_scalar']) ** -0.5,
  )


def _shared_fields(cfg: dict, types) -> dict:
  """The `GemmaConfig` fields that Gemma 3 and Gemma 4 configs spell alike."""
  eos = cfg['eos_token_id']
  eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
  return dict(
    vocab_size=int(cfg['vocab_size']),
    embed_dim=int(cfg['hidden_size']),
    hidden_dim=int(cfg['intermediate_size']),
    num_heads=int(cfg['num_attention_heads']),
    num_kv_heads=int(cfg['num_key_value_heads']),
    head_dim=int(cfg['head_dim']),
    attention_types=types,
    sliding_window=int(cfg['sliding_window']),
    rms_norm_eps=float(cfg['rms_norm_eps']),
    bos_id=int(cfg['bos_token_id']),
    eos_id=int(eos[0]),
    pad_id=int(cfg['pad_token_id']),
    end_of_turn_id=int(eos[1]) if len(eos) > 1 else None,
  )


def _layer_types(cfg: dict, num_layers: int, *, last_global: bool = False):
  if cfg.get('layer_types'):
    names = list(cfg['layer_types'])
    unknown = sorted(set(names) - set(_LAYER_TYPES))
    if unknown:
      raise _error('layer_types', unknown, f'known: {sorted(_LAYER_TYPES)}')
  else:
    names = [
      'full_attention' if (i + 1) % 6 == 0 else 'sliding_attention' for i in range(num_layers)
    ]
  if len(names) != num_layers:
    raise _error('layer_types', len(names), f'num_hidden_layers is {num_layers}')
  if last_global and names:  # transformers forces it, with a warning
    names[-1] = 'full_attention'
  return tuple(_LAYER_TYPES[t] for t in names)


def _gemma4_rope(cfg: dict, layer_type: str) -> tuple[float, float, float]:
  """(theta, linear factor, rotary fraction) of one Gemma 4 layer type."""
  params = (cfg.get('rope_parameters') or _GEMMA4_ROPE).get(layer_type)
  if params is None:
    raise _error('rope_parameters', layer_type, 'missing')
  rope_type = params.get('rope_type', 'default')
  if rope_type not in ('default', 'proportional', 'linear'):
    raise _error(f'rope ({layer_type})', rope_type, 'only default, proportional, linear')
  fraction = float(params.get('partial_rotary_factor', 1.0)) if rope_type == 'proportional' else 1.0
  factor = float(params.get('factor', 1.0)) if rope_type != 'default' else 1.0
  return float(params['rope_theta']), factor, fraction


# Values of `use_bidirectional_attention` under which text tokens attend causally: 'vision'
# (every published Gemma 4) changes the mask between image tokens only, and transformers'
# logits of text-only input are the same with and without it.
_BIDIRECTIONAL_TEXT_CAUSAL = (None, False, 'vision')
_PER_LAYER_KEYS = ('head_dim', 'num_key_value_heads')


def _global_overrides(cfg: dict, types) -> tuple[int, int | None]:
  """(head width, kv heads or None) of the global layers from `per_layer_config`.

  transformers 5.25 writes it in place of `global_head_dim` / `num_global_key_value_heads`:
  layer index (a string, zero-padded) -> the fields where that layer differs from the top
  level. This model implements one override shared by every global layer and none on
  sliding-window layers; anything else is refused, naming the layer and field.
  """
  per_layer = cfg['per_layer_config']
  if not isinstance(per_layer, dict):
    raise _error('per_layer_config', per_layer, 'expected an object of layer index -> fields')
  overrides = {}
  for key, fields in per_layer.items():
    try:
      layer = int(key)
    except (TypeError, ValueError):
      raise _error('per_layer_config', key, 'keys must be layer indices') from None
    if not 0 <= layer < len(types):
      raise _error('per_layer_config', key, f'no layer {layer} in {len(types)} layers')
    if not isinstance(fields, dict):
      raise _error(f'per_layer_config[{key!r}]', fields, 'expected an object of fields')
    unknown = sorted(set(fields) - set(_PER_LAYER_KEYS))
    if unknown:
      raise _error(f'per_layer_config[{key!r}]', unknown, f'only {list(_PER_LAYER_KEYS)} per layer')
    base = {'head_dim': cfg['head_dim'], 'num_key_value_heads': cfg['num_key_value_heads']}
    changed = {k: v for k, v in fields.items() if v != base[k]}
    if changed and types[layer] != AttentionType.GLOBAL:
      raise _error(
        f'per_layer_config[{key!r}]', changed, 'only global layers may differ from the rest'
      )
    overrides[layer] = fields
  shapes = {
    (
      int(overrides.get(i, {}).get('head_dim', cfg['head_dim'])),
      overrides.get(i, {}).get('num_key_value_heads'),
    )
    for i, t in enumerate(types)
    if t == AttentionType.GLOBAL
  }
  if len(shapes) > 1:
    raise _error('per_layer_config', per_layer, f'global layers differ: {sorted(shapes, key=str)}')
  width, kv_heads = shapes.pop() if shapes else (int(cfg['head_dim']), None)
  return width, None if kv_heads is None else int(kv_heads)


def _gemma4_from_text(text: dict) -> config_lib.GemmaConfig:
  cfg = {**_GEMMA4_DEFAULTS, **text}
  bidirectional = cfg.get('use_bidirectional_attention')
  if bidirectional not in _BIDIRECTIONAL_TEXT_CAUSAL:
    raise _error(
      'use_bidirectional_attention',
      bidirectional,
      "only None or 'vision' (image tokens attend both ways, text stays causal; this model"
      " reads text only) are implemented; 'all' makes every token attend both ways",
    )
  if cfg.get('attention_bias'):
    raise _error('attention_bias', True, 'Gemma 4 projections have no bias here')
  if cfg.get('tie_word_embeddings', True) is False:
    raise _error('tie_word_embeddings', False, 'Gemma 4 unembeds with its embedding table')
  activation = cfg.get('hidden_activation') or cfg.get('hidden_act') or 'gelu_pytorch_tanh'
  if activation != 'gelu_pytorch_tanh':
    raise _error('hidden_activation', activation, 'only gelu_pytorch_tanh is implemented')
  num_layers = int(cfg['num_hidden_layers'])
  types = _layer_types(cfg, num_layers, last_global=True)
  local_theta, local_factor, local_fraction = _gemma4_rope(cfg, 'sliding_attention')
  global_theta, global_factor, global_fraction = _gemma4_rope(cfg, 'full_attention')
  if local_factor != 1.0 or local_fraction != 1.0:
    raise _error('rope (sliding_attention)', text.get('rope_parameters'), 'full rotary, unscaled')
  per_layer = int(cfg.get('hidden_size_per_layer_input') or 0)
  vocab = int(cfg['vocab_size'])
  if per_layer and int(cfg['vocab_size_per_layer_input']) != vocab:
    raise _error(
      'vocab_size_per_layer_input', cfg['vocab_size_per_layer_input'], f'must equal {vocab}'
    )
  k_eq_v = bool(cfg['attention_k_eq_v'])
  if cfg.get('per_layer_config') is not None:
    global_width, global_kv = _global_overrides(cfg, types)
  else:
    global_width = int(cfg['global_head_dim'])
    global_kv = cfg['num_global_key_value_heads'] if k_eq_v else None
  moe = bool(cfg['enable_moe_block'])
  softcap = cfg['final_logit_softcapping']
  return config_lib.GemmaConfig(
    **_shared_fields(cfg, types),
    local_rope_theta=local_theta,
    global_rope_theta=global_theta,
    rope_scale_factor=global_factor,
    query_scale=1.0,
    global_head_dim=global_width,
    num_global_kv_heads=None if global_kv is None else int(global_kv),
    attention_k_eq_v=k_eq_v,
    global_rotary_fraction=global_fraction,
    value_norm=True,
    final_logit_softcap=None if softcap is None else float(softcap),
    num_kv_shared_layers=int(cfg['num_kv_shared_layers']),
    double_wide_shared_mlp=bool(cfg['use_double_wide_mlp']),
    per_layer_input_dim=per_layer,
    layer_scalar=True,
    num_experts=int(cfg['num_experts'] or 0) if moe else 0,
    top_k_experts=int(cfg['top_k_experts'] or 0) if moe else 0,
    expert_dim=int(cfg['moe_intermediate_size'] or 0) if moe else 0,
  )


def _gemma4_to_hf(config: config_lib.GemmaConfig) -> dict:
  """A `Gemma4ForCausalLM` config.json (dict) of a Gemma 4 config."""
  fixed = {'query_scale': 1.0, 'value_norm': True, 'layer_scalar': True}
  wrong = {k: getattr(config, k) for k, v in fixed.items() if getattr(config, k) != v}
  if wrong:
    raise params_lib.CheckpointError(f'a Gemma 4 config.json cannot express {wrong}')
  if config.num_global_kv_heads is not None and not config.attention_k_eq_v:
    raise params_lib.CheckpointError(
      'transformers reads num_global_key_value_heads only with attention_k_eq_v'
    )
  eos = [config.eos_id] + ([config.end_of_turn_id] if config.end_of_turn_id is not None else [])
  full_rope = {'rope_type': 'proportional', 'rope_theta': config.global_rope_theta}
  full_rope['partial_rotary_factor'] = config.global_rotary_fraction
  if config.rope_scale_factor != 1.0:
    full_rope['factor'] = config.rope_scale_factor
  moe = config.is_moe
  return {
    'architectures': ['Gemma4ForCausalLM'],
    'model_type': 'gemma4_text',
    'vocab_size': config.vocab_size,
    'hidden_size': config.embed_dim,
    'intermediate_size': config.hidden_dim,
    'num_hidden_layers': config.num_layers,
    'num_attention_heads': config.num_heads,
    'num_key_value_heads': config.num_kv_heads,
    'head_dim': config.head_dim,
    'global_head_dim': config.global_head_dim or config.head_dim,
    'num_global_key_value_heads': config.num_global_kv_heads,
    'attention_k_eq_v': config.attention_k_eq_v,
    'hidden_activation': 'gelu_pytorch_tanh',
    'layer_types': [
      'full_attention' if t == AttentionType.GLOBAL else 'sliding_attention'
      for t in config.attention_types
    ],
    'sliding_window': config.sliding_window,
    'rope_parameters': {
      'sliding_attention': {'rope_type': 'default', 'rope_theta': config.local_rope_theta},
      'full_attention': full_rope,
    },
    'rms_norm_eps': config.rms_norm_eps,
    'final_logit_softcapping': config.final_logit_softcap,
    'num_kv_shared_layers': config.num_kv_shared_layers,
    'use_double_wide_mlp': config.double_wide_shared_mlp,
    'hidden_size_per_layer_input': config.per_layer_input_dim,
    'vocab_size_per_layer_input': config.vocab_size,
    'enable_moe_block': moe,
    'num_experts': config.num_experts if moe else None,
    'top_k_experts': config.top_k_experts if moe else None,
    'moe_intermediate_size': config.expert_dim if moe else None,
    'attention_bias': False,
    'tie_word_embeddings': True,
    'bos_token_id': config.bos_id,
    'eos_token_id': eos if len(eos) > 1 else eos[0],
    'pad_token_id': config.pad_id,
    'torch_dtype': 'float32',
  }


def config_to_hf(config: config_lib.GemmaConfig) -> dict:
  """A `Gemma3ForCausalLM` (or for a Gemma 4 config `Gemma4ForCausalLM`) config.json (dict)
  that `config_from_hf` reads back equal.

  Raises:
    CheckpointError: if `config.query_scale` is not q ** -0.5 of any float q (Gemma 3), or
      the config sets what a Gemma 4 config.json cannot say.
  """
  if is_gemma4(config):
    return _gemma4_to_hf(config)
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
) + config_lib.GEMMA4_FIELDS


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
