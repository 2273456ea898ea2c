"""The span log: an append-only sequence of committed spans under the store.

Entry i is the object `<20-digit i>` under `.prefix/log/` of the store's kvstore,
one JSON record, written only if absent (tensorstore's `if_equal` with the "no
value" generation: S3's `If-None-Match: *`, GCS's `ifGenerationMatch=0`, on `file`
a locked compare). A writer appends after the last entry it has seen: it tries
the next number and, if another writer took it, reads that entry and tries the
one after. So entries are numbered without gaps, an entry is never rewritten, and
a reader learns of new spans by reading the entries after the last it saw: O(new)
reads, never a listing (a listing may omit keys; its silence is no evidence).

A record is appended only after its block's `put` returned, so every 'put' record
names a committed block; a 'delete' record says a span was evicted from the store.
"""

from __future__ import annotations

import json

from graftjax.prefix import errors
from graftjax.store import kvstore as store_kvstore

DIGITS = 20


def entry_name(seq: int) -> str:
  return f'{seq:0{DIGITS}d}'


class SpanLog:
  """Readers and appenders of the log in `kv` (`spans.log_kvstore(store)`).

  Attributes:
    seen: entries read so far (the next entry to read is number `seen`).
  """

  def __init__(self, kv):
    self._kv = kv
    self.seen = 0
    self.reads = 0  # kvstore reads made, for the O(new) claim

  def read_new(self) -> list[dict]:
    """Records of the entries after the last one read, in order."""
    out = []
    while True:
      record = self._read(self.seen)
      if record is None:
        return out
      out.append(record)
      self.seen += 1

  def append(self, record: dict) -> tuple[int, list[dict]]:
    """Appends `record`; returns (its entry number, the other writers' records read on
    the way, in order: the caller's index should take them too)."""
    data = json.dumps(record, sort_keys=True).encode()
    others = []
    while True:
      others += self.read_new()
      name = entry_name(self.seen)
      try:
        absent = store_kvstore.result(self._kv.read(name))
        self.reads += 1
        if absent.state == 'value':
          continue  # taken since read_new: read it next time round
        stamp = store_kvstore.result(
          self._kv.write(name, data, if_equal=absent.stamp.generation), writing=True
        )
        if not stamp.generation:  # lost the race, unless a retried write found its own
          found = store_kvstore.result(self._kv.read(name))
          if not (found.state == 'value' and found.value == data):
            continue
      except OSError as e:
        raise errors.LogError(f'cannot append to the span log at entry {name}: {e}') from e
      self.seen += 1
      return self.seen - 1, others

  def _read(self, seq: int) -> dict | None:
    name = entry_name(seq)
    try:
      found = store_kvstore.result(self._kv.read(name))
    except OSError as e:
      raise errors.LogError(f'cannot read span log entry {name}: {e}') from e
    self.reads += 1
    if found.state != 'value':
      return None
    try:
      record = json.loads(found.value)
    except ValueError as e:
      raise errors.LogError(f'span log entry {name} is not JSON: {e}') from e
    if not isinstance(record, dict):
      raise errors.LogError(f'span log entry {name} is not a JSON object')
    return record
