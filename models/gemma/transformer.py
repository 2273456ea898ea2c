"""The Gemma 3 decoder as pure functions over a params pytree.

Params layout (D embed, F hidden, N query heads, K kv heads, H head dim):
  embedding  [V, D]   tied input/output table
  final_norm [D]
  layers     tuple of L dicts:
    attn_norm, post_attn_norm, ffn_norm, post_ffn_norm  [D]
    q [D, N, H]   k, v [D, K, H]   o [N, H, D]   q_norm, k_norm [H]
    gate, up [D, F]   down [F, D]
Norm weights already include Gemma's +1.
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
) -> tuple[jax.Array, cache_lib.KVCache]:
  """Pre- and post-normed attention and MLP with residuals: x [B, T, D]."""
  norm = lambda y, name: ops.rms_norm(
    y, params[name], config.rms_norm_eps, impl=config.impl_of('norm')
  )
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
  mlp_out = gated_mlp(
    params, norm(x, 'ffn_norm'), impl=config.impl_of('matmul'), precision=config.dot_precision
  )
  return x + norm(mlp_out, 'post_ffn_norm'), cache


def gated_mlp(params: Params, x: jax.Array, *, impl: str, precision: str) -> jax.Array:
  """down(gelu_tanh(gate(x)) * up(x)): x [B, T, D] -> [B, T, D]."""
  dense = functools.partial(ops.dense, impl=impl, precision=precision)
  hidden = layers.gelu_gate(dense(x, params['gate']), dense(x, params['up']))
  return dense(hidden, params['down'])


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
  """
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
