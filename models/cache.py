"""The KV cache: an explicit pytree of fixed capacity.

Slots, not positions, index the cache. Slot `s` of batch row `b` holds the
keys and values of one token and that token's position `positions[b, s]`
(-1 for an empty slot). Slots `[0, length)` have been written; a chunk of T
tokens is written at slots `[length, length + T)` with
`lax.dynamic_update_slice`, never with a scatter. The capacity S is fixed
when the cache is made, so attention always runs over the same shapes no
matter how full the cache is (XLA's bits depend on shapes; see design.md).

Two layouts for sliding-window layers:
  'full': they keep a full-size cache like global layers; every key ever
    written stays, and the window is applied by the attention mask.
  'ring': they keep a ring of R slots (`ring_slots`: the window plus one
    chunk), slot s at ring index s mod R, with its own positions and
    segments. Attention of those layers runs over the R ring slots, always
    the same shape, masked by the stored positions. A ring holds the rows of
    slots [length - R, length); with positions that grow with slots (prefill,
    decode, grafts at their own slots) no query of a chunk of at most
    R - W + 1 tokens sees an older one, so it attends to the same keys as
    the full layout. A ring never leaves slots empty after written ones
    (`gap_error`): positions continue across such a gap, and the ring would
    drop rows the full layout still shows.

Ring writes are copies (one `dynamic_update_slice` for a decode step, else
a fixed-shape gather of the row each ring index receives), so a slot's row
has the same bits in the ring as in the full layout, and the same ring index
(s mod R) however the rows got there: prefill in any chunks, decode, or a
graft. Fresh and grafted paths therefore run the same attention over the
same ring. The two layouts run attention over other shapes (R vs S slots),
so their bits differ (under XLA, and under Pallas wherever a window wraps
the ring): a model's layout is part of its fingerprint.

The ring layers' keys and values may have another shape (K, H) than the
full-size layers' (Gemma 4: sliding-window layers of head size 256, global
layers of 512 with their own kv heads); such a model keeps its sliding-window
layers in the ring arrays in both layouts, a ring of R = S slots (which never
wraps) standing for 'full'. The cache holds the layers that compute keys and
values; a model layer that reuses another's (Gemma 4's kv sharing) reads
that layer's rows and has none of its own.

Rows leave a cache by groups of layers of one shape (`layer_rows`: the rows
a compact block keeps, read straight out of the full-size arrays or the ring)
and enter it the same way (`write_span`, then `write_layer_rows`). Blocks of
layout 3 (graftjax/blocks.py) enter packed (`write_rows`): a slot's keys of
every layer, each flattened to K_l * H_l values and concatenated in layer
order, as one row [1, n, 1, F] (F = sum of K_l H_l); `row_shape` says which
form such a block takes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

EMPTY_POSITION = -1
LOCAL_LAYOUTS = ('full', 'ring')


def ring_slots(capacity: int, *, window: int, chunk_size: int, multiple: int = 1) -> int:
  """R: slots of a ring that serves a window W and chunks of up to `chunk_size` tokens.

  W - 1 + chunk_size rounded up to `multiple`, at most `capacity` (a ring
  of `capacity` slots never wraps: it is the full layout).
  """
  if min(window, chunk_size, multiple, capacity) <= 0:
    raise ValueError(
      f'ring sizes must be positive, got window={window} chunk_size={chunk_size}'
      f' multiple={multiple} capacity={capacity}'
    )
  return min(capacity, -(-(window - 1 + chunk_size) // multiple) * multiple)


@struct.dataclass
class KVCache:
  """Per-layer keys and values of every token seen so far.

  Attributes:
    k: [Lf, B, S, K, H] keys of the full-size layers (every layer for the
      'full' layout; for rotary schemes, already rotated).
    v: [Lf, B, S, K, H] values.
    positions: [B, S] int32 position of each slot's token, -1 if empty.
    segments: [B, S] int32 attention segment of each slot. A query in
      segment 0 sees every earlier key; a query in segment s > 0 sees only
      keys of segment s (block attention: independent blocks in one cache).
    length: [] int32, slots written so far (the next write index, shared by
      every batch row).
    ring_k, ring_v: [Lr, B, R, Kr, Hr] keys and values of the ring layers
      (slot s at ring index s mod R), or None for the 'full' layout.
    ring_positions, ring_segments: [B, R] int32, as `positions` and
      `segments` for the ring slots, or None.
    ring_layers: (static) the model layers kept in the ring, ascending.
    ring_window: (static) W of the ring layers (0 without a ring): a
      continuation right after slot s sees the ring rows of slots
      [s - W + 1, s).
  """

  k: jax.Array
  v: jax.Array
  positions: jax.Array
  segments: jax.Array
  length: jax.Array
  ring_k: jax.Array | None = None
  ring_v: jax.Array | None = None
  ring_positions: jax.Array | None = None
  ring_segments: jax.Array | None = None
  ring_layers: tuple[int, ...] = struct.field(pytree_node=False, default=())
  ring_window: int = struct.field(pytree_node=False, default=0)

  @property
  def num_layers(self) -> int:
    return self.k.shape[0] + len(self.ring_layers)

  @property
  def batch_size(self) -> int:
    return self.positions.shape[0]

  @property
  def capacity(self) -> int:
    return self.positions.shape[1]

  @property
  def dtype(self) -> jnp.dtype:
    return self.k.dtype

  @property
  def layout(self) -> str:
    """'ring' if some layers keep a ring, else 'full'."""
    return 'ring' if self.ring_layers else 'full'

  @property
  def ring_capacity(self) -> int | None:
    """R, the ring layers' slots (None for the 'full' layout)."""
    return None if self.ring_positions is None else self.ring_positions.shape[1]

  @property
  def packed(self) -> bool:
    """Whether its ring and full-size layers cache rows of different shapes (Gemma 4): rows
    then leave and enter it packed (`row_shape`)."""
    return self.ring_k is not None and self.ring_k.shape[3:] != self.k.shape[3:]

  def layer_shape(self, layer: int) -> tuple[int, int]:
    """(K, H) of `layer`'s keys and values."""
    kind, _ = self.where(layer)
    return tuple((self.ring_k if kind == 'ring' else self.k).shape[3:])

  def row_shape(self) -> tuple[int, int, int]:
    """(L, K, H) of the rows `slice_rows` gives and `write_rows` takes: every layer's (K, H),
    or for a `packed` cache (1, 1, F), F the sum over layers of K_l * H_l."""
    if not self.packed:
      return (self.num_layers,) + tuple(self.k.shape[3:])
    return (1, 1, sum(k * h for k, h in map(self.layer_shape, range(self.num_layers))))

  def where(self, layer: int) -> tuple[str, int]:
    """('full' or 'ring', index of `layer` in that layout's arrays)."""
    if layer in self.ring_layers:
      return 'ring', self.ring_layers.index(layer)
    return 'full', layer - sum(r < layer for r in self.ring_layers)


def init(
  *,
  num_layers: int,
  batch_size: int,
  capacity: int,
  num_kv_heads: int,
  head_dim: int,
  dtype: jnp.dtype = jnp.float32,
  ring_layers: tuple[int, ...] = (),
  ring_capacity: int | None = None,
  ring_window: int = 0,
  ring_kv_heads: int | None = None,
  ring_head_dim: int | None = None,
) -> KVCache:
  """An empty cache: zeros everywhere, every position -1.

  With `ring_layers`, those layers keep a ring of `ring_capacity` slots
  (`ring_slots`) for a window of `ring_window`, with `ring_kv_heads` and
  `ring_head_dim` (default: those of the others); the others the full capacity.
  """
  if min(num_layers, batch_size, capacity, num_kv_heads, head_dim) <= 0:
    raise ValueError(
      'every cache dimension must be positive, got'
      f' num_layers={num_layers} batch_size={batch_size}'
      f' capacity={capacity} num_kv_heads={num_kv_heads} head_dim={head_dim}'
    )
  ring_layers = tuple(sorted(ring_layers))
  if ring_layers and (
    len(set(ring_layers)) != len(ring_layers)
    or not 0 <= ring_layers[0] <= ring_layers[-1] < num_layers
    or not 0 < (ring_capacity or 0) <= capacity
    or ring_window <= 0
  ):
    raise ValueError(
      f'ring layers {ring_layers} of {num_layers}, ring of {ring_capacity} slots for a window'
      f' of {ring_window} in a capacity of {capacity}: need distinct layers, W > 0, 0 < R <= S'
    )

  def layers(count, slots, heads, width):
    shape = (count, batch_size, slots, heads, width)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

  k, v = layers(num_layers - len(ring_layers), capacity, num_kv_heads, head_dim)
  ring = {}
  if ring_layers:
    ring_k, ring_v = layers(
      len(ring_layers), ring_capacity, ring_kv_heads or num_kv_heads, ring_head_dim or head_dim
    )
    ring = {
      'ring_k': ring_k,
      'ring_v': ring_v,
      'ring_positions': jnp.full((batch_size, ring_capacity), EMPTY_POSITION, jnp.int32),
      'ring_segments': jnp.zeros((batch_size, ring_capacity), jnp.int32),
      'ring_layers': ring_layers,
      'ring_window': ring_window,
    }
  return KVCache(
    k=k,
    v=v,
    positions=jnp.full((batch_size, capacity), EMPTY_POSITION, jnp.int32),
    segments=jnp.zeros((batch_size, capacity), jnp.int32),
    length=jnp.zeros((), jnp.int32),
    **ring,
  )


def ring_put(ring: jax.Array, rows: jax.Array, start, *, axis: int, n=None) -> jax.Array:
  """`ring` with rows [.., m, ..] (along `axis`) of slots [start, start + n) at ring indices
  (start + i) mod R; the last row of each index wins, the other indices keep what they hold.

  A pure copy, so exact: a row of length T = 1 (decode) is one `dynamic_update_slice`;
  otherwise every ring index gathers the row it receives (a fixed-shape gather, no
  scatter) or keeps its own. n (default m) may be traced.
  """
  size, m = ring.shape[axis], rows.shape[axis]
  rows = rows.astype(ring.dtype)
  start = jnp.asarray(start, jnp.int32)
  if m == 1 and n is None:
    index = [0] * ring.ndim
    index[axis] = start % size
    return jax.lax.dynamic_update_slice(ring, rows, index)
  n = jnp.asarray(m if n is None else n, jnp.int32)
  offset = (jnp.arange(size, dtype=jnp.int32) - start) % size  # row d lands at index j
  latest = offset + size * (jnp.maximum(n - 1 - offset, 0) // size)  # the last such row
  taken = jnp.take(rows, jnp.clip(latest, 0, m - 1), axis=axis)
  shape = [1] * ring.ndim
  shape[axis] = size
  return jnp.where((offset < n).reshape(shape), taken, ring)


def layer_view(cache: KVCache, layer: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(k, v [B, S', K, H], positions, segments [B, S']) that `layer`'s attention runs over:
  the full capacity S' = S, or the ring S' = R."""
  kind, i = cache.where(layer)
  if kind == 'ring':
    return cache.ring_k[i], cache.ring_v[i], cache.ring_positions, cache.ring_segments
  return cache.k[i], cache.v[i], cache.positions, cache.segments


def write_layer(
  cache: KVCache, layer: int, start: jax.Array, k: jax.Array, v: jax.Array
) -> KVCache:
  """Writes one layer's new keys/values [B, T, K, H] at slots [start, start+T)."""
  kind, i = cache.where(layer)
  if kind == 'ring' and cache.ring_capacity < cache.capacity:
    return cache.replace(
      ring_k=cache.ring_k.at[i].set(ring_put(cache.ring_k[i], k, start, axis=1)),
      ring_v=cache.ring_v.at[i].set(ring_put(cache.ring_v[i], v, start, axis=1)),
    )
  name_k, name_v = ('ring_k', 'ring_v') if kind == 'ring' else ('k', 'v')
  index = (i, 0, start, 0, 0)
  old_k, old_v = getattr(cache, name_k), getattr(cache, name_v)
  return cache.replace(
    **{
      name_k: jax.lax.dynamic_update_slice(old_k, k[None].astype(old_k.dtype), index),
      name_v: jax.lax.dynamic_update_slice(old_v, v[None].astype(old_v.dtype), index),
    }
  )


def advance(cache: KVCache, positions: jax.Array, segments: jax.Array) -> KVCache:
  """Claims slots [length, length+T) for a chunk at `positions`, `segments` [B, T].

  The model calls this first, so that the attention mask already sees the
  chunk's own positions, then writes each layer's keys/values at the old
  `length` with `write_layer`.
  """
  positions, segments = positions.astype(jnp.int32), segments.astype(jnp.int32)
  new_positions = jax.lax.dynamic_update_slice(cache.positions, positions, (0, cache.length))
  new_segments = jax.lax.dynamic_update_slice(cache.segments, segments, (0, cache.length))
  ring = {}
  if cache.ring_layers:
    ring = {
      'ring_positions': ring_put(cache.ring_positions, positions, cache.length, axis=1),
      'ring_segments': ring_put(cache.ring_segments, segments, cache.length, axis=1),
    }
  return cache.replace(
    positions=new_positions,
    segments=new_segments,
    length=cache.length + positions.shape[1],
    **ring,
  )


def ring_first_slot(cache: KVCache) -> int:
  """The oldest slot whose rows the ring layers still hold (0 without a ring)."""
  if not cache.ring_layers:
    return 0
  return max(0, int(cache.length) - cache.ring_capacity)


def layer_rows(cache: KVCache, layers, start: int, stop: int, batch_index: int = 0):
  """(k, v) [len(layers), n, K, H]: the rows of slots [start, stop) of one batch row in each of
  `layers` (layers of this cache, ascending, all of one (K, H)), read straight out of the
  full-size arrays or the ring (slot s at ring index s mod R, in slot order); only these
  rows are made. The caller checks that a ring still holds them (`ring_first_slot`)."""
  layers = tuple(layers)
  where = [cache.where(layer) for layer in layers]
  slots = jnp.arange(start, stop, dtype=jnp.int32)

  def rows(full, ring):
    kinds = {kind for kind, _ in where}
    if kinds == {'full'}:
      return full[jnp.asarray([i for _, i in where], jnp.int32), batch_index, start:stop]
    index = slots % cache.ring_capacity
    if kinds == {'ring'}:
      picked = ring[jnp.asarray([i for _, i in where], jnp.int32), batch_index]
      return jnp.take(picked, index, axis=1)
    return jnp.stack(
      [
        full[i, batch_index, start:stop]
        if kind == 'full'
        else jnp.take(ring[i, batch_index], index, axis=0)
        for kind, i in where
      ]
    )

  return rows(cache.k, cache.ring_k), rows(cache.v, cache.ring_v)


def write_span(cache: KVCache, positions, segment, start, n) -> KVCache:
  """Writes the first n of positions [m] (and `segment`) at slots [start, start+n) of every row,
  ring slots included; `length` becomes start + n. Keys and values are left as they are
  (`write_layer_rows` writes them). n and start may be traced."""
  m = positions.shape[0]
  keep = jnp.arange(m) < n
  segments = jnp.broadcast_to(segment, (1, m)).astype(jnp.int32)

  def write(old, new):
    current = jax.lax.dynamic_slice(old, (0, start), (old.shape[0], m))
    merged = jnp.where(keep[None], jnp.broadcast_to(new, current.shape), current)
    return jax.lax.dynamic_update_slice(old, merged.astype(old.dtype), (0, start))

  out = {
    'positions': write(cache.positions, positions[None]),
    'segments': write(cache.segments, segments),
    'length': jnp.asarray(start + n, jnp.int32),
  }
  if cache.ring_layers:
    out.update(
      ring_positions=ring_put(cache.ring_positions, positions[None], start, axis=1, n=n),
      ring_segments=ring_put(cache.ring_segments, segments, start, axis=1, n=n),
    )
  return cache.replace(**out)


def write_layer_rows(cache: KVCache, k, v, layers: tuple[int, ...], start, n) -> KVCache:
  """Writes the first n of k, v [len(layers), m, K, H] at slots [start, start+n) of `layers`
  (static) in every row: a full-size layer's slots [start+n, start+m) keep what they hold, a
  ring's indices no row lands on too (`ring_put`). Positions are `write_span`'s. n and start
  may be traced; start + m <= S."""
  m = k.shape[1]
  keep = (jnp.arange(m) < n)[None, :, None, None]
  arrays = {name: getattr(cache, name) for name in ('k', 'v', 'ring_k', 'ring_v')}
  for j, layer in enumerate(layers):
    kind, i = cache.where(layer)
    for name, rows in (('k', k[j]), ('v', v[j])):
      name = f'ring_{name}' if kind == 'ring' else name
      old = arrays[name]
      rows = rows.astype(old.dtype)[None]  # [1, m, K, H], broadcast over the batch
      if kind == 'ring':
        arrays[name] = old.at[i].set(ring_put(old[i], rows, start, axis=1, n=n))
        continue
      index = (i, 0, start, 0, 0)
      current = jax.lax.dynamic_slice(old, index, (1, old.shape[1], m, *old.shape[3:]))
      merged = jnp.where(keep[None], jnp.broadcast_to(rows[None], current.shape), current)
      arrays[name] = jax.lax.dynamic_update_slice(old, merged, index)
  return cache.replace(**arrays)


def unpack_rows(cache: KVCache, rows: jax.Array) -> list[jax.Array]:
  """Packed rows [1, m, 1, F] of a `packed` cache as one [m, K_l, H_l] per layer."""
  out, offset = [], 0
  for layer in range(cache.num_layers):
    heads, width = cache.layer_shape(layer)
    out.append(rows[0, :, 0, offset : offset + heads * width].reshape(-1, heads, width))
    offset += heads * width
  return out


def write_rows(cache: KVCache, k, v, positions, segment, start, n) -> KVCache:
  """Writes the first n of k, v [L, m, K, H] (every model layer; [1, m, 1, F] packed for a
  `packed` cache) and positions [m] (and `segment`) at slots [start, start+n) of every row;
  slots [start+n, start+m) keep what they hold, and so do ring indices no row lands on. n
  and start may be traced; m is the static row count (start + m <= S)."""
  m = positions.shape[0]
  keep = jnp.arange(m) < n  # [m]

  def write(old, new, axis):  # new: [m, ...] rows along `axis` of old
    starts = [0] * old.ndim
    starts[axis] = start
    sizes = list(old.shape)
    sizes[axis] = m
    current = jax.lax.dynamic_slice(old, starts, sizes)
    shape = [1] * old.ndim
    shape[axis] = m
    merged = jnp.where(keep.reshape(shape), jnp.broadcast_to(new, current.shape), current)
    return jax.lax.dynamic_update_slice(old, merged.astype(old.dtype), starts)

  segments = jnp.broadcast_to(segment, (1, m)).astype(jnp.int32)
  full = [layer for layer in range(cache.num_layers) if layer not in cache.ring_layers]

  def rows(a, layers):  # [L, m, K, H] -> [len(layers), 1, m, K, H]
    if cache.packed:
      per_layer = unpack_rows(cache, a)
      return jnp.stack([per_layer[i] for i in layers]).astype(cache.dtype)[:, None]
    if len(layers) < a.shape[0]:
      a = a[jnp.asarray(layers, jnp.int32)]
    return a.astype(cache.dtype)[:, None]

  out = {
    'k': write(cache.k, rows(k, full), 2),
    'v': write(cache.v, rows(v, full), 2),
    'positions': write(cache.positions, positions[None], 1),
    'segments': write(cache.segments, segments, 1),
    'length': jnp.asarray(start + n, jnp.int32),
  }
  if cache.ring_layers:  # rows broadcast over the batch in the `where` of `ring_put`
    ring = lambda old, new, axis: ring_put(old, new, start, axis=axis, n=n)
    out.update(
      ring_k=ring(cache.ring_k, rows(k, cache.ring_layers), 2),
      ring_v=ring(cache.ring_v, rows(v, cache.ring_layers), 2),
      ring_positions=ring(cache.ring_positions, positions[None], 1),
      ring_segments=ring(cache.ring_segments, segments, 1),
    )
  return cache.replace(**out)


def gap_error(cache: KVCache, start: int) -> str | None:
  """Why slots [length, start) may not be left empty in `cache`, or None if they may.

  A ring that skips slots after written ones would drop rows that later
  queries still see in the full layout (positions continue across the gap),
  so a ring cache leaves slots empty only before its first write.
  """
  length = int(cache.length)
  if cache.ring_layers and cache.ring_capacity < cache.capacity and length and start > length:
    return (
      f'slots [{length}, {start}) would stay empty after written ones in a ring of'
      f' {cache.ring_capacity} slots, which then drops rows later queries see: the ring'
      " layout leaves slots empty only before its first write (use local_cache='full')"
    )
  return None


def reserve(cache: KVCache, slots: int, *, allow_ring_gap: bool = False) -> KVCache:
  """Skips `slots` slots, leaving them empty (position -1, always masked).

  Lets a block be computed alone at the slots it will occupy later, which
  keeps the arithmetic of every attention row the same in both places.
  A ring cache skips slots only before its first write (`gap_error`), unless
  `allow_ring_gap`: the caller has checked that no later query sees a row the
  gap drops (as composition does), and the ring keeps its older rows at the
  skipped ring indices.
  """
  if slots < 0 or int(cache.length) + slots > cache.capacity:
    raise ValueError(f'cannot reserve {slots} slots: {int(cache.length)} of {cache.capacity} used')
  error = not allow_ring_gap and gap_error(cache, int(cache.length) + slots)
  if error:
    raise ValueError(error)
  return cache.replace(length=cache.length + slots)
