"""KV blocks: a captured span of cache state, and grafting it back.

`capture(cache, span)` copies the keys and values of every layer (global and
sliding-window alike) for slots [start, stop) of one batch row, with their
positions and the metadata needed to refuse a wrong restore. `graft(cache,
block)` writes them into a cache at the same slots and positions. Both are
pure: they return new values and never change their inputs.

Every check runs before any state is built, so a refused graft leaves
nothing half-done, and a graft that would do nothing is an error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.models import cache as cache_lib

LAYOUT_VERSION = 1


class GraftError(ValueError):
  """A block cannot be grafted into this cache; nothing was changed."""


@dataclasses.dataclass(frozen=True)
class Span:
  """Slots [start, stop) of one batch row."""

  start: int
  stop: int

  def __post_init__(self):
    if self.start < 0 or self.stop < self.start:
      raise ValueError(f'bad span [{self.start}, {self.stop})')

  def __len__(self) -> int:
    return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class BlockMeta:
  """What a block is, and what it may be grafted into.

  Attributes:
    model_fingerprint: SHA-256 over the model's config, weights and tokenizer.
    token_ids: the tokens whose state the block holds, one per slot.
    start: the first slot the block was captured from (its own slot).
    first_position: position of the block's first token when captured.
    shift: positions the block was moved by since capture (0: own
      position). A shifted block is grafted only when asked for explicitly.
    dtype: numpy name of the k/v dtype ('float32', 'bfloat16').
    position_scheme: how positions entered attention ('rope', ...).
    layout_version: version of the block layout (`LAYOUT_VERSION`).
  """

  model_fingerprint: str
  token_ids: tuple[int, ...]
  start: int
  dtype: str
  position_scheme: str
  first_position: int = 0
  shift: int = 0
  layout_version: int = LAYOUT_VERSION

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out['token_ids'] = list(self.token_ids)
    return out

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> BlockMeta:
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - fields
    if unknown:
      raise ValueError(f'unknown block metadata fields: {sorted(unknown)}')
    return cls(**{**data, 'token_ids': tuple(int(t) for t in data['token_ids'])})


@dataclasses.dataclass(frozen=True)
class KVBlock:
  """Captured cache state of one span.

  Attributes:
    k: [L, n, K, H] keys of the span, every layer.
    v: [L, n, K, H] values of the span, every layer.
    positions: [n] int32 positions of the span's tokens.
    meta: provenance and compatibility metadata.
  """

  k: np.ndarray | jax.Array
  v: np.ndarray | jax.Array
  positions: np.ndarray | jax.Array
  meta: BlockMeta

  def __post_init__(self):
    n = len(self.meta.token_ids)
    if self.k.shape != self.v.shape:
      raise ValueError(f'k {self.k.shape} and v {self.v.shape} differ in shape')
    if self.k.ndim != 4 or self.k.shape[1] != n:
      raise ValueError(f'k must be [L, n={n}, K, H] for {n} token ids, got {self.k.shape}')
    if tuple(self.positions.shape) != (n,):
      raise ValueError(f'positions must be [{n}], got {self.positions.shape}')

  @property
  def span(self) -> Span:
    return Span(self.meta.start, self.meta.start + len(self))

  def __len__(self) -> int:
    return len(self.meta.token_ids)

  def arrays(self) -> dict[str, np.ndarray]:
    """The block's arrays as host numpy arrays, by name."""
    return {
      'k': np.asarray(self.k),
      'v': np.asarray(self.v),
      'positions': np.asarray(self.positions, np.int32),
    }


def capture(
  cache: cache_lib.KVCache,
  span: Span,
  *,
  token_ids,
  model_fingerprint: str,
  position_scheme: str,
  batch_index: int = 0,
) -> KVBlock:
  """Copies slots `span` of row `batch_index` out of `cache` as a block."""
  token_ids = tuple(int(t) for t in token_ids)
  if len(span) == 0:
    raise GraftError('cannot capture an empty span')
  if len(token_ids) != len(span):
    raise GraftError(f'{len(token_ids)} token ids for a span of {len(span)} slots')
  length = int(cache.length)
  if span.stop > length:
    raise GraftError(
      f'span [{span.start}, {span.stop}) reaches past the {length} written slots of the cache'
    )
  if not 0 <= batch_index < cache.batch_size:
    raise GraftError(f'batch_index={batch_index} outside a batch of {cache.batch_size}')
  k, v, positions = cache_lib.slice_rows(cache, span.start, span.stop, batch_index)
  if bool(jnp.any(positions < 0)):
    raise GraftError(f'span [{span.start}, {span.stop}) holds empty slots')
  meta = BlockMeta(
    model_fingerprint=model_fingerprint,
    token_ids=token_ids,
    start=span.start,
    first_position=int(positions[0]),
    dtype=jnp.dtype(cache.dtype).name,
    position_scheme=str(position_scheme),
  )
  return KVBlock(k=k, v=v, positions=positions, meta=meta)


def relocate(block: KVBlock, first_position: int, *, model) -> KVBlock:
  """`block` moved so its first token sits at `first_position`.

  Positions shift by delta = first_position - block.positions[0]; the
  model re-rotates the keys where its scheme needs it (`relocate_keys`).
  The block's slots do not change, and `meta.shift` records the move.
  """
  if block.meta.position_scheme != model.position_scheme:
    raise GraftError(
      f'block scheme {block.meta.position_scheme!r} != model {model.position_scheme!r}'
    )
  delta = int(first_position) - int(np.asarray(block.positions)[0])
  meta = dataclasses.replace(block.meta, shift=block.meta.shift + delta)
  return KVBlock(
    k=model.relocate_keys(block.k, delta),
    v=block.v,
    positions=jnp.asarray(block.positions) + delta,
    meta=meta,
  )


def check_compatible(
  cache: cache_lib.KVCache,
  block: KVBlock,
  *,
  model_fingerprint: str,
  position_scheme: str,
) -> None:
  """Raises GraftError naming the first reason `block` cannot enter `cache`."""
  meta = block.meta
  if meta.layout_version != LAYOUT_VERSION:
    raise GraftError(
      f'block layout version {meta.layout_version}, this code reads {LAYOUT_VERSION}'
    )
  if meta.position_scheme != str(position_scheme):
    raise GraftError(
      f'block position scheme {meta.position_scheme!r} != model {str(position_scheme)!r}'
    )
  if meta.dtype != jnp.dtype(cache.dtype).name:
    raise GraftError(f'block dtype {meta.dtype} != cache dtype {cache.dtype}')
  if jnp.dtype(block.k.dtype).name != meta.dtype:
    raise GraftError(f'block arrays are {block.k.dtype} but metadata says {meta.dtype}')
  if meta.model_fingerprint != model_fingerprint:
    raise GraftError(
      'block was captured from another model: fingerprint'
      f' {meta.model_fingerprint[:16]}… != {model_fingerprint[:16]}…'
    )
  _, _, _, kv_heads, head_dim = cache.k.shape
  if block.k.shape[0] != cache.num_layers or block.k.shape[2:] != (kv_heads, head_dim):
    raise GraftError(
      f'block k is {tuple(block.k.shape)}, cache rows are'
      f' [{cache.num_layers}, n, {kv_heads}, {head_dim}]'
    )
  if len(block) == 0:
    raise GraftError('empty block: grafting it would do nothing')


def graft(
  cache: cache_lib.KVCache,
  block: KVBlock,
  *,
  model_fingerprint: str,
  position_scheme: str,
  allow_shifted: bool = False,
  donate: bool = False,
) -> cache_lib.KVCache:
  """Installs `block` at its own slots and positions in every batch row.

  With `donate=True` the input cache's buffers are reused for the result
  (the block is written in place, as `Gemma.forward` does with its cache);
  the input cache must not be used afterwards. The default leaves it intact.

  A block moved to other positions (`meta.shift != 0`, see the model's
  `relocate`) is refused unless `allow_shifted` is set.

  The block's slots must lie at or after the cache's write index (nothing
  already there is overwritten) and inside its capacity. Slots between the
  old write index and the block stay empty (position -1, masked out).

  Returns:
    A new cache whose `length` is the block's stop slot.
  Raises:
    GraftError: before any state is built, if the block does not fit.
  """
  check_compatible(
    cache,
    block,
    model_fingerprint=model_fingerprint,
    position_scheme=position_scheme,
  )
  if block.meta.shift and not allow_shifted:
    raise GraftError(
      f'block was moved by {block.meta.shift} positions; pass'
      ' allow_shifted=True to graft it away from its own position'
    )
  span = block.span
  length = int(cache.length)
  if span.stop > cache.capacity:
    raise GraftError(
      f'block slots [{span.start}, {span.stop}) do not fit a cache of capacity {cache.capacity}'
    )
  if span.start < length:
    raise GraftError(
      f'block slots [{span.start}, {span.stop}) overlap the {length} slots already written'
    )
  install = _install_donating if donate else _install
  return install(
    cache,
    jnp.asarray(block.k),
    jnp.asarray(block.v),
    jnp.asarray(block.positions, jnp.int32),
    jnp.asarray(span.start, jnp.int32),
  )


def _install_rows(cache: cache_lib.KVCache, k, v, positions, start) -> cache_lib.KVCache:
  """Writes k, v [L, n, K, H] and positions [n] at slots [start, start+n) of every row."""
  batch, n = cache.batch_size, positions.shape[0]
  rows = lambda a: jnp.broadcast_to(
    a.astype(cache.dtype)[:, None], (a.shape[0], batch) + a.shape[1:]
  )
  return cache.replace(
    k=jax.lax.dynamic_update_slice(cache.k, rows(k), (0, 0, start, 0, 0)),
    v=jax.lax.dynamic_update_slice(cache.v, rows(v), (0, 0, start, 0, 0)),
    positions=jax.lax.dynamic_update_slice(
      cache.positions, jnp.broadcast_to(positions[None], (batch, n)), (0, start)
    ),
    length=(start + n).astype(jnp.int32),
  )


_install = jax.jit(_install_rows)
_install_donating = jax.jit(_install_rows, donate_argnums=0)
