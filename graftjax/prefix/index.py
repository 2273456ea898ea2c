"""The prefix index: stored spans by chained key, and the longest stored prefix of a prompt.

Lookup walks a prompt's spans from token 0: a span whose chained key is stored is
taken whole; where none is, the stored children of the prefix so far are compared
with the prompt token by token and the longest common run is taken (a hit that ends
inside a stored span uses that span's leading rows). A hit is a list of steps
(span, rows used) covering tokens [0, length).
"""

from __future__ import annotations

import dataclasses

from graftjax.prefix import keys


@dataclasses.dataclass
class Entry:
  """A stored span.

  Attributes:
    key: its chained key.
    parent: the key of the prefix before it (`keys.ROOT` for span 0).
    start: its first token's position (a multiple of the span size).
    token_ids: its tokens.
    blocks: content keys of blocks holding it (`BlockStore` keys; several when caches of
      other shapes computed it under chunk-invariant kernels).
  """

  key: str
  parent: str
  start: int
  token_ids: tuple[int, ...]
  blocks: list[str]

  def record(self, block: str, domain: str) -> dict:
    """The log record saying this span of `domain` is stored as `block`."""
    return {
      'op': 'put',
      'domain': domain,
      'key': self.key,
      'parent': self.parent,
      'start': self.start,
      'token_ids': list(self.token_ids),
      'block': block,
    }


@dataclasses.dataclass(frozen=True)
class Step:
  """Rows [entry.start, entry.start + rows) of a hit come from `entry`."""

  entry: Entry
  rows: int


class PrefixIndex:
  """Spans of one domain (`keys.Domain.digest`) cut every `span` tokens."""

  def __init__(self, domain_digest: str, span: int):
    if span <= 0:
      raise ValueError(f'span must be positive, got {span}')
    self.domain = domain_digest
    self.span = span
    self.entries: dict[str, Entry] = {}
    self._children: dict[str, dict[str, Entry]] = {}
    self.foreign = 0  # records of other domains seen (another model, other kernels)

  def __len__(self) -> int:
    return len(self.entries)

  def key(self, parent: str, token_ids) -> str:
    return keys.span_key(self.domain, parent, token_ids)

  def take(self, record: dict) -> None:
    """Applies one log record ('put' or 'delete'); records of other domains are counted."""
    if record.get('domain') != self.domain:
      self.foreign += 1
      return
    if record.get('op') == 'delete':
      self.remove(record['key'], record.get('block'))
      return
    tokens = tuple(int(t) for t in record['token_ids'])
    if self.key(record['parent'], tokens) != record['key'] or record['start'] % self.span:
      return  # not a span of this index's cut: never trusted
    self.add(
      Entry(record['key'], record['parent'], int(record['start']), tokens, []), record['block']
    )

  def add(self, entry: Entry, block: str) -> Entry:
    held = self.entries.setdefault(entry.key, entry)
    if block not in held.blocks:
      held.blocks.append(block)
    self._children.setdefault(held.parent, {})[held.key] = held
    return held

  def remove(self, key: str, block: str | None = None) -> None:
    """Forgets `block` of the span `key` (every block if None), and the span with its last."""
    entry = self.entries.get(key)
    if entry is None:
      return
    entry.blocks[:] = [b for b in entry.blocks if block is not None and b != block]
    if not entry.blocks:
      del self.entries[key]
      self._children.get(entry.parent, {}).pop(key, None)

  def lookup(self, token_ids, limit: int) -> list[Step]:
    """Steps of the longest stored prefix of `token_ids` [:limit]."""
    ids = tuple(int(t) for t in token_ids[:limit])
    steps, parent, pos = [], keys.ROOT, 0
    while pos < len(ids):
      whole = ids[pos : pos + self.span]
      entry = self.entries.get(self.key(parent, whole)) if len(whole) == self.span else None
      if entry is None:
        entry, rows = self._longest_child(parent, whole)
        if entry is None:
          break
        steps.append(Step(entry, rows))
        if rows < self.span:
          break
      else:
        steps.append(Step(entry, self.span))
      parent, pos = entry.key, pos + self.span
    return steps

  def _longest_child(self, parent: str, tokens: tuple[int, ...]) -> tuple[Entry | None, int]:
    """The stored child of `parent` sharing the longest leading run with `tokens` (ties:
    the longer span, then the smaller key), and that run's length."""
    best, best_rows = None, 0
    for entry in sorted(self._children.get(parent, {}).values(), key=lambda e: e.key):
      rows = _common(entry.token_ids, tokens)
      if rows > best_rows or (
        rows == best_rows and best and len(entry.token_ids) > len(best.token_ids)
      ):
        best, best_rows = entry, rows
    return (best, best_rows) if best_rows else (None, 0)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
  n = min(len(a), len(b))
  for i in range(n):
    if a[i] != b[i]:
      return i
  return n
