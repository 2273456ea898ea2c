"""A catalog of stored pages in sqlite, routed by the flywheel's routers.

    catalog = Catalog.beside(store)               # <root>/catalog.sqlite on a file store
    catalog.add(key, text, source='json/decoder.py', n_tokens=2048, page_layout=page.layout)
    catalog.route('how does the json decoder scan strings', k=3)   # [(Entry, score)]

One row per stored page or block (key, text, source, token count, page
layout as JSON, model fingerprint, dtype). The catalog is the durable record
(stdlib `sqlite3`, one file, WAL journal); the router (`graftjax.flywheel.route`:
`ExactRouter`, `BM25Router`, `EmbeddingRouter`) is an in-memory index rebuilt
from it, kept in step with every `add`. The store stays the authority on
bytes: a catalogued key is read and verified by the store like any other.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Self

from graftjax import store as store_lib
from graftjax.flywheel import route as route_lib

FILENAME = 'catalog.sqlite'
_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (
  key TEXT PRIMARY KEY,
  text TEXT NOT NULL,
  source TEXT NOT NULL,
  n_tokens INTEGER NOT NULL,
  page_layout TEXT,
  model_fingerprint TEXT NOT NULL,
  dtype TEXT NOT NULL
) WITHOUT ROWID
"""
_COLUMNS = ('key', 'text', 'source', 'n_tokens', 'page_layout', 'model_fingerprint', 'dtype')


class CatalogError(ValueError):
  """A catalog entry conflicts with the one stored, or a key is not catalogued."""


@dataclasses.dataclass(frozen=True)
class Entry:
  """One catalogued page (or block): what routing returns."""

  key: str
  text: str
  source: str
  n_tokens: int
  page_layout: tuple[tuple[int, int], ...] | None
  model_fingerprint: str
  dtype: str

  def row(self) -> tuple:
    layout = None if self.page_layout is None else json.dumps([list(p) for p in self.page_layout])
    return (
      self.key,
      self.text,
      self.source,
      self.n_tokens,
      layout,
      self.model_fingerprint,
      self.dtype,
    )

  @classmethod
  def from_row(cls, row: Sequence) -> Entry:
    key, text, source, n_tokens, layout, fingerprint, dtype = row
    layout = None if layout is None else tuple(tuple(p) for p in json.loads(layout))
    return cls(key, text, source, int(n_tokens), layout, fingerprint, dtype)


class Catalog:
  """Entries in sqlite at `path` (':memory:' for tests), routed by `router`.

  Args:
    path: the sqlite file (created if missing).
    router: a `graftjax.flywheel.route.Router` (default `BM25Router(threshold=0.0)`);
      the catalog's entries are added to it on open.
  """

  def __init__(self, path: str | os.PathLike[str], *, router: route_lib.Router | None = None):
    self.path = os.fspath(path)
    self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
    if self.path != ':memory:':
      self._db.execute('PRAGMA journal_mode=WAL')
    self._db.execute(_SCHEMA)
    self.router = router if router is not None else route_lib.BM25Router(threshold=0.0)
    self.router.add_many(
      (key, text) for key, text in self._db.execute('SELECT key, text FROM pages')
    )

  @classmethod
  def beside(cls, store: store_lib.BlockStore, **kwargs) -> Catalog:
    """The catalog of a `file` store, `<root>/catalog.sqlite` (the store ignores it)."""
    if getattr(store, '_local', None) is None:
      raise CatalogError(f'{store.root} is not a local store: give Catalog a path of its own')
    return cls(os.path.join(store.root, FILENAME), **kwargs)

  def close(self) -> None:
    self._db.close()

  def __enter__(self) -> Self:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __len__(self) -> int:
    return self._db.execute('SELECT COUNT(*) FROM pages').fetchone()[0]

  def __contains__(self, key: str) -> bool:
    return self._db.execute('SELECT 1 FROM pages WHERE key = ?', (key,)).fetchone() is not None

  def add(
    self,
    key: str,
    text: str,
    *,
    source: str,
    n_tokens: int,
    model_fingerprint: str,
    dtype: str,
    page_layout: Sequence[Sequence[int]] | None = None,
  ) -> bool:
    """Catalogues a page; False if the same entry was there already.

    Raises:
      CatalogError: if `key` is catalogued with other values.
    """
    layout = None if page_layout is None else tuple((int(a), int(b)) for a, b in page_layout)
    entry = Entry(key, text, source, int(n_tokens), layout, model_fingerprint, dtype)
    return self.add_many([entry]) == 1

  def add_many(self, entries: Iterable[Entry]) -> int:
    """Catalogues every entry in one transaction; returns how many were new."""
    entries = list(entries)
    for entry in entries:  # before any row is written: a refused entry leaves nothing behind
      if not route_lib.normalize(entry.text):
        raise CatalogError(f'key {entry.key[:12]}…: text {entry.text!r} has nothing to route by')
      if entry.n_tokens <= 0:
        raise CatalogError(
          f'key {entry.key[:12]}…: n_tokens must be positive, got {entry.n_tokens}'
        )
    new = []
    self._db.execute('BEGIN IMMEDIATE')
    try:
      for entry in entries:
        stored = self.get(entry.key, missing_ok=True)
        if stored is None:
          self._db.execute(
            f'INSERT INTO pages VALUES ({",".join("?" * len(_COLUMNS))})', entry.row()
          )
          new.append(entry)
        elif stored != entry:
          raise CatalogError(f'key {entry.key[:12]}… is catalogued with other values: {stored}')
      self._db.execute('COMMIT')
    except BaseException:
      self._db.execute('ROLLBACK')
      raise
    self.router.add_many((entry.key, entry.text) for entry in new)
    return len(new)

  def get(self, key: str, *, missing_ok: bool = False) -> Entry | None:
    row = self._db.execute(
      f'SELECT {", ".join(_COLUMNS)} FROM pages WHERE key = ?', (key,)
    ).fetchone()
    if row is None:
      if missing_ok:
        return None
      raise CatalogError(f'key {key[:12]}… is not catalogued')
    return Entry.from_row(row)

  def keys(self) -> list[str]:
    return [key for (key,) in self._db.execute('SELECT key FROM pages ORDER BY key')]

  def route(
    self, query: str, k: int = 1, *, threshold: float | None = None
  ) -> list[tuple[Entry, float]]:
    """The k best entries for `query` by the router, with their scores (best first)."""
    return [
      (self.get(hit.key), hit.score) for hit in self.router.route(query, k, threshold=threshold)
    ]
