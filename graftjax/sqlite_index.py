"""The sqlite index of a block store that the flywheel's library and the paging catalog extend.

    class Catalog(sqlite_index.SqliteIndex):
      schema = sqlite_index.Schema(table='pages', ...)

One sqlite file (WAL journal): a table of rows, each bound to a block of the store by its key
and token digest (`indexes.check`), and a `synced` table of what `sync` has read. What both
indexes do alike is done here once:

- open: sqlite failures surface as `indexes.CatalogFileError` naming the file and the cause
  (locked, corrupt, full disk...); a missing table is created, a file of another schema
  version or other columns is refused (the schema's `damaged` error: rebuild it);
- sync (`_sync`): the store listed, rows removed only on per-key evidence that their blocks
  are gone (`indexes.unlisted`: unlisted, absent on two direct reads of the manifest, and
  tombstoned by `indexes.delete_block`; a listing alone, or a store at the wrong root that
  answers absent for blocks it never held, removes nothing), what is new read, and the changes
  applied in one transaction against what is in the file then, so that syncs of one file from
  several processes at once all succeed;
- rebuild (`_replace`): the index written again only if it holds every row of the one in
  place but those whose blocks are gone (`indexes.check_complete`), checked and written in
  one transaction under the lock writers take, in the file in place (handles open on it stay
  valid); a file that is no index of this schema is replaced by a new one;
- writes: each checks, under the write lock, that the file at `path` is still the one the
  handle opened (`indexes.file_identity`), and refuses to write into one that was replaced.

A subclass says what its rows are (`Schema`), and what its sync reads and writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, ClassVar, Self

from graftjax import indexes
from graftjax import store as store_lib


@dataclasses.dataclass(frozen=True)
class Schema:
  """What an index's sqlite file holds.

  Attributes:
    table: the rows' table.
    create: its `CREATE TABLE IF NOT EXISTS` statement.
    columns: its columns, in order (`PRAGMA table_info` must list exactly these).
    synced: the `CREATE TABLE IF NOT EXISTS synced (...)` statement (one name per row).
    version: the schema version (`PRAGMA user_version`).
    names: a query of (row name, block key) of every row: what a rebuild must keep.
    noun: what the index is called in messages ('catalog', 'library catalog').
    rebuild: how to rebuild it, for messages ('Catalog.rebuild').
    damaged: the error of a file of another schema (a project error naming `rebuild`).
  """

  table: str
  create: str
  columns: tuple[str, ...]
  synced: str
  version: int
  names: str
  noun: str
  rebuild: str
  damaged: type[Exception]

  @property
  def insert(self) -> str:
    return f'INSERT INTO {self.table} VALUES ({", ".join("?" * len(self.columns))})'


@dataclasses.dataclass(frozen=True)
class Pass:
  """What one sync found and did (a subclass reports it in its own terms).

  Attributes:
    listed: the keys the store listed.
    listing: what `list_more` returned (None without it).
    gone: keys of rows taken out: known to be gone (`indexes.gone`).
    kept: keys the listing lacks not known to be gone: their rows are kept.
    new: what `read_new` returned.
    list_seconds: wall time of the listing.
    seconds: wall time of the whole sync.
  """

  listed: set[str]
  listing: Any
  gone: list[str]
  kept: list[str]
  new: Any
  list_seconds: float
  seconds: float


class SqliteIndex:
  """An index of `store` in the sqlite file `path` (':memory:' for tests).

  Args:
    path: the sqlite file (created if missing).
    store: the store the index indexes (None: some subclasses allow none).
    timeout: seconds to wait for another writer's lock.
  Raises:
    CatalogFileError: sqlite cannot use the file (corrupt, locked, unreadable).
    `schema.damaged`: the file is an index of another schema.
  """

  schema: ClassVar[Schema]

  def __init__(
    self,
    path: str | os.PathLike[str],
    *,
    store: store_lib.BlockStore | None,
    timeout: float = 5.0,
  ):
    self.path = os.fspath(path)
    self.store = store
    before = indexes.file_identity(self.path)
    self._db = indexes.connect(self.path, timeout=timeout)
    try:
      self._open()
      self._identity = indexes.file_identity(self.path)
      if before is not None and before != self._identity:
        raise indexes.CatalogFileError(
          self.path, f'replaced while it was being opened: open the {self.schema.noun} again'
        )
      self._opened()
    except BaseException:
      self._db.close()
      raise

  def _open(self) -> None:
    schema = self.schema
    with indexes.sqlite_errors(self.path, f'cannot open the {schema.noun}'):
      if self.path != ':memory:':
        self._db.execute('PRAGMA journal_mode=WAL')
      tables = {name for (name,) in self._db.execute('SELECT name FROM sqlite_master')}
      if schema.table not in tables:
        with indexes.transaction(self._db, self.path):
          self._db.execute(schema.create)
          self._db.execute(f'PRAGMA user_version = {schema.version}')
      version = self._db.execute('PRAGMA user_version').fetchone()[0]
      columns = tuple(row[1] for row in self._db.execute(f'PRAGMA table_info({schema.table})'))
    if version != schema.version or columns != schema.columns:
      raise schema.damaged(
        f'{self.path} is a {schema.noun} of schema version {version} (columns'
        f' {", ".join(columns)}); this code reads version {schema.version}: rebuild it from its'
        f' store ({schema.rebuild})'
      )
    if 'synced' not in tables:
      with indexes.transaction(self._db, self.path):
        self._db.execute(schema.synced)

  def _opened(self) -> None:
    """Hook: the file is open and its schema checked (the connection closes if this raises)."""

  def close(self) -> None:
    self._db.close()

  def __enter__(self) -> Self:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __len__(self) -> int:
    return self._read(f'SELECT COUNT(*) FROM {self.schema.table}')[0][0]

  def _read(self, query: str, params: Sequence[Any] = ()) -> list[tuple]:
    """The rows `query` selects (sqlite failures as `CatalogFileError`)."""
    with indexes.sqlite_errors(self.path, f'cannot read the {self.schema.noun}'):
      return self._db.execute(query, params).fetchall()

  @contextlib.contextmanager
  def _writing(self) -> Iterator[None]:
    """One write transaction (`indexes.transaction`): all of it, or nothing.

    Raises:
      CatalogFileError: the file at `path` is no longer the one this handle opened (another
        process replaced it): a write would land in a file nobody opens again; nothing is
        written (open the index again).
    """
    with indexes.transaction(self._db, self.path):
      if self._identity != indexes.file_identity(self.path):  # checked under the write lock
        raise indexes.CatalogFileError(
          self.path,
          f'replaced or removed since this handle opened it (by a copy or another program):'
          f' nothing was'
          f' written; open the {self.schema.noun} again',
        )
      yield

  def _sync(
    self,
    read_new: Callable[[set[str], set[str], Any], Any],
    apply: Callable[[list[str], Any], None],
    *,
    allow_removing_all: bool,
    list_more: Callable[[], Any] | None = None,
  ) -> Pass:
    """One sync of the index with its store.

    The store is listed (and `list_more()`, e.g. another listing, timed with it); rows whose
    blocks the listing lacks are split into those known to be gone (`gone`: absent on two
    direct reads and tombstoned, or absent twice where `allow_removing_all` vouches for the
    store) and the others (`kept`) before anything is read; `read_new(listed, seen, listing)` reads what
    is new (`seen`: the synced table's names); `apply(gone, new)` writes the changes in one
    transaction.

    Raises:
      RemovalRefusedError: the index has rows and the store lists none of their blocks
        (unless `allow_removing_all`); nothing was read or changed.
      CatalogFileError: the index cannot be read or written.
    """
    start = time.perf_counter()
    listed = set(self.store.list())
    listing = list_more() if list_more is not None else None
    list_seconds = time.perf_counter() - start
    rows = {key for _, key in self._read(self.schema.names)}
    gone, kept = indexes.unlisted(
      self.store, listed, rows, index=self.path, allow_removing_all=allow_removing_all
    )
    seen = {name for (name,) in self._read('SELECT * FROM synced')}
    new = read_new(listed, seen, listing)
    with self._writing():
      apply(gone, new)
    return Pass(listed, listing, gone, kept, new, list_seconds, time.perf_counter() - start)

  @classmethod
  def _replace(
    cls,
    path: str | os.PathLike[str],
    store: store_lib.BlockStore,
    *,
    listed: Collection[str],
    rows: Sequence[tuple],
    names: Collection[str],
    synced: Collection[str],
    allow_fewer_rows: bool = False,
  ) -> None:
    """Writes the index at `path` again: `rows` (sqlite rows, of the row names `names`) and
    the `synced` names, only if they hold every row of the index in place but those whose
    blocks are gone (`indexes.check_complete`).

    An index of this schema in place is rewritten in one write transaction on that file:
    the lock every writer takes is held from the completeness check to the commit, so a row
    added meanwhile is either in the check (and the rebuild refused unless it holds it) or
    waits for the rebuild, and handles open on the file stay on it. A file in place that is
    not an index of this schema (not sqlite, damaged, another version, no table) is
    replaced by a new file written beside it (no handle can be open on it).

    Args:
      path: the index's file.
      store: its store, listed into `listed`.
      listed: the keys the store listed.
      rows: the new index's rows.
      names: their row names (as `schema.names` gives them).
      synced: the names of the synced table.
      allow_fewer_rows: write the new index even if it lacks rows of the one in place.
    Raises:
      RemovalRefusedError: the new index lacks rows of the one in place whose blocks are not
        known to be gone (unless `allow_fewer_rows`); the one in place is kept.
      CatalogFileError: the one in place is locked, or the new one cannot be written.
    """
    schema, path = cls.schema, os.fspath(path)

    def write(db: sqlite3.Connection, in_place: Sequence[tuple]) -> None:
      indexes.check_complete(
        store,
        listed,
        {str(name): str(key) for name, key in in_place},
        names,
        index=path,
        allow_fewer_rows=allow_fewer_rows,
      )
      db.execute(f'DELETE FROM {schema.table}')
      db.execute('DELETE FROM synced')
      db.executemany(schema.insert, rows)
      db.executemany('INSERT INTO synced VALUES (?)', [(name,) for name in synced])

    db = cls._in_place(path)
    if db is not None:
      try:
        with indexes.transaction(db, path):
          write(db, db.execute(schema.names).fetchall())
      finally:
        db.close()
      return
    partial = f'{path}.rebuild-{uuid.uuid4().hex[:8]}'
    try:
      db = indexes.connect(partial, timeout=5.0)
      try:
        with indexes.transaction(db, partial):
          db.execute(schema.create)
          db.execute(schema.synced)
          db.execute(f'PRAGMA user_version = {schema.version}')
          write(db, ())
      finally:
        db.close()
    except BaseException:
      indexes.remove_database(partial)
      raise
    indexes.replace_database(partial, path)

  @classmethod
  def _in_place(cls, path: str) -> sqlite3.Connection | None:
    """A connection to the index of this schema at `path`; None if there is no file, or it
    is empty, not sqlite, damaged, of another schema or lacks a table (a rebuild replaces it).

    Raises:
      CatalogFileError: the file is locked by another connection, or cannot be read.
    """
    if not os.path.isfile(path) or indexes.is_empty_file(path):
      return None
    db = indexes.connect(path, timeout=5.0)
    try:
      version = db.execute('PRAGMA user_version').fetchone()[0]
      tables = {name for (name,) in db.execute('SELECT name FROM sqlite_master')}
      columns = tuple(row[1] for row in db.execute(f'PRAGMA table_info({cls.schema.table})'))
    except sqlite3.DatabaseError as e:
      db.close()
      cause = indexes.cause_of(e)
      if cause.startswith(('locked', 'disk I/O', 'cannot open')):
        raise indexes.CatalogFileError(path, f'cannot read the index in place: {cause}') from e
      return None
    if (version, columns) != (cls.schema.version, cls.schema.columns) or 'synced' not in tables:
      db.close()
      return None
    return db
