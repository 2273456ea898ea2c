"""The KV cache: an explicit pytree of fixed capacity.

Slots, not positions, index the cache. Slot `s` of batch row `b` holds the
keys and values of one token and that token's position `positions[b, s]`
(-1 for an empty slot). Slots `[0, length)` have been written; a chunk of T
tokens is written at slots `[length, length + T)` with
`lax.dynamic_update_slice`, never with a scatter. The capacity S is fixed
when the cache is made, so attention always runs over the same shapes no
matter how full the cache is (XLA's bits depend on shapes; see design.md).

Sliding-window layers keep the same full-size cache as global layers: every
key ever written stays, and the window is applied by the attention mask
from positions. That is what makes resumption from a saved state exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

EMPTY_POSITION = -1


@struct.dataclass
class KVCache:
  """Per-layer keys and values of every token seen so far.

  Attributes:
    k: [L, B, S, K, H] keys (for rotary schemes, already rotated).
    v: [L, B, S, K, H] values.
    positions: [B, S] int32 position of each slot's token, -1 if empty.
    segments: [B, S] int32 attention segment of each slot. A query in
      segment 0 sees every earlier key; a query in segment s > 0 sees only
      keys of segment s (block attention: independent blocks in one cache).
    length: [] int32, slots written so far (the next write index, shared by
      every batch row).
  """

  k: jax.Array
  v: jax.Array
  positions: jax.Array
  segments: jax.Array
  length: jax.Array

  @property
  def num_layers(self) -> int:
    return self.k.shape[0]

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]

  @property
  def capacity(self) -> int:
    return self.k.shape[2]

  @property
  def dtype(self) -> jnp.dtype:
    return self.k.dtype


def init(
  *,
  num_layers: int,
  batch_size: int,
  capacity: int,
  num_kv_heads: int,
  head_dim: int,
  dtype: jnp.dtype = jnp.float32,
) -> KVCache:
  """An empty cache: zeros everywhere, every position -1."""
  if min(num_layers, batch_size, capacity, num_kv_heads, head_dim) <= 0:
    raise ValueError(
      'every cache dimension must be positive, got'
      f' num_layers={num_layers} batch_size={batch_size}'
      f' capacity={capacity} num_kv_heads={num_kv_heads} head_dim={head_dim}'
    )
  shape = (num_layers, batch_size, capacity, num_kv_heads, head_dim)
  return KVCache(
    k=jnp.zeros(shape, dtype),
    v=jnp.zeros(shape, dtype),
    positions=jnp.full((batch_size, capacity), EMPTY_POSITION, jnp.int32),
    segments=jnp.zeros((batch_size, capacity), jnp.int32),
    length=jnp.zeros((), jnp.int32),
  )


def write_layer(
  cache: KVCache, layer: int, start: jax.Array, k: jax.Array, v: jax.Array
) -> KVCache:
  """Writes one layer's new keys/values [B, T, K, H] at slots [start, start+T)."""
  start = (layer, 0, start, 0, 0)
  return cache.replace(
    k=jax.lax.dynamic_update_slice(cache.k, k[None].astype(cache.k.dtype), start),
    v=jax.lax.dynamic_update_slice(cache.v, v[None].astype(cache.v.dtype), start),
  )


def advance(cache: KVCache, positions: jax.Array, segments: jax.Array) -> KVCache:
  """Claims slots [length, length+T) for a chunk at `positions`, `segments` [B, T].

  The model calls this first, so that the attention mask already sees the
  chunk's own positions, then writes each layer's keys/values at the old
  `length` with `write_layer`.
  """
  new_positions = jax.lax.dynamic_update_slice(
    cache.positions, positions.astype(jnp.int32), (0, cache.length)
  )
  new_segments = jax.lax.dynamic_update_slice(
    cache.segments, segments.astype(jnp.int32), (0, cache.length)
  )
  return cache.replace(
    positions=new_positions,
    segments=new_segments,
    length=cache.length + positions.shape[1],
  )


def slice_rows(cache: KVCache, start: int, stop: int, batch_index: int = 0):
  """(k, v, positions) of slots [start, stop) of one batch row.

  Returns k, v as [L, n, K, H] and positions as [n].
  """
  return (
    cache.k[:, batch_index, start:stop],
    cache.v[:, batch_index, start:stop],
    cache.positions[batch_index, start:stop],
  )


def reserve(cache: KVCache, slots: int) -> KVCache:
  """Skips `slots` slots, leaving them empty (position -1, always masked).

  Lets a block be computed alone at the slots it will occupy later, which
  keeps the arithmetic of every attention row the same in both places.
  """
  if slots < 0 or int(cache.length) + slots > cache.capacity:
    raise ValueError(f'cannot reserve {slots} slots: {int(cache.length)} of {cache.capacity} used')
  return cache.replace(length=cache.length + slots)
