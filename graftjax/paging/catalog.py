"""A catalog of stored pages in sqlite, routed by the routers of `graftjax.routing`.

    catalog = Catalog.beside(store)               # <root>/catalog.sqlite on a file store
    catalog.add(key, text, source='json/decoder.py', n_tokens=2048, page_layout=page.layout)
    catalog.route('how does the json decoder scan strings', k=3)   # [(Entry, score)]
    catalog = Catalog.rebuild(path, store, describe)   # the catalog again, from the store

One row per stored page or block (key, text, source, token count, page
layout as JSON, model fingerprint, dtype, the SHA-256 of the block's token
ids, and a SHA-256 of the row's own fields, checked whenever a row is read).
The catalog is an index of the store (stdlib `sqlite3`, one file, WAL
journal): opened with its store, every row added is checked against the
block's manifest; `PagedContext` checks every routed row against the block
it reads before installing it; `rebuild` writes the catalog again from the
store's manifests, and `sync` brings it up to date with a store that other
machines deposit into (only the manifests of blocks it has not seen are
read). The router (`graftjax.routing.route`: `ExactRouter`, `BM25Router`,
`EmbeddingRouter`) is an in-memory index rebuilt from the catalog, kept in
step with every `add` and `sync`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import operator
import os
from collections.abc import Callable, Iterable, Sequence

from graftjax import blocks
from graftjax import indexes
from graftjax import sqlite_index
from graftjax import store as store_lib
from graftjax.errors import GraftjaxError
from graftjax.routing import route as route_lib

FILENAME = 'catalog.sqlite'
SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages (
  key TEXT PRIMARY KEY,
  text TEXT NOT NULL,
  source TEXT NOT NULL,
  n_tokens INTEGER NOT NULL,
  page_layout TEXT,
  model_fingerprint TEXT NOT NULL,
  dtype TEXT NOT NULL,
  tokens_sha256 TEXT NOT NULL,
  row_sha256 TEXT NOT NULL
) WITHOUT ROWID
"""
# The keys whose manifests `sync` has read (catalogued or left out by `describe`).
_SYNCED = 'CREATE TABLE IF NOT EXISTS synced (key TEXT PRIMARY KEY) WITHOUT ROWID'
_COLUMNS = (
  'key',
  'text',
  'source',
  'n_tokens',
  'page_layout',
  'model_fingerprint',
  'dtype',
  'tokens_sha256',
  'row_sha256',
)
tokens_sha256 = indexes.tokens_sha256
BindingError = indexes.BindingError
CatalogFileError = indexes.CatalogFileError
RemovalRefusedError = indexes.RemovalRefusedError
# (key, the block's metadata) -> (text, source) of its row, or None to leave it out.
Describe = Callable[[str, blocks.BlockMeta], tuple[str, str] | None]


@dataclasses.dataclass(frozen=True)
class Synced:
  """What one `Catalog.sync` did.

  Attributes:
    listed: blocks the store listed.
    read: manifests read (the blocks not seen before).
    added: entries catalogued.
    removed: keys whose blocks are known to be gone (`indexes.gone`), taken out.
    list_seconds: wall time of the store's listing.
    seconds: wall time of the whole sync.
    kept: keys the listing lacks whose blocks are not known to be gone: their rows are kept.
  """

  listed: int
  read: int
  added: tuple[Entry, ...]
  removed: tuple[str, ...]
  list_seconds: float
  seconds: float
  kept: tuple[str, ...] = ()


class CatalogError(GraftjaxError, ValueError):
  """A catalog entry conflicts with the one stored, or a key is not catalogued."""


class DamagedCatalogError(CatalogError):
  """A catalog file is empty beside a non-empty store, of another schema, or a row does not
  match its own digest: rebuild it from the store (`Catalog.rebuild`)."""


@dataclasses.dataclass(frozen=True)
class Entry:
  """One catalogued page (or block): what routing returns.

  `tokens_sha256` (`indexes.tokens_sha256` of the block's token ids) binds the
  row to its block; None only before `Catalog.add_many` takes it from the store.
  """

  key: str
  text: str
  source: str
  n_tokens: int
  page_layout: tuple[tuple[int, int], ...] | None
  model_fingerprint: str
  dtype: str
  tokens_sha256: str | None = None

  def fields(self) -> dict:
    layout = None if self.page_layout is None else [list(p) for p in self.page_layout]
    return {**dataclasses.asdict(self), 'page_layout': layout}

  def row(self) -> tuple:
    """The sqlite row: every field (the layout as JSON), then the SHA-256 of the fields."""
    fields = self.fields()
    layout = fields['page_layout']
    stored = {**fields, 'page_layout': None if layout is None else json.dumps(layout)}
    return (*(stored[c] for c in _COLUMNS[:-1]), indexes.row_sha256(fields))

  @classmethod
  def from_row(cls, row: Sequence) -> Entry:
    """The entry of a row, its digest checked.

    Raises:
      DamagedCatalogError: the row does not match its own digest, or a field is malformed.
    """
    *values, digest = row
    key = str(values[0])[:12]
    try:
      key, text, source, n_tokens, layout, fingerprint, dtype, tokens = values
      layout = None if layout is None else tuple(tuple(p) for p in json.loads(layout))
      entry = cls(key, text, source, int(n_tokens), layout, fingerprint, dtype, tokens)
    except (ValueError, TypeError, RecursionError) as e:
      raise DamagedCatalogError(f'catalog row {key}…: malformed ({e}); rebuild the catalog') from e
    if indexes.row_sha256(entry.fields()) != digest:
      raise DamagedCatalogError(
        f'catalog row {key}… does not match its own digest {str(digest)[:16]}…: the row was'
        ' altered; rebuild the catalog from its store (Catalog.rebuild)'
      )
    return entry


class Catalog(sqlite_index.SqliteIndex):
  """Entries in sqlite at `path` (':memory:' for tests), routed by `router`.

  Args:
    path: the sqlite file (created if missing).
    router: a `graftjax.routing.route.Router` (default `BM25Router(threshold=0.0)`);
      the catalog's routable entries are added to it on open.
    store: the store the catalog indexes: every entry added is checked against its block's
      manifest (and takes its `tokens_sha256` from it), and a 0-byte catalog file beside an
      empty store is a new catalog. None: entries must carry `tokens_sha256`.
    timeout: seconds to wait for another writer's lock.
  Raises:
    DamagedCatalogError: a 0-byte file (beside a non-empty or unknown store), a catalog of
      another schema, or a row that does not match its digest.
    CatalogFileError: sqlite cannot use the file (corrupt, locked, unreadable).
  """

  schema = sqlite_index.Schema(
    table='pages',
    create=_SCHEMA,
    columns=_COLUMNS,
    synced=_SYNCED,
    version=SCHEMA_VERSION,
    names='SELECT key, key FROM pages',
    noun='catalog',
    rebuild='Catalog.rebuild',
    damaged=DamagedCatalogError,
  )

  def __init__(
    self,
    path: str | os.PathLike[str],
    *,
    router: route_lib.Router | None = None,
    store: store_lib.BlockStore | None = None,
    timeout: float = 5.0,
  ):
    path = os.fspath(path)
    if indexes.is_empty_file(path) and (store is None or store.list()):
      raise DamagedCatalogError(
        f'{path} is 0 bytes beside a store that is not known to be empty: rebuild it from'
        ' the store (Catalog.rebuild), or delete it to start an empty catalog'
      )
    self.router = router if router is not None else route_lib.BM25Router(threshold=0.0)
    self.unroutable: list[str] = []  # keys whose text has nothing to route by
    self._removed: set[str] = set()  # keys `sync` took out, still in the router
    super().__init__(path, store=store, timeout=timeout)

  def _opened(self) -> None:
    for entry in self.entries():
      if route_lib.normalize(entry.text):
        self.router.add(entry.key, entry.text)
      else:
        self.unroutable.append(entry.key)

  @classmethod
  def beside(cls, store: store_lib.BlockStore, **kwargs) -> Catalog:
    """The catalog of a `file` store, `<root>/catalog.sqlite` (the store ignores it)."""
    if '://' in str(store.root):
      raise CatalogError(f'{store.root} is not a local store: give Catalog a path of its own')
    return cls(os.path.join(store.root, FILENAME), store=store, **kwargs)

  @classmethod
  def rebuild(
    cls,
    path: str | os.PathLike[str],
    store: store_lib.BlockStore,
    describe: Describe,
    *,
    allow_fewer_rows: bool = False,
    **kwargs,
  ) -> Catalog:
    """Writes the catalog at `path` again from the store, replacing what was there; opens it.

    Every block of the store is read and verified; its row takes the token count, page
    layout, model fingerprint, dtype and token digest from the block, and its text and source
    from `describe(key, meta)` (they are not in the block's metadata), which may return None
    to leave the block out.

    The new catalog is written only if it holds a
    row of every key the one in place holds, but those whose blocks are known to be gone
    (unlisted, missing on two reads, tombstoned by `indexes.delete_block`): the texts live
    only in the catalog. The check and the write hold the lock writers take, in the file in
    place (`SqliteIndex._replace`); a file that is not a catalog of this schema is replaced.

    Raises:
      store.StoreError: a block is missing or does not verify.
      RemovalRefusedError: the new catalog lacks rows of the one in place whose blocks are
        not known to be gone (unless `allow_fewer_rows`); the one in place is kept.
      CatalogError: `describe` gave a text with nothing to route by.
      CatalogFileError: the new file cannot be written.
    """
    entries, keys = [], store.list()
    for key in keys:
      block, layout = store.get_page(key)
      described = describe(key, block.meta)
      if described is not None:
        text, source = described
        entries.append(_checked(_entry_of(key, block.meta, layout, text, source), block.meta))
    cls._replace(
      path,
      store,
      listed=keys,
      rows=[entry.row() for entry in entries],
      names={entry.key for entry in entries},
      synced=keys,  # every block is seen: `sync` reads none
      allow_fewer_rows=allow_fewer_rows,
    )
    return cls(path, store=store, **kwargs)

  def sync(self, describe: Describe, *, allow_removing_all: bool = False) -> Synced:
    """Brings the catalog up to date with its store; returns what it did.

    The store is listed (on an object store the listing is the floor of the cost: every
    object is listed), and only the manifests of blocks not catalogued or seen by an
    earlier sync are read (`BlockStore.read_meta`: one read each, no arrays). A new
    block's row takes its token count, page layout, model, dtype and token digest from its
    manifest, and its text and source from `describe(key, meta)`, which may return None to
    leave it out (it is not read again).

    A row is removed (and never routed again) only on per-key evidence that its block is
    gone: the listing lacks it, two direct reads of its manifest report it missing, and its
    deleter left a tombstone (`indexes.delete_block`). Any other row whose block the listing
    lacks is kept (`kept`): a store at the wrong root answers missing for every block it
    never held. If the store lists none of the catalogued blocks (an unmounted disk, an
    unreachable bucket, another store), nothing is changed and `RemovalRefusedError` says
    so, unless `allow_removing_all`, with which the caller vouches for the store: rows of
    blocks missing on two reads are removed without tombstones. The changes are applied in one transaction that takes what is in
    the file then: syncs of one catalog file from several processes at once all succeed
    (a row another one added first is kept as it is).

    Raises:
      store.StoreError: the listing fails, or a new block's manifest does not check
        (CorruptBlockError names the key and the block the manifest describes); nothing
        of the sync is kept.
      RemovalRefusedError: the store lists none of the catalogued blocks.
      CatalogError: `describe` gave a text with nothing to route by.
      CatalogFileError: the catalog cannot be written.
    """
    if self.store is None:
      raise CatalogError(f'{self.path}: a catalog opened without its store cannot sync')

    def read_new(listed, seen, _):
      new, read = [], []
      for key, (meta, layout) in _read_metas(self.store, sorted(listed - seen)):
        read.append(key)
        described = describe(key, meta)
        if described is not None:
          text, source = described
          new.append(self._checked(_entry_of(key, meta, layout, text, source), meta))
      rows = set(self.keys())
      unsynced = sorted(seen - rows - listed)  # seen, never catalogued: read again if listed
      return new, read, unsynced

    def apply(gone, found):
      new, read, unsynced = found
      for key in gone:
        self._db.execute('DELETE FROM pages WHERE key = ?', (key,))
      for key in [*gone, *unsynced]:
        self._db.execute('DELETE FROM synced WHERE key = ?', (key,))
      self._db.executemany('INSERT OR IGNORE INTO synced VALUES (?)', [(k,) for k in read])
      self._db.executemany(
        self.schema.insert.replace('INSERT', 'INSERT OR IGNORE', 1), [e.row() for e in new]
      )

    done = self._sync(read_new, apply, allow_removing_all=allow_removing_all)
    new, read, _ = done.new
    added = [self.get(e.key, missing_ok=True) for e in new]  # another sync's, if it was first
    added = [entry for entry in added if entry is not None]
    self._removed.update(done.gone)
    self._removed.difference_update(e.key for e in added)
    self.router.add_many((entry.key, entry.text) for entry in added)
    return Synced(
      listed=len(done.listed),
      read=len(read),
      added=tuple(added),
      removed=tuple(done.gone),
      list_seconds=done.list_seconds,
      seconds=done.seconds,
      kept=tuple(done.kept),
    )

  def __contains__(self, key: str) -> bool:
    return bool(self._read('SELECT 1 FROM pages WHERE key = ?', (key,)))

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
    token_ids: Sequence[int] | None = None,
  ) -> bool:
    """Catalogues a page; False if the same entry was there already.

    `token_ids` are the block's (for its `tokens_sha256`); None takes them from the store.

    Raises:
      CatalogError: if `key` is catalogued with other values, or the entry is refused.
      BindingError: if the entry does not match the block under `key` in the store.
    """
    try:
      layout = None if page_layout is None else tuple((int(a), int(b)) for a, b in page_layout)
      tokens = None if token_ids is None else tokens_sha256(token_ids)
      n_tokens = operator.index(n_tokens)
    except (TypeError, ValueError) as e:
      raise CatalogError(
        f'key {str(key)[:12]}…: n_tokens, page_layout or token_ids malformed: {e}'
      ) from e
    entry = Entry(key, text, source, n_tokens, layout, model_fingerprint, dtype, tokens)
    return self.add_many([entry]) == 1

  def add_many(self, entries: Iterable[Entry]) -> int:
    """Catalogues every entry in one transaction; returns how many were new.

    With a store, each entry is first checked against its block's manifest (its token
    digest, token count, model, dtype and page layout, which the key commits to).
    """
    entries = [self._checked(entry) for entry in entries]  # a refused entry leaves nothing
    new = []
    with self._writing():
      for entry in entries:
        stored = self.get(entry.key, missing_ok=True)
        if stored is None:
          self._db.execute(self.schema.insert, entry.row())
          new.append(entry)
        elif stored != entry:
          raise CatalogError(f'key {entry.key[:12]}… is catalogued with other values: {stored}')
    self.router.add_many((entry.key, entry.text) for entry in new)
    return len(new)

  def _checked(self, entry: Entry, meta: blocks.BlockMeta | None = None) -> Entry:
    """`entry` checked (and its token digest taken) against its block's metadata: `meta`,
    or read from the store."""
    if self.store is None and meta is None:
      _check_fields(entry)
      if entry.tokens_sha256 is None:
        raise CatalogError(
          f'key {entry.key[:12]}…: no token ids to bind the row to its block (give token_ids,'
          ' or open the catalog with its store)'
        )
      return entry
    return _checked(entry, meta or indexes.block_meta(self.store, entry.key))

  def get(self, key: str, *, missing_ok: bool = False) -> Entry | None:
    """The entry of `key`, its digest checked.

    Raises:
      CatalogError: `key` is not catalogued (unless `missing_ok`), or (DamagedCatalogError)
        its row does not match its digest.
    """
    rows = self._read(f'SELECT {", ".join(_COLUMNS)} FROM pages WHERE key = ?', (key,))
    row = rows[0] if rows else None
    if row is None:
      if missing_ok:
        return None
      raise CatalogError(f'key {key[:12]}… is not catalogued')
    return Entry.from_row(row)

  def entries(self) -> list[Entry]:
    """Every entry by key, each row's digest checked."""
    rows = self._read(f'SELECT {", ".join(_COLUMNS)} FROM pages ORDER BY key')
    return [Entry.from_row(row) for row in rows]

  def keys(self) -> list[str]:
    return [key for (key,) in self._read('SELECT key FROM pages ORDER BY key')]

  def route(
    self, query: str, k: int = 1, *, threshold: float | None = None
  ) -> list[tuple[Entry, float]]:
    """The k best entries for `query` by the router, with their scores (best first)."""
    hits = self.router.route(query, k + len(self._removed), threshold=threshold)
    hits = [hit for hit in hits if hit.key not in self._removed][:k]
    return [(self.get(hit.key), hit.score) for hit in hits]


_READS_IN_FLIGHT = 16  # manifest reads `sync` keeps in flight (an object store's latency)


def _read_metas(store: store_lib.BlockStore, keys: Sequence[str]):
  """(key, (meta, page layout)) of each key, in order, read `_READS_IN_FLIGHT` at a time;
  keys whose blocks were deleted since the listing are left out."""

  def read(key):
    try:
      return key, store.read_meta(key)
    except store_lib.MissingBlockError:
      return key, None

  with concurrent.futures.ThreadPoolExecutor(_READS_IN_FLIGHT) as pool:
    return [(key, found) for key, found in pool.map(read, keys) if found is not None]


def _check_fields(entry: Entry) -> None:
  """Raises `CatalogError` unless the entry's fields are of their types, its text has something
  to route by and its token count is positive."""
  strings = ('key', 'text', 'source', 'model_fingerprint', 'dtype')
  wrong = [name for name in strings if not isinstance(getattr(entry, name), str)]
  if wrong or not isinstance(entry.n_tokens, int) or isinstance(entry.n_tokens, bool):
    wrong = wrong or ['n_tokens']
    raise CatalogError(
      f'catalog entry {entry.key!r:.20}: {", ".join(wrong)} of the wrong type'
      f' ({", ".join(type(getattr(entry, name)).__name__ for name in wrong)})'
    )
  if not route_lib.normalize(entry.text):
    raise CatalogError(f'key {entry.key[:12]}…: text {entry.text!r} has nothing to route by')
  if entry.n_tokens <= 0:
    raise CatalogError(f'key {entry.key[:12]}…: n_tokens must be positive, got {entry.n_tokens}')


def _checked(entry: Entry, meta: blocks.BlockMeta) -> Entry:
  """`entry` checked (`_check_fields`, `check_entry`, and its page layout against its key), its
  token digest taken from `meta` where it has none."""
  _check_fields(entry)
  if entry.tokens_sha256 is None:
    entry = dataclasses.replace(entry, tokens_sha256=tokens_sha256(meta.token_ids))
  check_entry(entry, meta)
  if store_lib.key_for(meta, entry.page_layout) != entry.key:
    raise BindingError(
      f'catalog row {entry.key[:12]}… ({entry.source}) claims page layout'
      f' {entry.page_layout}; block {entry.key[:12]}… is stored with another'
    )
  return entry


def check_entry(entry: Entry, meta: blocks.BlockMeta, *, tokens_only: bool = False) -> None:
  """Raises `BindingError` unless the block's metadata is what `entry` claims of it: its
  token digest, and unless `tokens_only` its token count, model and dtype."""
  claims = {}
  if not tokens_only:
    claims = {'n_tokens': entry.n_tokens, 'model_fingerprint': entry.model_fingerprint}
    claims['dtype'] = entry.dtype
  indexes.check(
    meta,
    key=entry.key,
    what=f'catalog row {entry.key[:12]}… ({entry.source})',
    tokens=entry.tokens_sha256,
    **claims,
  )


def _entry_of(key, meta: blocks.BlockMeta, layout, text: str, source: str) -> Entry:
  return Entry(
    key=key,
    text=text,
    source=source,
    n_tokens=len(meta.token_ids),
    page_layout=layout,
    model_fingerprint=meta.model_fingerprint,
    dtype=meta.dtype,
    tokens_sha256=tokens_sha256(meta.token_ids),
  )
