"""Indexes of a store (catalog rows): what they claim about a block, and the check.

An index row names a block by its key and carries the SHA-256 of the block's
token ids (`tokens_sha256`) and a SHA-256 of its own fields (`row_sha256`).
Before a routed block is installed, `check` compares the row's claims with
the block's own metadata, read from its manifest by `block_meta` (no arrays
are read), and a mismatch raises `BindingError` naming both sides. sqlite
failures of a catalog file surface as `CatalogFileError` naming the cause
(`sqlite_errors`, `transaction`). The sqlite index that the library and the paging catalog
both extend, built on these, is `graftjax.sqlite_index`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import socket
import sqlite3
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.errors import GraftjaxError


class BindingError(GraftjaxError, ValueError):
  """An index row does not match the block it names (or its own digest)."""


class RemovalRefusedError(GraftjaxError, ValueError):
  """A sync or rebuild would remove rows without evidence that their blocks are gone (the
  store lists none of them: unmounted, unreachable, or another store); nothing was changed."""


class CatalogFileError(GraftjaxError):
  """A catalog's sqlite file cannot be used; `cause` says why (locked, corrupt, full disk...)."""

  def __init__(self, path: str, cause: str):
    super().__init__(f'{path}: {cause}')
    self.path, self.cause = path, cause


def tokens_sha256(token_ids: Sequence[int]) -> str:
  """SHA-256 hex of token ids as compact JSON (`[2,17,5]`): the same in every process."""
  ids = json.dumps([int(i) for i in token_ids], separators=(',', ':'))
  return hashlib.sha256(ids.encode('ascii')).hexdigest()


def row_sha256(fields: Mapping[str, Any]) -> str:
  """SHA-256 hex of a row's fields as canonical JSON (sorted keys, ASCII)."""
  canonical = json.dumps(dict(fields), sort_keys=True, separators=(',', ':'), ensure_ascii=True)
  return hashlib.sha256(canonical.encode('ascii')).hexdigest()


class _Found(Exception):
  """Carries a block's metadata out of `BlockStore.get_page` before any array is read."""

  def __init__(self, meta: blocks.BlockMeta):
    super().__init__()
    self.meta = meta


def block_meta(store: store_lib.BlockStore, key: str) -> blocks.BlockMeta:
  """The metadata of the block under `key`, from its manifest; no array is read.

  The store checks the manifest (every field, and that it describes `key`)
  before it asks `into` where to read the arrays; the metadata is taken there.

  Raises:
    store.StoreError: the block is missing, or its manifest does not check.
  """

  def stop(meta: blocks.BlockMeta, shapes) -> dict:
    raise _Found(meta)

  try:
    store.get_page(key, into=stop)
  except _Found as found:
    return found.meta
  raise AssertionError('unreachable: the store read a block without asking where to')


def check(
  meta: blocks.BlockMeta,
  *,
  key: str,
  what: str,
  tokens: str,
  n_tokens: int | None = None,
  model_fingerprint: str | None = None,
  dtype: str | None = None,
) -> None:
  """Raises unless the block's metadata `meta` is what the row `what` claims of block `key`.

  Args:
    meta: the block's own metadata (`block_meta`, or a block read from the store).
    key: the block's key, as the row names it.
    what: the row, for messages (e.g. "library row toy/q1").
    tokens: the row's `tokens_sha256` of the block's token ids.
    n_tokens, model_fingerprint, dtype: further claims of the row, checked if given.
  Raises:
    BindingError: naming the row, the block, and both sides of the first difference.
  """
  claims = {
    'tokens_sha256': (tokens, tokens_sha256(meta.token_ids)),
    'n_tokens': (n_tokens, len(meta.token_ids)),
    'model_fingerprint': (model_fingerprint, meta.model_fingerprint),
    'dtype': (dtype, meta.dtype),
  }
  for name, (claimed, held) in claims.items():
    if claimed is not None and claimed != held:
      raise BindingError(
        f'{what} names block {key[:12]}… with {name} {_short(claimed)}, but the block holds'
        f' {_short(held)}: the row does not index this block (rebuild the catalog from the store)'
      )


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 40 else f'{text[:37]}…'


# --- sqlite ------------------------------------------------------------------------------------

_CAUSES = (
  ('locked', 'locked by another connection (retry, or close the other writer)'),
  ('busy', 'locked by another connection (retry, or close the other writer)'),
  ('not a database', 'corrupt: not an sqlite database (rebuild the catalog from its store)'),
  ('malformed', 'corrupt: the database image is malformed (rebuild the catalog from its store)'),
  ('disk is full', 'the disk is full: nothing of the change was written'),
  ('disk i/o error', 'disk I/O error'),
  ('readonly', 'read-only: the catalog file or its folder cannot be written'),
  ('unable to open', 'cannot open the file (does its folder exist and is it readable?)'),
)


def cause_of(error: sqlite3.Error) -> str:
  """The cause of an sqlite error in words (locked, corrupt, full disk...)."""
  text = str(error).lower()
  for marker, cause in _CAUSES:
    if marker in text:
      return f'{cause} [sqlite: {error}]'
  return f'sqlite: {error}'


@contextlib.contextmanager
def sqlite_errors(path: str | os.PathLike[str], doing: str) -> Iterator[None]:
  """Re-raises an `sqlite3.Error` as a `CatalogFileError` naming `path` and the cause."""
  try:
    yield
  except sqlite3.Error as e:
    raise CatalogFileError(os.fspath(path), f'{doing}: {cause_of(e)}') from e


@contextlib.contextmanager
def transaction(db: sqlite3.Connection, path: str | os.PathLike[str]) -> Iterator[None]:
  """`BEGIN IMMEDIATE` ... `COMMIT` on an autocommit connection; on any error, a rollback
  that never hides the error's cause (sqlite may have rolled back already, e.g. on a full
  disk), then the error (sqlite errors as `CatalogFileError`)."""
  with sqlite_errors(path, 'cannot start a write'):
    db.execute('BEGIN IMMEDIATE')
  try:
    with sqlite_errors(path, 'cannot write'):
      yield
      db.execute('COMMIT')
  except BaseException:
    if db.in_transaction:
      with contextlib.suppress(sqlite3.Error):
        db.execute('ROLLBACK')
    raise


def connect(path: str | os.PathLike[str], *, timeout: float) -> sqlite3.Connection:
  """An autocommit connection to `path` (':memory:' for none), waiting up to `timeout`
  seconds for another writer's lock.

  Raises:
    CatalogFileError: the file cannot be opened.
  """
  with sqlite_errors(path, 'cannot open the catalog'):
    return sqlite3.connect(
      os.fspath(path), timeout=timeout, isolation_level=None, check_same_thread=False
    )


def replace_database(partial: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
  """Moves the closed sqlite file `partial` to `path`, first removing `path`'s journal, WAL
  and shared-memory files: a stale journal must never replay onto the new file."""
  path = os.fspath(path)
  for suffix in ('-journal', '-wal', '-shm'):
    with contextlib.suppress(FileNotFoundError):
      os.remove(path + suffix)
  os.replace(partial, path)


def remove_database(path: str | os.PathLike[str]) -> None:
  """Removes an sqlite file and its journal, WAL and shared-memory files, where present."""
  for suffix in ('', '-journal', '-wal', '-shm'):
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.fspath(path) + suffix)


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
  """(device, inode) of the file at `path`; None for ':memory:' or no file. A file replaced by
  another (a rename over it) has another identity, even where its contents are the same."""
  if os.fspath(path) == ':memory:':
    return None
  try:
    found = os.stat(path)
  except FileNotFoundError:
    return None
  return found.st_dev, found.st_ino


def is_empty_file(path: str | os.PathLike[str]) -> bool:
  """True if `path` is a file of 0 bytes (what a crash before the first write leaves)."""
  try:
    return os.path.isfile(path) and os.path.getsize(path) == 0
  except OSError:
    return False


# --- removals ----------------------------------------------------------------------------------
#
# A listing that lacks a key is no evidence that its block is gone (an unmounted disk, a
# mis-set prefix or another store lists what it holds), and neither is a direct read of the
# key alone: a store at the wrong root answers "absent" for every block it never held. A row
# is removed on per-key evidence only: its block's key answers absent on two direct reads,
# and the deleter left a tombstone under it (`delete_block`), or the caller vouches for the
# store (`allow_removing_all`, `allow_fewer_rows`).

_READS_IN_FLIGHT = 16  # manifest reads kept in flight at once (an object store's latency)
TOMBSTONES = '.tombstones/'  # where `delete_block` leaves them: no block key, so never listed


def _kvstore(store: store_lib.BlockStore):
  return store._kv  # noqa: SLF001 - BlockStore keeps its kvstore to itself; tombstones sit beside


def delete_block(store: store_lib.BlockStore, key: str) -> None:
  """Deletes the block under `key` and leaves its tombstone, written before the deletion: the
  evidence on which a sync or rebuild of any index of the store removes the block's rows.

  Raises:
    CatalogFileError: the tombstone cannot be written; the block is not deleted.
    store.StoreError: as `BlockStore.delete` (the block is missing, the store read-only...).
  """
  body = json.dumps({'deleted': key, 'by': f'pid {os.getpid()} on {socket.gethostname()}'})
  try:
    _kvstore(store).write(f'{TOMBSTONES}{key}', body.encode()).result()
  except ValueError as e:
    raise CatalogFileError(f'{store.root}', f'cannot write the tombstone of {key}: {e}') from e
  store.delete(key)


def tombstoned(store: store_lib.BlockStore, keys: Sequence[str]) -> set[str]:
  """Those of `keys` that `delete_block` left a tombstone under (a failed read: none)."""

  def has(key: str) -> bool:
    try:
      return _kvstore(store).read(f'{TOMBSTONES}{key}').result().state == 'value'
    except ValueError:
      return False

  with concurrent.futures.ThreadPoolExecutor(_READS_IN_FLIGHT) as pool:
    return {key for key, found in zip(keys, pool.map(has, keys)) if found}


def missing(store: store_lib.BlockStore, keys: Sequence[str]) -> list[str]:
  """Those of `keys` whose manifests two direct reads, one after the other, report missing.

  A key whose manifest reads (the listing missed it), is damaged, or cannot be read (the
  store did not answer) is not missing: only `MissingBlockError`, twice, is.
  """

  def is_missing(key: str) -> bool:
    try:
      store.read_meta(key)
    except store_lib.MissingBlockError:
      return True
    except store_lib.StoreError:  # damaged, or the store did not answer: no evidence
      pass
    return False

  with concurrent.futures.ThreadPoolExecutor(_READS_IN_FLIGHT) as pool:
    once = [key for key, gone in zip(keys, pool.map(is_missing, keys)) if gone]
    return [key for key, gone in zip(once, pool.map(is_missing, once)) if gone]


def gone(store: store_lib.BlockStore, keys: Sequence[str], *, vouched: bool) -> list[str]:
  """Those of `keys` whose blocks are known to be gone: absent on two direct reads, and
  tombstoned unless the caller `vouched` for the store."""
  absent = missing(store, keys)
  if vouched:
    return absent
  marked = tombstoned(store, absent)
  return [key for key in absent if key in marked]


def unlisted(
  store: store_lib.BlockStore,
  listed: Collection[str],
  rows: Collection[str],
  *,
  index: str,
  allow_removing_all: bool = False,
) -> tuple[list[str], list[str]]:
  """(gone, kept): the keys of `rows` (an index's block keys) that the listing `listed`
  lacks, split into those known to be gone (`gone`) and the others.

  Args:
    store: the store, listed successfully into `listed`.
    listed: the keys the store listed.
    rows: the keys the index holds rows of.
    index: the index, for messages (its path).
    allow_removing_all: the caller vouches for the store (it knows the blocks were deleted):
      keys absent on two reads are gone without tombstones, even if the store lists none.
  Raises:
    RemovalRefusedError: the index has rows and the store lists none of their blocks
      (unless `allow_removing_all`): an unmounted disk or an unreachable bucket lists empty.
  """
  listed, rows = set(listed), set(rows)
  absent = sorted(rows - listed)
  if not absent:
    return [], []
  if not allow_removing_all:
    _refuse_none_listed(store, listed, rows, index, 'allow_removing_all')
  found = gone(store, absent, vouched=allow_removing_all)
  return found, sorted(set(absent) - set(found))


def _refuse_none_listed(store, listed: set[str], rows: set[str], index: str, flag: str) -> None:
  if rows and not rows & listed:
    raise RemovalRefusedError(
      f'{index}: the store {store.root} lists {len(listed)} blocks and none of the'
      f' {len(rows)} the index holds rows of: it may be unmounted, unreachable or another'
      f' store; nothing was removed (if every block was deleted, pass {flag}=True)'
    )


def check_complete(
  store: store_lib.BlockStore,
  listed: Collection[str],
  in_place: Mapping[str, str],
  rebuilt: Collection[str],
  *,
  index: str,
  allow_fewer_rows: bool = False,
) -> None:
  """Raises unless every row of the index in place (`in_place`: row name -> block key) is in
  the `rebuilt` one (row names), or names a block known to be gone (`gone`: unlisted, absent
  on two direct reads, and tombstoned by `delete_block`).

  Raises:
    RemovalRefusedError: naming the first rows the rebuild would lose whose blocks are not
      known to be gone, or the store lists none of the index's blocks (unless
      `allow_fewer_rows`).
  """
  rebuilt = set(rebuilt)
  lost = {name: key for name, key in in_place.items() if name not in rebuilt}
  if not lost or allow_fewer_rows:
    return
  listed = set(listed)
  _refuse_none_listed(store, listed, set(in_place.values()), index, 'allow_fewer_rows')
  unlisted_keys = sorted({key for key in lost.values() if key not in listed})
  known = set(gone(store, unlisted_keys, vouched=False))
  kept = sorted(name for name, key in lost.items() if key not in known)
  if kept:
    raise RemovalRefusedError(
      f'{index}: the rebuilt index lacks {len(kept)} rows of the one in place whose blocks'
      f' are not known to be gone (e.g. {", ".join(kept[:3])}): the one in place is kept'
      ' (are deposit records or descriptions missing, or was the block deleted without'
      ' indexes.delete_block, which leaves its tombstone? pass allow_fewer_rows=True to'
      ' replace it all the same)'
    )
