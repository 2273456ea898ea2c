"""Multi-query attention of a chunk of tokens over the fixed-capacity cache.

The chunk's keys and values are written into the cache first; queries then
attend over all S slots of the cache (or of a sliding-window layer's ring,
`models/cache.py`), masked by the stored positions:
  a query at position p sees slot j iff positions[j] >= 0, positions[j] <= p,
  and, on a sliding-window layer, p - positions[j] < window.
Scores and softmax are float32. A kv-shared layer (Gemma 4) computes no keys
or values: it attends over the cache of its source layer (`config.kv_source`).
The implementation is the one registered under `config.impl_of('attention')`
in `kernels/registry.py`: 'xla' is `attention_reference` (in the model's dtype),
'xla_split' `attention_xla_split` (the same in pure jnp, summed over slots by
the Pallas kernel's splits), 'pallas' the chunk-invariant kernel
(docs/kernels.md says how to add one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from graftjax.kernels import registry
from graftjax.models import cache as cache_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import ops
from graftjax.models.gemma import positions as positions_lib
from graftjax.models.gemma import schemes


def attention_block(
  params: dict[str, jax.Array],
  x: jax.Array,
  q_positions: jax.Array,
  q_segments: jax.Array,
  cache: cache_lib.KVCache,
  *,
  layer: int,
  write_index: jax.Array,
  config: config_lib.GemmaConfig,
  tables=None,
) -> tuple[jax.Array, cache_lib.KVCache]:
  """One attention layer: project, normalise, position, cache, attend.

  Args:
    params: this layer's 'q' [D, N, H], 'k'/'v' [D, K, H], 'o' [N, H, D],
      'q_norm'/'k_norm' [H] (H, K of this layer; no 'v' on a K=V layer, no
      'k', 'v', 'k_norm' on a kv-shared one).
    x: [B, T, D] normalised input.
    q_positions: [B, T] positions of the chunk.
    q_segments: [B, T] attention segments of the chunk (see `kernels.attention_reference.visible`).
    cache: the cache; its `positions` already include the chunk's.
    layer: index of this layer.
    write_index: first slot of the chunk.
    config: the model config.
    tables: host-built position tables (`positions.tables`), if the scheme needs them.
  Returns:
    (out [B, T, D], cache with this layer's new keys/values).
  """
  scheme, matmul_impl = schemes.get(config.position_scheme), config.impl_of('matmul')
  precision, norm_impl = config.dot_precision, config.impl_of('norm')
  theta, scale = config.rope_theta(layer), config.rope_scale(layer)
  fraction, key = config.rotary_fraction(layer), positions_lib.rope_key(config, layer)

  def position(y):
    if scheme.angles == 'float32':
      return ops.rotate(
        y, q_positions, theta, impl=config.impl_of('rotary'), scale=scale, fraction=fraction
      )
    return positions_lib.rotate_for_cache(
      y, q_positions, scheme=scheme, theta=theta, tabs=tables, fraction=fraction, key=key
    )

  q = ops.dense(x, params['q'], impl=matmul_impl, precision=precision)  # [B, T, N, H]
  q = position(ops.rms_norm(q, params['q_norm'], config.rms_norm_eps, impl=norm_impl))
  q = q * jnp.asarray(config.query_scale, q.dtype)

  source = config.kv_source(layer)
  if source == layer:
    k = ops.dense(x, params['k'], impl=matmul_impl, precision=precision)  # [B, T, K, H]
    v = (
      k
      if config.k_eq_v(layer)
      else ops.dense(x, params['v'], impl=matmul_impl, precision=precision)
    )
    k = position(ops.rms_norm(k, params['k_norm'], config.rms_norm_eps, impl=norm_impl))
    if config.value_norm:
      unit = jnp.ones(v.shape[-1], v.dtype)
      v = ops.rms_norm(v, unit, config.rms_norm_eps, impl=norm_impl)
    cache = cache_lib.write_layer(cache, layer, write_index, k, v)
  # [B, S', K, H] and [B, S']: the full capacity, or a sliding-window layer's ring.
  keys, values, k_positions, k_segments = cache_lib.layer_view(cache, source)

  batch, length = x.shape[:2]
  w_out = params['o'].reshape(config.num_heads * config.head_dim_of(layer), -1)  # [N*H, D]
  tab = tables[key] if scheme.keys == schemes.Keys.RELATIVE else None
  out = registry.get('attention', config.impl_of('attention')).fn(
    q,
    keys,
    values,
    q_positions,
    k_positions,
    config.window(layer),
    precision=precision,
    q_segments=q_segments,
    k_segments=k_segments,
    distance_bias=tables[positions_lib.BIAS] if scheme.bias is not None else None,
    relative_table=None if tab is None else (tab['cos'], tab['sin']),
  )
  return ops.dense(
    out.reshape(batch, length, -1), w_out, impl=matmul_impl, precision=precision
  ), cache
