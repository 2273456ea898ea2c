"""The Gemma 3 and Gemma 4 decoder as pure functions over a params pytree.

Params layout (D embed, F hidden, N query heads, K kv heads, H head dim; K,
H and F per layer, see `config`):
  embedding  [V, D]   tied input/output table
  final_norm [D]
  layers     tuple of L dicts:
    attn_norm, post_attn_norm, ffn_norm, post_ffn_norm  [D]
    q [D, N, H]   k, v [D, K, H]   o [N, H, D]   q_norm, k_norm [H]
    gate, up [D, F]   down [F, D]
Norm weights already include Gemma 3's +1 (Gemma 4 stores them as they act).
Gemma 4 adds, where its config asks:
  layers[i]: layer_scalar [1]; pl_gate [D, P], pl_proj [P, D], pl_norm [D]
    (per-layer inputs); router_scale [D], router [D, E], expert_scale [E],
    experts_gate_up [E, D, 2X] (gate units, then up), experts_down [E, X, D], ffn_norm_2,
    post_ffn_norm_1, post_ffn_norm_2 [D] (mixture of experts)
  per_layer_embedding [V, L*P], per_layer_projection [D, L*P], per_layer_norm [P]
and drops 'v' on K=V layers and 'k', 'v', 'k_norm' on kv-shared ones.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.models import cache as cache_lib
from graftjax.models.gemma import attention
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import layers
from graftjax.models.gemma import moe
from graftjax.models.gemma import ops

Params = dict
LogitsMode = Literal['all', 'last', 'none', 'hidden']


def decoder_layer(
  params: Params,
  x: jax.Array,
  positions: jax.Array,
  segments: jax.Array,
  cache: cache_lib.KVCache,
  *,
  layer: int,
  write_index: jax.Array,
  config: config_lib.GemmaConfig,
  tables=None,
  per_layer_input: jax.Array | None = None,
) -> tuple[jax.Array, cache_lib.KVCache]:
  """Pre- and post-normed attention and MLP with residuals: x [B, T, D].

  Gemma 4: the mixture of experts beside the MLP, then the per-layer input
  (`per_layer_input` [B, T, P]) gated in, then the layer scalar.
  """
  norm = lambda y, name: ops.rms_norm(
    y, params[name], config.rms_norm_eps, impl=config.impl_of('norm')
  )
  impl, precision = config.impl_of('matmul'), config.dot_precision
  attn_out, cache = attention.attention_block(
    params,
    norm(x, 'attn_norm'),
    positions,
    segments,
    cache,
    layer=layer,
    write_index=write_index,
    config=config,
    tables=tables,
  )
  x = x + norm(attn_out, 'post_attn_norm')
  mlp_out = gated_mlp(params, norm(x, 'ffn_norm'), impl=impl, precision=precision)
  if config.is_moe:
    experts_out = moe.experts(
      params, x, norm(x, 'ffn_norm_2'), config=config, impl=impl, precision=precision
    )
    mlp_out = norm(mlp_out, 'post_ffn_norm_1') + norm(experts_out, 'post_ffn_norm_2')
  x = x + norm(mlp_out, 'post_ffn_norm')
  if per_layer_input is not None:
    dense = functools.partial(ops.dense, impl=impl, precision=precision)
    gated = jax.nn.gelu(dense(x, params['pl_gate']), approximate=True) * per_layer_input
    x = x + norm(dense(gated, params['pl_proj']), 'pl_norm')
  if config.layer_scalar:
    x = x * params['layer_scalar'].astype(x.dtype)
  return x, cache


def gated_mlp(params: Params, x: jax.Array, *, impl: str, precision: str) -> jax.Array:
  """down(gelu_tanh(gate(x)) * up(x)): x [B, T, D] -> [B, T, D]."""
  dense = functools.partial(ops.dense, impl=impl, precision=precision)
  hidden = layers.gelu_gate(dense(x, params['gate']), dense(x, params['up']))
  return dense(hidden, params['down'])


def per_layer_inputs(
  params: Params, tokens: jax.Array, x: jax.Array, *, config: config_lib.GemmaConfig
) -> jax.Array:
  """Gemma 4's per-layer inputs [B, T, L, P] of tokens [B, T] and their embeddings x [B, T, D]:
  (norm(x @ projection / sqrt(D)) + table[tokens] * sqrt(P)) / sqrt(2)."""
  p, num_layers = config.per_layer_input_dim, config.num_layers
  table = layers.embed(params['per_layer_embedding'], tokens, p)
  table = table.reshape(tokens.shape + (num_layers, p))
  projected = ops.dense(
    x, params['per_layer_projection'], impl=config.impl_of('matmul'), precision=config.dot_precision
  ) * jnp.asarray(config.embed_dim**-0.5, x.dtype)
  projected = projected.reshape(tokens.shape + (num_layers, p))
  projected = ops.rms_norm(
    projected, params['per_layer_norm'], config.rms_norm_eps, impl=config.impl_of('norm')
  )
  return (projected + table) * jnp.asarray(2.0**-0.5, x.dtype)


def forward(
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  cache: cache_lib.KVCache,
  *,
  config: config_lib.GemmaConfig,
  logits: LogitsMode = 'all',
  tables=None,
  segments: jax.Array | None = None,
) -> tuple[jax.Array | None, cache_lib.KVCache]:
  """Runs a chunk of tokens through the model, appending it to the cache.

  Args:
    params: the params pytree (see module docstring), in the compute dtype.
    tokens: [B, T] int32 token ids.
    positions: [B, T] int32 positions of those tokens.
    cache: a cache with room for T more slots.
    config: the model config.
    logits: 'all' -> [B, T, V]; 'last' -> [B, V] of the chunk's last token;
      'none' -> None (prefill only); 'hidden' -> [B, T, D], the final-norm
      hidden state (float32).
    tables: position tables for schemes that need them (`positions.tables`).
    segments: [B, T] int32 attention segments (default 0: see everything
      earlier); a chunk in segment s > 0 sees only keys of segment s.
  Returns:
    (float32 logits, hidden state or None, the cache with the chunk appended).
  """
  if segments is None:
    segments = jnp.zeros_like(positions)
  write_index = cache.length
  cache = cache_lib.advance(cache, positions, segments)
  x = layers.embed(params['embedding'], tokens, config.embed_dim)
  extra = per_layer_inputs(params, tokens, x, config=config) if config.per_layer_input_dim else None
  for layer in range(config.num_layers):
    x, cache = decoder_layer(
      params['layers'][layer],
      x,
      positions,
      segments,
      cache,
      layer=layer,
      write_index=write_index,
      config=config,
      tables=tables,
      per_layer_input=None if extra is None else extra[:, :, layer],
    )
  if logits == 'none':
    return None, cache
  if logits == 'last':
    x = x[:, -1:]
  x = ops.rms_norm(x, params['final_norm'], config.rms_norm_eps, impl=config.impl_of('norm'))
  if logits == 'hidden':
    return x.astype(jnp.float32), cache
  out = ops.unembed(
    x, params['embedding'], impl=config.impl_of('matmul'), precision=config.dot_precision
  ).astype(jnp.float32)
  if config.final_logit_softcap is not None:
    cap = jnp.float32(config.final_logit_softcap)
    out = jnp.tanh(out / cap) * cap
  return (out[:, 0] if logits == 'last' else out), cache


@functools.partial(jax.jit, static_argnames=('config', 'logits'), donate_argnums=(3,))
def forward_jit(
  params, tokens, positions, cache, *, config, logits='all', tables=None, segments=None
):
  """`forward`, jitted; the input cache is donated."""
  return forward(
    params, tokens, positions, cache, config=config, logits=logits, tables=tables, segments=segments
  )


def init_params(
  config: config_lib.GemmaConfig, seed: int = 0, dtype: jnp.dtype = jnp.float32
) -> Params:
  """Random params of the right shapes (tests, training from scratch).

  Drawn with numpy from `seed`, so the same seed gives the same bits on any
  machine and jax version. Norm weights are near 1 (they include the +1).
  Gemma 3 layouts only (`random_init` draws any config).
  """
  if not config.uniform_kv or config.num_kv_shared_layers or config.per_layer_input_dim:
    raise ValueError('init_params draws Gemma 3 layouts; use model.random for Gemma 4 fields')
  if config.is_moe or config.layer_scalar or config.attention_k_eq_v:
    raise ValueError('init_params draws Gemma 3 layouts; use model.random for Gemma 4 fields')
  rng = np.random.default_rng(seed)
  d, f, n, k, h = (
    config.embed_dim,
    config.hidden_dim,
    config.num_heads,
    config.num_kv_heads,
    config.head_dim,
  )

  def dense(*shape, fan_in):
    return jnp.asarray(rng.normal(0.0, fan_in**-0.5, shape).astype(np.float32), dtype)

  def norm(size):
    return jnp.asarray(1.0 + 0.1 * rng.normal(size=size).astype(np.float32), dtype)

  layer_params = []
  for _ in range(config.num_layers):
    layer_params.append(
      {
        'attn_norm': norm(d),
        'post_attn_norm': norm(d),
        'ffn_norm': norm(d),
        'post_ffn_norm': norm(d),
        'q': dense(d, n, h, fan_in=d),
        'k': dense(d, k, h, fan_in=d),
        'v': dense(d, k, h, fan_in=d),
        'o': dense(n, h, d, fan_in=n * h),
        'q_norm': norm(h),
        'k_norm': norm(h),
        'gate': dense(d, f, fan_in=d),
        'up': dense(d, f, fan_in=d),
        'down': dense(f, d, fan_in=f),
      }
    )
  return {
    'embedding': dense(config.vocab_size, d, fan_in=d),
    'final_norm': norm(d),
    'layers': tuple(layer_params),
  }
