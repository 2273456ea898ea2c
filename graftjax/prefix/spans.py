"""Every use of the block API by prefix reuse, in one place.

A stored span is a `blocks.KVBlock` of one prompt's slots [start, stop), captured
from a cache prefilled from position 0 at its own slots. This module captures one,
cuts it to its leading rows, checks a fetched one against the prompt, grafts it,
and moves it between the store, host memory and the device. Whether a span keeps
every row of its sliding-window layers (so a continuation may start at any token
inside it) is `keeps_every_row`.
"""

from __future__ import annotations

import os

import jax

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.prefix import errors

Block = blocks.KVBlock
StoreError = store_lib.StoreError
MissingError = store_lib.MissingBlockError


def content_key(block: Block) -> str:
  """The key the store keeps `block` under (`store.key_for`)."""
  return store_lib.key_for(block.meta)


def capture(cache, start: int, token_ids, *, target, chunk_size: int) -> Block:
  """Slots [start, start + len(token_ids)) of batch row 0 of `cache` as a span.

  A span keeps every row of every cached layer (`keep='span'`), so a continuation may
  start after any of its tokens (`leading`); for spans of at most W - 1 tokens that is
  the compact form itself.
  """
  span = blocks.Span(int(start), int(start) + len(token_ids))
  return blocks.capture(
    cache, span, token_ids=token_ids, target=target, chunk_size=chunk_size, keep='span'
  )


def leading(block: Block, m: int, *, target) -> Block:
  """The span's first m rows (0 < m <= len(block)): a block of its first m tokens."""
  if not 0 < m <= len(block):
    raise ValueError(f'leading rows {m} of a span of {len(block)}')
  if m == len(block):
    return block
  return blocks.prefix(block, m, target=target)


def keeps_every_row(model, n: int) -> bool:
  """Whether a span of n tokens captured from `model`'s cache holds every row of its
  sliding-window layers, so its leading m rows continue exactly at any m.

  A cache whose sliding layers keep a ring ('ring' layout) captures only the rows a
  continuation after the span's last token sees: its last W - 1 (`blocks.capture`); a
  continuation from inside the span would need older ones once n > W - 1.
  """
  window = model.config.sliding_window
  ring = getattr(model, 'ring_layers', ())
  return model.local_cache == 'full' or not ring or not window or n <= window - 1


def check(block: Block, token_ids, *, start: int, target) -> None:
  """Raises SpanMismatchError unless `block` holds `token_ids` at its own slots and
  positions from `start`, computed by `target`'s model (fingerprint, scheme, dtype)."""
  meta = block.meta
  want = tuple(int(t) for t in token_ids)
  if meta.token_ids[: len(want)] != want or len(meta.token_ids) < len(want):
    raise errors.SpanMismatchError(f'span at {start} holds other tokens than the prompt')
  if meta.model_fingerprint != target.fingerprint:
    raise errors.SpanMismatchError(
      f'span at {start} was computed by another model'
      f' ({meta.model_fingerprint[:12]}… != {target.fingerprint[:12]}…)'
    )
  if (meta.dtype, meta.position_scheme) != (target.dtype, target.position_scheme):
    raise errors.SpanMismatchError(
      f'span at {start} is {meta.dtype}/{meta.position_scheme}, the model'
      f' {target.dtype}/{target.position_scheme}'
    )
  if meta.start != start or meta.first_position != start or meta.shift:
    raise errors.SpanMismatchError(
      f'span at {start} sits at slot {meta.start}, position {meta.first_position}'
      f' + shift {meta.shift}: not its own position'
    )
  try:
    blocks.check_positions(block.positions, meta)
  except blocks.GraftError as e:
    raise errors.SpanMismatchError(f'span at {start}: {e}') from e


def graft(cache, block: Block, *, target, chunk_size: int):
  """`cache` with `block` installed at its own slots (`blocks.graft`)."""
  return blocks.graft(cache, block, target=target, chunk_size=chunk_size)


def nbytes(block: Block) -> int:
  """Bytes of the span's arrays (k, v, their tails, positions)."""
  return block.nbytes()


def to_device(block: Block, device=None) -> Block:
  """The span with its arrays on `device` (default: the first)."""
  device = device or jax.devices()[0]
  return block.replace(**{name: jax.device_put(a, device) for name, a in block.arrays().items()})


def to_host(block: Block) -> Block:
  """The span with its arrays as host numpy arrays."""
  return block.replace(**block.arrays())


class SpanStore:
  """Spans in a `BlockStore`, each under its chained key.

  A block's content key (`store.key_for`) names its tokens and slots, not the prefix
  before them: two prompts that differ early and agree later give spans of the same
  tokens at the same slots with other rows. So each span lives in a store of its own
  chained key, `.prefix/spans/<key>/` under the store's root (the span log beside it in
  `.prefix/log/`), and is named there by its content key.
  """

  def __init__(self, store: store_lib.BlockStore):
    self.store = store
    self._opened: dict[str, store_lib.BlockStore] = {}

  def _at(self, chain: str) -> store_lib.BlockStore:
    found = self._opened.get(chain)
    if found is None:
      if self.store._local is not None:
        root = os.path.join(self.store._local, '.prefix', 'spans', chain)
      else:
        root = self.store._kv / f'.prefix/spans/{chain}/'
      found = self._opened[chain] = store_lib.BlockStore(root, read_only=self.store.read_only)
    return found

  def put(self, chain: str, block: Block) -> str:
    """Stores the span (a no-op if stored with the same bytes); returns its content key."""
    return self._at(chain).put(block)

  def get(self, chain: str, content: str) -> Block:
    """The span, every byte checked (`BlockStore.get`)."""
    return self._at(chain).get(content)

  def delete(self, chain: str, content: str) -> None:
    """Removes the span; one already gone is not an error."""
    try:
      self._at(chain).delete(content)
    except store_lib.MissingBlockError:
      pass

  def __contains__(self, name: tuple[str, str]) -> bool:
    chain, content = name
    return content in self._at(chain)

  def list(self, chain: str) -> list[str]:
    return self._at(chain).list()


def log_kvstore(store: store_lib.BlockStore):
  """The kvstore under the store's root that holds the span log (`.prefix/log/`)."""
  return store._kv / '.prefix/log/'
