"""KV blocks: a captured span of cache state, and grafting it back.

`capture(cache, span, target=...)` copies, for slots [start, stop) of one batch
row, the rows a continuation right after the span can attend to (compact: every
row of a global layer, the last min(n, W - 1) rows of a sliding-window layer,
read straight out of a ring where the cache keeps one; `keep='span'` keeps
every row of every layer, for callers that continue from inside the block),
with their positions and the metadata needed to refuse a wrong restore: the
model (`target`, a `GraftTarget` the model hands out), the tokens, and the
cache shape and attention segment the block was computed under. `graft(cache,
block, target=...)` writes them into a cache at the same slots, positions and
segment. Both are pure: they return new values and never change their inputs.
`KVBlock` is a pytree (its metadata static), like `KVCache`.

Every check runs before any state is built, so a refused graft leaves
nothing half-done, and a graft that would do nothing is an error.

Exactness is never assumed: a block records the prefill chunk size it was
computed with, and under kernels that are not chunk-invariant `graft` takes
it only where the caller says the same chunk size is in force.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from graftjax.errors import GraftjaxError
from graftjax.models import cache as cache_lib
from graftjax.models import target as target_lib

# 2: BlockMeta records capacity, batch_size and segment (chunk_size optional: 0, left out
#    of the JSON form and the key, when not recorded).
# 3: chunk_size is always recorded (> 0). Blocks of layout 2 are still read, with their keys.
# 4: compact: k, v hold the layers kept whole, k_tail, v_tail the last `tail_rows` rows of
#    `tail_layers` (unpacked, each group of one (K, H)). Layouts 2 and 3 held every row of
#    every layer (zeros where a ring had dropped them; Gemma 4's layers packed in one row):
#    still read and grafted.
LAYOUT_VERSION = 4
READ_LAYOUTS = (2, 3, 4)
KEEP = ('needed', 'span')

_INT32_MAX = 2**31 - 1
# Installs are compiled for row counts that are multiples of this.
INSTALL_BUCKET = 64

# Measured on gemma-3-270m (float32, CPU, impl='xla'): max |Δlogit| of a
# continuation after grafting a block into a cache of another capacity.
_OTHER_SHAPE_DELTA = '7.8e-5'


class GraftError(GraftjaxError, ValueError):
  """A block cannot be captured or grafted as asked; nothing was changed."""


class BlockMetaError(GraftjaxError, ValueError):
  """Block metadata is malformed. `field` names the offending field."""

  def __init__(self, field: str, message: str):
    super().__init__(f'block metadata field {field!r}: {message}')
    self.field = field


class UnsupportedLayoutError(BlockMetaError):
  """Block metadata of a layout version this code does not read."""


@dataclasses.dataclass(frozen=True)
class Span:
  """Slots [start, stop) of one batch row."""

  start: int
  stop: int

  def __post_init__(self):
    if not (_is_int(self.start) and _is_int(self.stop)):
      raise GraftError(f'a span is two ints, got [{self.start!r}, {self.stop!r})')
    if self.start < 0 or self.stop < self.start:
      raise GraftError(f'bad span [{self.start}, {self.stop})')

  def __len__(self) -> int:
    return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class BlockMeta:
  """What a block is, and what it may be grafted into.

  Attributes:
    model_fingerprint: SHA-256 over the model's config, weights and tokenizer.
    token_ids: the tokens whose state the block holds, one per slot.
    start: the first slot the block was captured from (its own slot).
    dtype: numpy name of the k/v dtype ('float32', 'bfloat16').
    position_scheme: how positions entered attention ('rope', ...).
    capacity: slots of the cache the block was computed in.
    batch_size: batch rows of the cache the block was computed in.
    segment: attention segment of the block's slots (see `KVCache.segments`).
    first_position: position of the block's first token when captured; the
      block's positions are first_position + shift + i, i = 0 .. n-1.
    shift: positions the block was moved by since capture (0: own
      position). A shifted block is grafted only when asked for explicitly.
    chunk_size: tokens per forward call of the prefill that computed the
      block (under kernels that are not chunk-invariant its bits depend on
      it). Always recorded in layout 3; 0 in a block of layout 2 that does not
      record it, and then left out of the JSON form (and so of the key), so
      such blocks keep their keys.
    tail_layers: (layout 4) the cached layers (indices into the cache's layers) whose
      last `tail_rows` rows only the block holds (in k_tail, v_tail): the
      sliding-window layers. () when every layer is held whole.
    tail_rows: (layout 4) rows held of each tail layer: min(n, W - 1) as
      captured (`keep='needed'`), n with `keep='span'`, fewer (down to 0: then
      no tail arrays) in a page that serves only later queries (`paging.pages`).
      0 without tail layers.
    layout_version: version of the block layout: by default 4
      (`LAYOUT_VERSION`) when `chunk_size` is recorded, else 2.
  """

  model_fingerprint: str
  token_ids: tuple[int, ...]
  start: int
  dtype: str
  position_scheme: str
  capacity: int
  batch_size: int = 1
  segment: int = 0
  first_position: int = 0
  shift: int = 0
  chunk_size: int = 0
  tail_layers: tuple[int, ...] = ()
  tail_rows: int = 0
  layout_version: int | None = None

  def __post_init__(self):
    if isinstance(self.token_ids, list):
      object.__setattr__(self, 'token_ids', tuple(self.token_ids))
    if isinstance(self.tail_layers, list):
      object.__setattr__(self, 'tail_layers', tuple(self.tail_layers))
    if self.layout_version is None:
      version = LAYOUT_VERSION if self.chunk_size else 2
      object.__setattr__(self, 'layout_version', version)
    _check_meta_fields({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
    if self.layout_version >= 3 and self.chunk_size == 0:
      raise BlockMetaError('chunk_size', f'layout {self.layout_version} records it (> 0), got 0')
    if self.layout_version < 4 and (self.tail_layers or self.tail_rows):
      raise BlockMetaError(
        'tail_layers', f'layout {self.layout_version} holds every row of every layer'
      )

  @property
  def compact(self) -> bool:
    """Whether the block is of layout 4 (k, v hold its whole layers, k_tail, v_tail its tail)."""
    return self.layout_version >= 4

  def rows(self, num_layers: int) -> tuple[tuple[int, int], ...]:
    """(first_row, stop_row) of the span's n rows held for each of `num_layers` cached layers."""
    n = len(self.token_ids)
    return tuple(
      (n - self.tail_rows, n) if layer in self.tail_layers else (0, n)
      for layer in range(num_layers)
    )

  def to_json(self) -> dict[str, Any]:
    """Every field (token ids as a list), less those at their `UNRECORDED` value."""
    out = {
      f.name: getattr(self, f.name)
      for f in dataclasses.fields(self)
      if not is_unrecorded(f.name, getattr(self, f.name))
    }
    out['token_ids'] = list(self.token_ids)
    if 'tail_layers' in out:
      out['tail_layers'] = list(self.tail_layers)
    return out

  @classmethod
  def from_json(cls, data: Any) -> BlockMeta:
    """The metadata `to_json` wrote, every field type-checked strictly.

    Raises:
      UnsupportedLayoutError: for a `layout_version` not in `READ_LAYOUTS`.
      BlockMetaError: naming the first field that is unknown, missing (in
        layout 2 `chunk_size` may be), of the wrong JSON type (a bool is not
        an int) or out of range.
    """
    if not isinstance(data, dict):
      raise BlockMetaError('meta', f'expected a JSON object, got {type(data).__name__}')
    if 'layout_version' in data:  # first: another layout may have other fields
      version = data['layout_version']
      _check_meta_fields({'layout_version': version})
      if version not in READ_LAYOUTS:
        raise UnsupportedLayoutError(
          'layout_version', f'block layout version {version}, this code reads {READ_LAYOUTS}'
        )
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names), key=str)
    if unknown:
      raise BlockMetaError(str(unknown[0]), f'unknown field (fields: {names})')
    optional = UNRECORDED if data.get('layout_version') == 2 else _TAIL_UNRECORDED
    missing = [name for name in names if name not in data and name not in optional]
    if missing:
      raise BlockMetaError(missing[0], 'missing')
    token_ids = data['token_ids']
    if not isinstance(token_ids, list):
      raise BlockMetaError('token_ids', f'expected a list, got {type(token_ids).__name__}')
    tail_layers = data.get('tail_layers', [])
    if not isinstance(tail_layers, list):
      raise BlockMetaError('tail_layers', f'expected a list, got {type(tail_layers).__name__}')
    return cls(**{**data, 'token_ids': tuple(token_ids), 'tail_layers': tuple(tail_layers)})


# Fields left out of the JSON form at this value (it means "not recorded": chunk_size in a
# block of layout 2, the tail of one that holds every row); a missing one reads back as it
# there. The key rule: blocks of layouts 2 and 3 keep the JSON form, and so the key, they had
# before the field existed.
_TAIL_UNRECORDED = {'tail_layers': (), 'tail_rows': 0}
UNRECORDED = {'chunk_size': 0, **_TAIL_UNRECORDED}


def is_unrecorded(name: str, value: Any) -> bool:
  """Whether field `name` holds its `UNRECORDED` value (and is left out of the JSON form)."""
  if name not in UNRECORDED:
    return False
  if name == 'tail_layers':
    return isinstance(value, tuple) and value == ()
  return _is_int(value) and value == UNRECORDED[name]


_STR_FIELDS = ('model_fingerprint', 'dtype', 'position_scheme')
# Each int field and its smallest value.
_INT_FIELDS = {
  'start': 0,
  'capacity': 1,
  'batch_size': 1,
  'segment': 0,
  'first_position': 0,
  'shift': -_INT32_MAX,
  'chunk_size': 0,
  'tail_rows': 0,
  'layout_version': 0,
}


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _check_meta_fields(fields: dict[str, Any]) -> None:
  """Raises BlockMetaError for the first field of a wrong type or value."""
  for name in _STR_FIELDS:
    if name in fields and not isinstance(fields[name], str):
      raise BlockMetaError(name, f'expected a str, got {fields[name]!r}')
  for name, low in _INT_FIELDS.items():
    if name not in fields:
      continue
    value = fields[name]
    if not _is_int(value) or not low <= value <= _INT32_MAX:
      raise BlockMetaError(name, f'expected an int in [{low}, {_INT32_MAX}], got {value!r}')
  if 'token_ids' in fields:
    token_ids = fields['token_ids']
    if not isinstance(token_ids, tuple):
      raise BlockMetaError('token_ids', f'expected a tuple, got {type(token_ids).__name__}')
    # One pass over the types, then min/max: blocks hold up to ~10^5 tokens.
    if set(map(type, token_ids)) - {int} or (
      token_ids and not 0 <= min(token_ids) <= max(token_ids) <= _INT32_MAX
    ):
      i, t = next(
        (i, t) for i, t in enumerate(token_ids) if not _is_int(t) or not 0 <= t <= _INT32_MAX
      )
      raise BlockMetaError('token_ids', f'item {i}: expected an int in [0, 2^31), got {t!r}')
  if 'tail_layers' in fields:
    tail = fields['tail_layers']
    if not isinstance(tail, tuple) or not all(_is_int(i) and 0 <= i <= _INT32_MAX for i in tail):
      raise BlockMetaError('tail_layers', f'expected a tuple of layer indices, got {tail!r}')
    if list(tail) != sorted(set(tail)):
      raise BlockMetaError('tail_layers', f'expected distinct ascending layers, got {tail!r}')
  if {'tail_layers', 'tail_rows', 'token_ids'} <= set(fields):
    n, rows = len(fields['token_ids']), fields['tail_rows']
    if (rows and not fields['tail_layers']) or rows > n:
      raise BlockMetaError(
        'tail_rows',
        f'{rows} rows of tail layers {list(fields["tail_layers"])}: expected 0 .. n = {n}'
        ' with tail layers, 0 without',
      )
  if {'start', 'capacity', 'token_ids'} <= set(fields):
    stop = fields['start'] + len(fields['token_ids'])
    if stop > fields['capacity']:
      raise BlockMetaError(
        'capacity', f'slots [{fields["start"]}, {stop}) do not fit capacity {fields["capacity"]}'
      )
  if {'first_position', 'shift'} <= set(fields) and fields['first_position'] + fields['shift'] < 0:
    raise BlockMetaError(
      'shift', f'moves the block to position {fields["first_position"] + fields["shift"]}'
    )


def _is_array(a) -> bool:
  return hasattr(a, 'shape') and hasattr(a, 'dtype')


@struct.dataclass
class KVBlock:
  """Captured cache state of one span: a pytree whose metadata is static.

  Attributes:
    k: [Lw, n, K, H] keys of the span's every row in the layers held whole (layout 4: the
      cache's layers but `meta.tail_layers`, in order). In layouts 2 and 3 every cached
      layer, [L, n, K, H], packed as [1, n, 1, F] for a model whose layers cache different
      shapes (Gemma 4: `cache.KVCache.row_shape`), zeros where a ring had dropped rows.
    v: values of the span, as k.
    positions: [n] int32 positions of the span's tokens.
    meta: provenance and compatibility metadata (static: not a leaf).
    k_tail: [Lt, r, Kt, Ht] keys of the last r = `meta.tail_rows` rows of each of
      `meta.tail_layers`, or None without tail layers (or rows).
    v_tail: values of the tail, as k_tail.
  """

  k: np.ndarray | jax.Array
  v: np.ndarray | jax.Array
  positions: np.ndarray | jax.Array
  meta: BlockMeta = struct.field(pytree_node=False)
  k_tail: np.ndarray | jax.Array | None = None
  v_tail: np.ndarray | jax.Array | None = None

  def __post_init__(self):
    if not isinstance(self.meta, BlockMeta):
      raise TypeError(f'meta must be a BlockMeta, got {type(self.meta).__name__}')
    # jax rebuilds pytrees with other leaves (shapes, placeholders): check arrays only.
    if not all(_is_array(a) for a in (self.k, self.v, self.positions)):
      return
    n = len(self.meta.token_ids)
    if tuple(self.k.shape) != tuple(self.v.shape):
      raise ValueError(f'k {self.k.shape} and v {self.v.shape} differ in shape')
    if len(self.k.shape) != 4 or self.k.shape[1] != n:
      raise ValueError(f'k must be [L, n={n}, K, H] for {n} token ids, got {self.k.shape}')
    if tuple(self.positions.shape) != (n,):
      raise ValueError(f'positions must be [{n}], got {self.positions.shape}')
    tail, r = self.meta.tail_layers, self.meta.tail_rows
    tail = tail if r else ()  # a page may keep no row of its tail layers: no tail arrays
    if (self.k_tail is None) != (self.v_tail is None) or (self.k_tail is None) != (not tail):
      raise ValueError(
        f'k_tail and v_tail must be given exactly for tail layers {list(tail)} of {r} rows (> 0)'
      )
    if tail and not all(_is_array(a) for a in (self.k_tail, self.v_tail)):
      return
    if tail and (
      tuple(self.k_tail.shape) != tuple(self.v_tail.shape)
      or len(self.k_tail.shape) != 4
      or tuple(self.k_tail.shape[:2]) != (len(tail), r)
    ):
      raise ValueError(
        f'k_tail, v_tail must be [{len(tail)}, r={r}, K, H] for tail layers {list(tail)},'
        f' got {self.k_tail.shape} and {self.v_tail.shape}'
      )

  @property
  def num_layers(self) -> int:
    """Cached layers the block covers (in layouts 2 and 3, packed rows count as one)."""
    return self.k.shape[0] + len(self.meta.tail_layers)

  @property
  def whole_layers(self) -> tuple[int, ...]:
    """The cached layers k and v hold, every row (all of them in layouts 2 and 3)."""
    return tuple(i for i in range(self.num_layers) if i not in self.meta.tail_layers)

  @property
  def layout(self) -> tuple[tuple[int, int], ...]:
    """(first_row, stop_row) of the span's rows held for each cached layer."""
    return self.meta.rows(self.num_layers)

  @property
  def span(self) -> Span:
    return Span(self.meta.start, self.meta.start + len(self))

  def __len__(self) -> int:
    return len(self.meta.token_ids)

  def arrays(self) -> dict[str, np.ndarray]:
    """The block's arrays as host numpy arrays, by name (k_tail, v_tail where it has them)."""
    out = {'k': np.asarray(self.k), 'v': np.asarray(self.v)}
    if self.k_tail is not None:
      out.update(k_tail=np.asarray(self.k_tail), v_tail=np.asarray(self.v_tail))
    return {**out, 'positions': np.asarray(self.positions, np.int32)}

  def nbytes(self) -> int:
    """Bytes of its arrays: k, v (and tails) and int32 positions."""
    size = lambda a: int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize
    kv = [self.k, self.v] + ([self.k_tail, self.v_tail] if self.k_tail is not None else [])
    return sum(map(size, kv)) + 4 * len(self)


def capture(
  cache: cache_lib.KVCache,
  span: Span,
  *,
  token_ids,
  target: target_lib.GraftTarget,
  chunk_size: int,
  batch_index: int = 0,
  keep: str = 'needed',
) -> KVBlock:
  """Copies the rows of slots `span` of row `batch_index` of `cache` that a continuation
  needs out of it as a block (layout 4, compact).

  keep='needed' (the default) keeps what a continuation right after the span
  attends to: every row of a global layer (in k, v), the last min(n, W - 1) rows
  of a sliding-window layer (in k_tail, v_tail; `target.windows` says which
  layers slide, and W: a query at p sees keys at p - W < q <= p). keep='span'
  keeps every row of every layer (sliding-window layers still in the tail
  arrays, of n rows), for a caller that continues from inside the block
  (`prefix`). A model whose target names no windows keeps every row whole.
  kv-sharing layers (Gemma 4) cache nothing, so a block holds nothing of them.
  Only the kept rows are read out of the cache (a ring's straight from the
  ring, in slot order): no other row is made, on the device or the host.

  The block records the cache's capacity and batch size, the span's
  attention segment and `chunk_size`: the tokens per forward call of the
  prefill that computed it (always, whatever the kernels). Where `target`
  can compute the first layer's values of tokens (`GraftTarget.first_values`:
  they depend on the token alone), `token_ids` are checked against the
  captured rows.

  Raises:
    GraftError: if the span is empty, unwritten, holds empty slots, mixes
      attention segments, or holds positions that are not consecutive; or
      the cache is not of `target`'s dtype; or its ring layers no longer
      hold the rows kept; or `chunk_size` is not a positive int; or `keep` is
      not one of `KEEP`; or the captured rows are not those of `token_ids`.
  """
  if keep not in KEEP:
    raise GraftError(f'keep must be one of {KEEP}, got {keep!r}')
  if not _is_int(chunk_size) or chunk_size <= 0:
    raise GraftError(
      f"chunk_size must be a positive int (the prefill's tokens per forward call), got"
      f' {chunk_size!r}'
    )
  if any(not isinstance(t, (int, np.integer)) or isinstance(t, bool) for t in token_ids):
    bad = next(t for t in token_ids if not isinstance(t, (int, np.integer)) or isinstance(t, bool))
    raise GraftError(f'token ids must be ints, got {bad!r}')
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
  if jnp.dtype(cache.dtype).name != target.dtype:
    raise GraftError(f'cache dtype {jnp.dtype(cache.dtype).name} != model dtype {target.dtype}')
  tail, rows = kept_rows(target, cache.num_layers, len(span), keep)
  _check_ring_holds(cache, span, tail, rows)
  positions = cache.positions[batch_index, span.start : span.stop]
  host_positions = np.asarray(positions)
  if np.any(host_positions < 0):
    raise GraftError(f'span [{span.start}, {span.stop}) holds empty slots')
  # A block's positions are first_position + i: its metadata then describes
  # them whole, and graft can check them. Prefill and decode write them so.
  if np.any(np.diff(host_positions) != 1):
    raise GraftError(
      f'span [{span.start}, {span.stop}) holds positions that are not consecutive'
      f' ({host_positions.tolist()}); capture each run of consecutive positions as its own block'
    )
  segments = np.unique(np.asarray(cache.segments[batch_index, span.start : span.stop]))
  if segments.size != 1:
    raise GraftError(
      f'span [{span.start}, {span.stop}) mixes attention segments {segments.tolist()};'
      ' capture each segment as its own block'
    )
  meta = BlockMeta(
    model_fingerprint=target.fingerprint,
    token_ids=token_ids,
    start=span.start,
    dtype=target.dtype,
    position_scheme=target.position_scheme,
    capacity=cache.capacity,
    batch_size=cache.batch_size,
    segment=int(segments[0]),
    first_position=int(host_positions[0]),
    chunk_size=chunk_size,
    tail_layers=tail,
    tail_rows=rows,
  )
  whole = tuple(i for i in range(cache.num_layers) if i not in tail)
  for group in (whole, tail):
    shapes = {cache.layer_shape(i) for i in group}
    if len(shapes) > 1:
      raise GraftError(
        f'layers {list(group)} cache rows of shapes {sorted(shapes)}: a block holds each group'
        " of layers (whole, tail) in one array; the model's target must name its windows"
      )
  k, v = cache_lib.layer_rows(cache, whole, span.start, span.stop, batch_index)
  tails = {}
  if tail:
    tails = dict(
      zip(
        ('k_tail', 'v_tail'),
        cache_lib.layer_rows(cache, tail, span.stop - rows, span.stop, batch_index),
      )
    )
  block = KVBlock(k=k, v=v, positions=positions, meta=meta, **tails)
  check_tokens(block, target)
  return block


def kept_rows(
  target: target_lib.GraftTarget, num_layers: int, n: int, keep: str = 'needed'
) -> tuple[tuple[int, ...], int]:
  """(tail layers, rows kept of each) of a block of n rows captured with `keep`: the
  sliding-window layers of `target.windows` and min(n, W - 1) (n for keep='span'); ((), 0)
  where the target names no windows or no layer slides."""
  windows = target.windows
  if not windows:
    return (), 0
  if len(windows) != num_layers:
    raise GraftError(f'the target names {len(windows)} windows for a cache of {num_layers} layers')
  tail = tuple(i for i, w in enumerate(windows) if w is not None)
  if not tail:
    return (), 0
  sizes = {windows[i] for i in tail}
  if len(sizes) > 1:
    raise GraftError(f'sliding-window layers of several windows {sorted(sizes)}: one W expected')
  (window,) = sizes
  return tail, n if keep == 'span' else max(1, min(n, window - 1))


# Largest relative difference (L2 over a row) between a captured first-layer value row and
# the one `GraftTarget.first_values` computes for its token: rounding (other chunk shapes,
# bfloat16) stays far below it (test_token_check_holds_for_bfloat16_and_every_chunk_schedule);
# another token's row differs by O(1).
TOKEN_TOLERANCE = 0.05


def check_tokens(block: KVBlock, target: target_lib.GraftTarget) -> None:
  """Raises GraftError unless the block's first-layer value rows are those of its token ids.

  A value row of the first layer depends on its token alone, so `target.first_values`
  recomputes it; rows a ring dropped (zeros, in blocks of layout 3) are skipped, and of a
  compact block whose first layer slides only its last `tail_rows` rows are held to check. Does nothing where the target
  cannot compute them (`first_values` None), or for a block spread over processes (each
  holds some kv heads only: `store.sharded`).
  """
  if target.first_values is None:
    return
  # [n, K * H] of layer 0: its own array (a compact block's tail holds its last rows), or the
  # first K * H of a packed row [1, n, 1, F].
  in_tail = 0 in block.meta.tail_layers
  source = block.v_tail if in_tail else block.v
  if isinstance(source, jax.Array) and not source.is_fully_addressable:
    return
  width = int(np.prod(np.shape(target.first_values(np.zeros(1, np.int32)))))
  first = len(block) - block.meta.tail_rows if in_tail else 0
  values = np.asarray(source[0], np.float32)
  captured = values.reshape(values.shape[0], -1)[:, :width]
  nonzero = np.flatnonzero(np.any(captured != 0, axis=1))
  if nonzero.size == 0:
    return
  kept = first + nonzero
  ids = np.asarray(block.meta.token_ids, np.int32)[kept]
  rows = captured[nonzero]
  expected = np.asarray(target.first_values(ids), np.float32).reshape(kept.size, width)
  scale = np.maximum(np.linalg.norm(expected, axis=1), np.finfo(np.float32).tiny)
  error = np.linalg.norm(rows - expected, axis=1) / scale
  if np.any(error > TOKEN_TOLERANCE):
    i = int(np.argmax(error > TOKEN_TOLERANCE))
    raise GraftError(
      f'slot {block.meta.start + int(kept[i])} holds the state of another token than token id'
      f' {int(ids[i])} (first-layer values differ by {error[i]:.3g} relative, more than'
      f' {TOKEN_TOLERANCE}): the token ids are not those the span was computed from'
    )


def _check_ring_holds(
  cache: cache_lib.KVCache, span: Span, tail: tuple[int, ...], rows: int
) -> None:
  """Raises GraftError unless the ring layers of `cache` (if any) still hold the rows of
  `span` the block keeps: its last `rows` of a tail layer, all of a layer kept whole."""
  if not cache.ring_layers:
    return
  whole = any(layer not in tail for layer in cache.ring_layers)
  needed = span.start if whole else span.stop - rows
  first = cache_lib.ring_first_slot(cache)
  if needed < first:
    raise GraftError(
      f'span [{span.start}, {span.stop}): the ring of {cache.ring_capacity} slots now holds'
      f' slots [{first}, {int(cache.length)}) of its sliding-window layers, but the block keeps'
      f' slots [{needed}, {span.stop}) (a continuation after the span sees its last W - 1 ='
      f' {cache.ring_window - 1}); capture it before writing further'
    )


def prefix(block: KVBlock, stop: int, *, target: target_lib.GraftTarget) -> KVBlock:
  """The block of `block`'s first `stop` tokens, compact: what a continuation from inside
  `block` (right after its token stop - 1) needs, cut out of it without the cache.

  A compact block captured with keep='needed' holds only the last min(n, W - 1) rows of
  its sliding-window layers: a continuation from inside it needs rows it dropped, so such a
  prefix is refused (only stop = n is served); a block captured with keep='span' holds every
  row and serves every prefix.

  Raises:
    GraftError: `stop` not in [1, n]; a block of layout 2 or 3, or of another model than
      `target`; or the block does not hold the rows of its sliding-window layers that a
      continuation after token stop - 1 sees.
  """
  meta, n = block.meta, len(block)
  if not _is_int(stop) or not 1 <= stop <= n:
    raise GraftError(f'a prefix of a block of {n} tokens ends in [1, {n}], got {stop!r}')
  if not meta.compact:
    raise GraftError(
      f'block of layout {meta.layout_version} (every row, zeros where a ring dropped them):'
      ' capture it again to cut a prefix'
    )
  if meta.model_fingerprint != target.fingerprint:
    raise GraftError('block was captured from another model than the target')
  tail, rows = kept_rows(target, block.num_layers, stop)
  if tail != meta.tail_layers:
    raise GraftError(f"block tail layers {list(meta.tail_layers)} != the model's {list(tail)}")
  held = n - meta.tail_rows  # the first row its tail layers hold
  if tail and stop - rows < held:
    raise GraftError(
      f'a continuation after token {stop - 1} of this compact block sees rows'
      f' [{stop - rows}, {stop}) of its sliding-window layers, and the block holds only'
      f' [{held}, {n}) (the last min(n, W - 1) rows a continuation after its end sees);'
      " continuing from inside a block needs every row: capture it with keep='span'"
    )
  tails = {}
  if tail:
    first = stop - rows - held
    tails = {name: getattr(block, name)[:, first : first + rows] for name in ('k_tail', 'v_tail')}
  cut = dataclasses.replace(meta, token_ids=meta.token_ids[:stop], tail_rows=rows)
  return block.replace(
    k=block.k[:, :stop], v=block.v[:, :stop], positions=block.positions[:stop], meta=cut, **tails
  )


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
  if first_position < 0:
    raise GraftError(f'cannot move a block to negative position {first_position}')
  delta = int(first_position) - int(np.asarray(block.positions)[0])
  meta = dataclasses.replace(block.meta, shift=block.meta.shift + delta)
  if not meta.compact:
    return KVBlock(
      k=model.relocate_keys(block.k, delta),
      v=block.v,
      positions=jnp.asarray(block.positions) + delta,
      meta=meta,
    )
  tails = {}
  if meta.tail_layers:
    tails = {
      'k_tail': model.relocate_keys(block.k_tail, delta, layers=meta.tail_layers),
      'v_tail': block.v_tail,
    }
  return block.replace(
    k=model.relocate_keys(block.k, delta, layers=block.whole_layers),
    positions=jnp.asarray(block.positions) + delta,
    meta=meta,
    **tails,
  )


def check_compatible(
  cache: cache_lib.KVCache,
  block: KVBlock,
  *,
  target: target_lib.GraftTarget,
) -> None:
  """Raises GraftError naming the first reason `block` cannot enter `cache`.

  Checks the block against the model (`target`: layout, position scheme,
  dtype, fingerprint), its arrays against the cache's rows (k and v alike:
  dtype and shape) and its positions against its metadata
  (first_position + shift + i, none empty).
  """
  meta = block.meta
  if meta.layout_version not in READ_LAYOUTS:
    raise GraftError(f'block layout version {meta.layout_version}, this code reads {READ_LAYOUTS}')
  if meta.position_scheme != target.position_scheme:
    raise GraftError(
      f'block position scheme {meta.position_scheme!r} != model {target.position_scheme!r}'
    )
  if meta.dtype != target.dtype:
    raise GraftError(f'block dtype {meta.dtype} != model dtype {target.dtype}')
  if meta.dtype != jnp.dtype(cache.dtype).name:
    raise GraftError(f'block dtype {meta.dtype} != cache dtype {jnp.dtype(cache.dtype).name}')
  if meta.model_fingerprint != target.fingerprint:
    raise GraftError(target_lib.describe_other_model(meta.model_fingerprint, target))
  n = len(block)
  if n == 0:
    raise GraftError('empty block: grafting it would do nothing')
  if meta.compact:
    _check_compact_shapes(cache, block)
    check_positions(block.positions, meta)
    return
  layers, kv_heads, head_dim = cache.row_shape()
  rows = (layers, n, kv_heads, head_dim)
  for name in ('k', 'v'):
    array = getattr(block, name)
    if jnp.dtype(array.dtype).name != meta.dtype:
      raise GraftError(f'block {name} is {array.dtype} but its metadata says {meta.dtype}')
    if tuple(array.shape) != rows:
      raise GraftError(
        f'block {name} is {tuple(array.shape)}, this cache takes'
        f' [{layers}, n={n}, {kv_heads}, {head_dim}]'
      )
  check_positions(block.positions, meta)


def _check_compact_shapes(cache: cache_lib.KVCache, block: KVBlock) -> None:
  """Raises GraftError unless a compact block's arrays are the rows of `cache`'s layers its
  metadata says: k, v [Lw, n, K, H] of the whole layers, k_tail, v_tail [Lt, r, Kt, Ht]."""
  meta = block.meta
  if block.num_layers != cache.num_layers or any(i >= cache.num_layers for i in meta.tail_layers):
    raise GraftError(
      f'block holds {block.num_layers} layers (tail layers {list(meta.tail_layers)}), this'
      f' cache {cache.num_layers}: this cache takes other rows'
    )
  groups = (
    ('k', 'v', block.whole_layers, len(block)),
    ('k_tail', 'v_tail', meta.tail_layers, meta.tail_rows),
  )
  for k_name, v_name, layers, rows in groups:
    if not layers or not rows:
      continue
    shapes = {cache.layer_shape(i) for i in layers}
    for name in (k_name, v_name):
      array = getattr(block, name)
      if jnp.dtype(array.dtype).name != meta.dtype:
        raise GraftError(f'block {name} is {array.dtype} but its metadata says {meta.dtype}')
      expected = {(len(layers), rows, *shape) for shape in shapes}
      if tuple(array.shape) not in expected:
        raise GraftError(
          f'block {name} is {tuple(array.shape)}, this cache takes'
          f' {sorted(expected)} for layers {list(layers)}'
        )


def check_positions(positions, meta: BlockMeta) -> None:
  """Raises GraftError unless `positions` [n] are what `meta` says: one per token id,
  first_position + shift + i, none empty. `graft` and the store's `put` both check it."""
  positions = np.asarray(positions)
  n = len(meta.token_ids)
  if positions.shape != (n,) or not np.issubdtype(positions.dtype, np.integer):
    raise GraftError(
      f'block positions are {positions.dtype}{list(positions.shape)}, not int[{n}]'
      f' for its {n} token ids'
    )
  if np.any(positions < 0):
    raise GraftError(f'block positions hold empty slots (-1): {_short(positions)}')
  first = meta.first_position + meta.shift
  expected = first + np.arange(n, dtype=np.int64)
  if not np.array_equal(positions.astype(np.int64), expected):
    if int(positions[0]) != first:
      raise GraftError(
        f'block positions start at {int(positions[0])}, but its metadata says'
        f' {meta.first_position} + shift {meta.shift} = {first}: positions moved without'
        ' `relocate` are refused'
      )
    raise GraftError(
      f'block positions {_short(positions)} are not consecutive from {first} as its metadata says'
    )


def _short(positions: np.ndarray) -> str:
  """Positions for a message: all of them up to 16, else the first and last few."""
  if positions.size <= 16:
    return str(positions.tolist())
  return f'[{", ".join(map(str, positions[:4].tolist()))}, ..., {int(positions[-1])}]'


def check_graft(
  cache: cache_lib.KVCache,
  block: KVBlock,
  *,
  target: target_lib.GraftTarget,
  allow_shifted: bool = False,
  allow_other_shape: bool = False,
  allow_ring_gap: bool = False,
  chunk_size: int | None = None,
  query_position: int | None = None,
) -> None:
  """Raises GraftError naming the first reason `graft` would refuse `block` (see there)."""
  check_compatible(cache, block, target=target)
  meta = block.meta
  if meta.compact and target.windows:
    check_page(block, block.layout, target.windows, query_position=query_position)
  if meta.shift and not allow_shifted:
    raise GraftError(
      f'block was moved by {meta.shift} positions; pass'
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
  gap = not allow_ring_gap and cache_lib.gap_error(cache, span.start)
  if gap:
    raise GraftError(f'block slots [{span.start}, {span.stop}): {gap}')
  computed = (meta.batch_size, meta.capacity)
  here = (cache.batch_size, cache.capacity)
  if computed != here and not (target.chunk_invariant or allow_other_shape):
    kernels = ', '.join(f'{op}={impl}' for op, impl in target.kernels)
    raise GraftError(
      f'block was computed in a cache of batch {computed[0]} x capacity {computed[1]}; this cache'
      f' is batch {here[0]} x capacity {here[1]}. Under kernels that are not chunk-invariant'
      f' ({kernels}) attention and matmul bits depend on those shapes, so the continuation'
      f' would not be byte-exact (measured: max |Δlogit| {_OTHER_SHAPE_DELTA} on gemma-3-270m).'
      ' Pass allow_other_shape=True to graft it anyway.'
    )
  _check_chunk_size(block, chunk_size, target=target, allow_other_shape=allow_other_shape)


def _check_chunk_size(
  block: KVBlock, chunk_size: int | None, *, target: target_lib.GraftTarget, allow_other_shape: bool
) -> None:
  """Refuses, under kernels that are not chunk-invariant, a block unless `chunk_size` (the
  prefill chunk size in force: this cache's) is given and is the one the block records.

  A block that records none (layout 2, stored before blocks recorded it) cannot be
  checked, so it is refused there too. `allow_other_shape` grafts it anyway.
  """
  if chunk_size is not None and (not _is_int(chunk_size) or chunk_size <= 0):
    raise GraftError(f'chunk_size must be a positive int or None, got {chunk_size!r}')
  recorded = block.meta.chunk_size
  if target.chunk_invariant or allow_other_shape or chunk_size == recorded:
    return
  kernels = ', '.join(f'{op}={impl}' for op, impl in target.kernels)
  why = (
    f' Under kernels that are not chunk-invariant ({kernels}) attention and matmul bits depend'
    ' on the chunk, so the continuation would be byte-exact only after a prefill in the'
    ' same chunks. Pass allow_other_shape=True to graft it anyway.'
  )
  if not recorded:
    raise GraftError(
      f'block records no prefill chunk size (layout {block.meta.layout_version}, stored before'
      ' blocks recorded it): whether it is exact here cannot be checked.' + why
    )
  if chunk_size is None:
    raise GraftError(
      f'block was computed with prefill chunks of {recorded} tokens, and no chunk size in force'
      ' was given: pass chunk_size (the chunk size this cache is prefilled with).' + why
    )
  raise GraftError(
    f'block was computed with prefill chunks of {recorded} tokens; this cache is prefilled'
    f' with chunks of {chunk_size}.' + why
  )


class PageError(GraftError):
  """A page does not fit the model's attention layout, or not the query asked."""


def page_exact_from(
  block: KVBlock, layout: Sequence[tuple[int, int]] | None, windows: Sequence[int | None]
) -> int:
  """The smallest query position at which `block` cut to `layout` attends as the whole
  block does: the position e just after its last token, later by the rows its local
  layers keep fewer than W - 1 (`windows`: W per layer, None for a global layer)."""
  meta = block.meta
  end = meta.first_position + meta.shift + len(block)
  if layout is None or not max(first for first, _ in layout):
    return end
  needed = max((w - 1 for w in windows if w is not None), default=0)
  kept = len(block) - max(first for first, _ in layout)
  return end + max(0, needed - kept)


def check_page(
  block: KVBlock,
  layout: Sequence[tuple[int, int]] | None,
  windows: Sequence[int | None],
  *,
  query_position: int | None,
) -> None:
  """Raises PageError unless `block` cut to `layout` is exact for a model whose layers
  have `windows` (W per layer, None for a global layer) and a query at `query_position`.

  Every global layer must be whole; the trimmed layers must be local; and with
  fewer than W - 1 local rows, `query_position` must be given and at least
  `page_exact_from`. A plain block (`layout` None) passes. `paging.pages.install`
  and `restore.install` both check a page with this.
  """
  layers = block.num_layers
  if layers != len(windows):
    raise PageError(f'block has {layers} layers, the model {len(windows)}')
  if layout is None:
    return
  n = len(block)
  if len(layout) != len(windows):
    raise PageError(f'page layout has {len(layout)} layers, the model {len(windows)}')
  for layer, (first, stop) in enumerate(layout):
    if stop != n or first < 0:
      raise PageError(f'page layer {layer} keeps rows [{first}, {stop}) of {n}: not a tail')
    if first and windows[layer] is None:
      raise PageError(
        f'page drops rows [0, {first}) of global layer {layer}: a later query sees them'
      )
  needed = page_exact_from(block, layout, windows)
  if needed > block.meta.first_position + block.meta.shift + n:
    kept = n - max(first for first, _ in layout)
    rows = max(w - 1 for w in windows if w is not None)
    if query_position is None:
      raise PageError(
        f'page keeps {kept} local rows, fewer than W - 1 = {rows}:'
        f' exact only for queries at position >= {needed}; pass query_position'
      )
    if query_position < needed:
      raise PageError(
        f'page keeps {kept} local rows: a query at position {query_position} sees rows'
        f' it dropped (exact from position {needed})'
      )


def install_bucket(n: int, *, start: int, capacity: int) -> int:
  """Rows an install of a block of n rows at slot `start` writes: n rounded up to a multiple
  of INSTALL_BUCKET, within the capacity (so blocks of any length share a few programs)."""
  return max(n, min(-(-n // INSTALL_BUCKET) * INSTALL_BUCKET, capacity - start))


def graft(
  cache: cache_lib.KVCache,
  block: KVBlock,
  *,
  target: target_lib.GraftTarget,
  allow_shifted: bool = False,
  allow_other_shape: bool = False,
  allow_ring_gap: bool = False,
  chunk_size: int | None = None,
  query_position: int | None = None,
  donate: bool = False,
) -> cache_lib.KVCache:
  """Installs `block` at its own slots, positions and segment in every batch row.

  A compact block (layout 4) writes its whole layers' rows at its slots, its
  tail layers' last rows at the last slots (the slots before them keep what
  they hold: no query after the block sees them), into either local layout.
  One whose tail keeps fewer than min(n, W - 1) rows (a page) is exact only
  for queries from `page_exact_from` on: it is refused unless
  `query_position` (the first query's) is at least that (`check_page`).

  With `donate=True` the input cache's buffers are reused for the result
  (the block is written in place, as `Gemma.forward` does with its cache);
  the input cache must not be used afterwards. The default leaves it intact.

  A block moved to other positions (`meta.shift != 0`, see `relocate`) is
  refused unless `allow_shifted` is set. A block computed in a cache of
  another capacity or batch size is refused unless `target.chunk_invariant`
  (its kernels give the same bits whatever the shapes) or `allow_other_shape`
  is set: otherwise the continuation is not byte-exact. Under such kernels
  `chunk_size`, the prefill chunk size in force (this cache's), must be given
  and be the one the block records (a block that records none is refused);
  `allow_other_shape` waives that too. A block holding a NaN or an infinity
  in k or v is refused, as the store's `put` refuses one.

  The block's slots must lie at or after the cache's write index (nothing
  already there is overwritten) and inside its capacity. Slots between the
  old write index and the block stay empty (position -1, masked out). A ring
  cache leaves such a gap only before its first write (`cache.gap_error`),
  unless `allow_ring_gap`: the caller has checked that no later query sees a
  row the gap drops (`compose.check_ring_window`).

  Returns:
    A new cache whose `length` is the block's stop slot.
  Raises:
    GraftError: before any state is built, if the block does not fit.
  """
  check_graft(
    cache,
    block,
    target=target,
    allow_shifted=allow_shifted,
    allow_other_shape=allow_other_shape,
    allow_ring_gap=allow_ring_gap,
    chunk_size=chunk_size,
    query_position=query_position,
  )
  if block.meta.compact:
    return _graft_compact(cache, block, donate=donate)
  n, start = len(block), block.meta.start
  extra = install_bucket(n, start=start, capacity=cache.capacity) - n
  rows = functools.partial(_pad_rows, extra=extra)
  positions = np.pad(
    np.asarray(block.positions, np.int32), (0, extra), constant_values=cache_lib.EMPTY_POSITION
  )
  k, v = jnp.asarray(rows(block.k)), jnp.asarray(rows(block.v))
  if not bool(_all_finite(k, v)):  # one reduction where the rows already are
    raise GraftError(f'{_first_nonfinite(block)}: a block holds finite keys and values only' + _NAN)
  return install_rows(
    cache,
    k,
    v,
    jnp.asarray(positions),
    segment=block.meta.segment,
    start=start,
    n=n,
    donate=donate,
  )


_NAN = ' (a NaN or infinity in any row turns every logit that attends to the block NaN)'


def _graft_compact(cache: cache_lib.KVCache, block: KVBlock, *, donate: bool) -> cache_lib.KVCache:
  """Writes a checked compact block into `cache` (`install_compact`), its rows padded to
  `install_bucket`s (its whole rows at its start, its tail at its last slots)."""
  meta = block.meta
  n, start, r = len(block), meta.start, meta.tail_rows
  extra = install_bucket(n, start=start, capacity=cache.capacity) - n
  positions = np.pad(
    np.asarray(block.positions, np.int32), (0, extra), constant_values=cache_lib.EMPTY_POSITION
  )
  k, v = (jnp.asarray(_pad_rows(a, extra=extra)) for a in (block.k, block.v))
  tails = ()
  if block.k_tail is not None:
    tail_extra = install_bucket(r, start=start + n - r, capacity=cache.capacity) - r
    tails = tuple(jnp.asarray(_pad_rows(a, extra=tail_extra)) for a in (block.k_tail, block.v_tail))
  if not bool(_all_finite(k, v, *tails)):
    raise GraftError(f'{_first_nonfinite(block)}: a block holds finite keys and values only' + _NAN)
  k_tail, v_tail = tails or (None, None)
  return install_compact(
    cache,
    k,
    v,
    k_tail,
    v_tail,
    jnp.asarray(positions),
    meta=meta,
    layers=block.num_layers,
    donate=donate,
  )


def install_compact(
  cache: cache_lib.KVCache,
  k,
  v,
  k_tail,
  v_tail,
  positions,
  *,
  meta: BlockMeta,
  layers: int,
  donate: bool,
) -> cache_lib.KVCache:
  """Writes a compact block's rows, unchecked (call `check_graft` first): the first n of k, v
  [Lw, m, K, H] (the whole layers) and positions [m] (and the segment) at slots
  [start, start + n), the first r of k_tail, v_tail [Lt, mt, Kt, Ht] at slots
  [start + n - r, start + n) of the tail layers (`meta` says n, r, start, the layers; None
  without tail layers or rows: their slots keep what they hold). Each of k, v, k_tail, v_tail may be a sequence of parts, layers in
  order."""
  parts = lambda a: tuple(a) if isinstance(a, (tuple, list)) else (a,)
  n, r = len(meta.token_ids), meta.tail_rows
  whole = tuple(i for i in range(layers) if i not in meta.tail_layers)
  write = _install_compact_donating if donate else _install_compact
  tails = (parts(k_tail), parts(v_tail)) if k_tail is not None else ((), ())
  return write(
    cache,
    parts(k),
    parts(v),
    *tails,
    positions,
    np.int32(meta.segment),
    np.int32(meta.start),
    np.int32(n),
    np.int32(r),
    whole=whole,
    tail=meta.tail_layers if k_tail is not None else (),
  )


def _install_compact_rows(
  cache, k, v, k_tail, v_tail, positions, segment, start, n, r, *, whole, tail
):
  cache = cache_lib.write_span(cache, positions, segment, start, n)
  join = lambda parts: jnp.concatenate(parts, axis=0)
  if whole:
    cache = cache_lib.write_layer_rows(cache, join(k), join(v), whole, start, n)
  if tail:
    cache = cache_lib.write_layer_rows(cache, join(k_tail), join(v_tail), tail, start + n - r, r)
  return cache


_install_compact = jax.jit(_install_compact_rows, static_argnames=('whole', 'tail'))
_install_compact_donating = jax.jit(
  _install_compact_rows, static_argnames=('whole', 'tail'), donate_argnums=0
)


@jax.jit
def _all_finite(*arrays) -> jax.Array:
  return functools.reduce(jnp.logical_and, [jnp.isfinite(a).all() for a in arrays])


def _first_nonfinite(block: KVBlock) -> str:
  """'block k[l, i, h, d] is value' for the first NaN or infinity of a block that holds one
  (in k, else in v)."""
  arrays = block.arrays()
  name = next(
    name
    for name in ('k', 'v', 'k_tail', 'v_tail')
    if name in arrays and not np.isfinite(arrays[name]).all()
  )
  array = arrays[name]
  where = np.unravel_index(int(np.argmax(~np.isfinite(array))), array.shape)
  return f'block {name}[{", ".join(map(str, where))}] is {array[where]}'


def install_rows(
  cache: cache_lib.KVCache, k, v, positions, *, segment: int, start: int, n: int, donate: bool
) -> cache_lib.KVCache:
  """Writes the first n of k, v [L, m, K, H] and positions [m] at slots [start, start+n) of
  every row (m = `install_bucket(n, ...)`), unchecked: call `check_graft` first. k and v may
  each be given as a sequence of parts [L_i, m, K, H], its layers in order."""
  k, v = (tuple(a) if isinstance(a, (tuple, list)) else (a,) for a in (k, v))
  write = _install_donating if donate else _install
  # numpy scalars: passed to the jit as they are, no eager ops
  return write(cache, k, v, positions, np.int32(segment), np.int32(start), np.int32(n))


def _pad_rows(a, *, extra: int):
  """[L, n, K, H] -> [L, n + extra, K, H], zeros after; on the device for a jax array
  (no round trip through the host), on the host for a numpy one."""
  pad = [(0, 0), (0, extra), (0, 0), (0, 0)]
  return jnp.pad(a, pad) if isinstance(a, jax.Array) else np.pad(np.asarray(a), pad)


def _install_rows(
  cache: cache_lib.KVCache, k, v, positions, segment, start, n
) -> cache_lib.KVCache:
  """Writes the first n of k, v (tuples of parts [L_i, m, K, H], layers in order) and
  positions [m] (and `segment`) at slots [start, start+n) of every row; slots
  [start+n, start+m) keep what they hold (`cache.write_rows`, ring layers included)."""
  k, v = (jnp.concatenate(parts, axis=0) for parts in (k, v))
  return cache_lib.write_rows(cache, k, v, positions, segment, start, n)


_install = jax.jit(_install_rows)
_install_donating = jax.jit(_install_rows, donate_argnums=0)
