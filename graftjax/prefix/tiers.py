"""Tiers of span storage, fastest first: device memory, host memory, local disk, the store.

Each tier has a byte budget (None: unbounded) and keeps its spans in LRU order. A span
in use is pinned (`Tiers.pinned`) and never evicted; a span evicted from a tier moves to
the next slower one that lacks it (the last tier, the shared store, deletes it and says
so in the span log). A span enters or leaves a tier whole, under the tier's lock, so no
reader ever sees part of one. A span is named `<chained key>/<content key>` (`name`).
"""

from __future__ import annotations

import collections
import contextlib
import threading

from graftjax.prefix import spans


def name(chain: str, content: str) -> str:
  """A span's name in the tiers: its chained key and its block's content key."""
  return f'{chain}/{content}'


class MemoryTier:
  """Spans held in memory: on the device (`device=True`) or as host numpy arrays."""

  def __init__(self, name: str, budget: int | None, *, device: bool):
    self.name, self.budget, self.device = name, budget, device
    self._spans: collections.OrderedDict[str, spans.Block] = collections.OrderedDict()
    self.used = 0

  def __contains__(self, key: str) -> bool:
    return key in self._spans

  def keys(self) -> list[str]:
    return list(self._spans)

  def get(self, key: str) -> spans.Block | None:
    block = self._spans.get(key)
    if block is not None:
      self._spans.move_to_end(key)
    return block

  def put(self, key: str, block: spans.Block) -> None:
    if key in self._spans:
      return
    block = spans.to_device(block) if self.device else spans.to_host(block)
    self._spans[key] = block
    self.used += spans.nbytes(block)

  def drop(self, key: str) -> None:
    block = self._spans.pop(key, None)
    if block is not None:
      self.used -= spans.nbytes(block)


class StoreTier:
  """Spans in a `BlockStore` (a local disk's, or the shared one; `spans.SpanStore`): LRU order
  and bytes are this process's view (spans it put or read)."""

  def __init__(self, name: str, store, budget: int | None):
    self.name, self.store, self.budget = name, spans.SpanStore(store), budget
    self._sizes: collections.OrderedDict[str, int] = collections.OrderedDict()
    self.used = 0

  def __contains__(self, key: str) -> bool:
    return key in self._sizes or tuple(key.split('/')) in self.store

  def keys(self) -> list[str]:
    return list(self._sizes)

  def get(self, key: str) -> spans.Block | None:
    """The span, every byte checked; None if the store lacks it. Raises StoreError if it is
    there but does not verify."""
    try:
      block = self.store.get(*key.split('/'))
    except spans.MissingError:
      self._forget(key)
      return None
    self._note(key, spans.nbytes(block))
    return block

  def put(self, key: str, block: spans.Block) -> None:
    chain, content = key.split('/')
    stored = self.store.put(chain, block)
    if stored != content:
      raise ValueError(f'span stored as {stored[:12]}…, expected {key[:12]}…')
    self._note(key, spans.nbytes(block))

  def drop(self, key: str) -> None:
    self.store.delete(*key.split('/'))
    self._forget(key)

  def _note(self, key: str, size: int) -> None:
    if key not in self._sizes:
      self.used += size
    self._sizes[key] = size
    self._sizes.move_to_end(key)

  def _forget(self, key: str) -> None:
    self.used -= self._sizes.pop(key, 0)


class Tiers:
  """Tiers fastest first; the last is where spans are shared (the store).

  Attributes:
    tiers: the tiers.
    read_bytes: bytes read from each tier, by name.
    evicted: spans evicted from each tier, by name.
  """

  def __init__(self, tiers, *, on_drop_last=None):
    self.tiers = list(tiers)
    self._pins: collections.Counter[str] = collections.Counter()
    self._lock = threading.RLock()
    self._on_drop_last = on_drop_last  # called with a key the last tier deleted
    self.read_bytes = {t.name: 0 for t in self.tiers}
    self.evicted = {t.name: 0 for t in self.tiers}

  @contextlib.contextmanager
  def pinned(self, keys):
    """Pins `keys` while the block runs: none of them is evicted from any tier."""
    keys = list(keys)
    with self._lock:
      self._pins.update(keys)
    try:
      yield
    finally:
      with self._lock:
        self._pins.subtract(keys)
        self._pins += collections.Counter()  # drop counts at zero
        for tier in self.tiers:
          self._fit(tier)

  def get(self, key: str) -> tuple[spans.Block | None, str | None]:
    """(span, name of the tier it was read from), promoted into the faster tiers; (None,
    None) if no tier holds it. Raises StoreError for a stored span that does not verify."""
    with self._lock:
      for i, tier in enumerate(self.tiers):
        block = tier.get(key)
        if block is None:
          continue
        self.read_bytes[tier.name] += spans.nbytes(block)
        for faster in reversed(self.tiers[:i]):
          self._admit(faster, key, block)
        return block, tier.name
      return None, None

  def put(self, key: str, block: spans.Block) -> bool:
    """Stores the span in the last tier (where it is shared), then the fastest that takes
    it; returns False if no tier's budget takes it (nothing is stored then)."""
    with self._lock:
      last = self.tiers[-1]
      if not self._fits(last, spans.nbytes(block)):
        return False
      last.put(key, block)
      self._fit(last, keep=key)
      if key not in last:
        return False
      for tier in self.tiers[:-1]:
        if self._admit(tier, key, block):
          break
      return True

  def _fits(self, tier, size: int) -> bool:
    return tier.budget is None or size <= tier.budget

  def _admit(self, tier, key: str, block: spans.Block) -> bool:
    if key in tier:
      tier.get(key)  # most recent
      return True
    if not self._fits(tier, spans.nbytes(block)):
      return False
    tier.put(key, block)
    self._fit(tier, keep=key)
    return key in tier

  def _fit(self, tier, keep: str | None = None) -> None:
    """Evicts the least recently used unpinned spans of `tier` until it is within budget
    (`keep` last of all); each moves to the next slower tier that lacks it."""
    if tier.budget is None:
      return
    for key in tier.keys():
      if tier.used <= tier.budget:
        return
      if key == keep or self._pins[key]:
        continue
      self._evict(tier, key)
    if tier.used > tier.budget and keep is not None and not self._pins[keep]:
      self._evict(tier, keep)

  def _evict(self, tier, key: str) -> None:
    i = self.tiers.index(tier)
    slower = self.tiers[i + 1 :]
    if slower and not any(key in t for t in slower):
      block = tier.get(key)
      for t in slower:
        if self._admit(t, key, block):
          break
    tier.drop(key)
    self.evicted[tier.name] += 1
    if not slower and self._on_drop_last is not None:
      self._on_drop_last(key)
