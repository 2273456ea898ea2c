"""The library: verified solutions deposited as KV blocks, with a catalog.

A deposit prefills a fixed template (question, worked solution, final
answer) at slot 0 of a cache of the library's shape, captures it as a block
and puts it in a `BlockStore`; a deposit record (`records/`, one JSON file
per item) and a row in an sqlite catalog (`catalog.db` beside the blocks)
record what the block holds and how it was verified. Only a solution whose
verification record re-verifies is deposited. Deposits are content-addressed
and idempotent: depositing the same item again is a no-op, so an interrupted
run resumes from the catalog.

A row names its block by key and carries the SHA-256 of the block's token ids
and of its own fields; `check` holds a row against the block's manifest (and
its text against the block's tokens) before the block is grafted. The
catalog is an index: `Library.rebuild` writes it again from the store's
manifests and the deposit records (the item, verdict and source are not in a
block's metadata, whose every field is part of its key).

A library shared by machines lives on an object store (`root` a tensorstore
kvstore spec or URL: blocks under `blocks/`, records under `records/`); each
machine keeps its own catalog (`index`, a local sqlite file) and brings it up
to date with `Library.sync`, which reads only the records not seen before and
their blocks' manifests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import sqlite3
import tempfile
from typing import Any

import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from graftjax import blocks
from graftjax import indexes
from graftjax import sqlite_index
from graftjax import store as store_lib
from graftjax.errors import GraftjaxError
from graftjax.models import cache as cache_lib
from graftjax.store import kvstore as store_kvstore

# A recurring question is asked as RECALL_QUERY after its block: the query
# repeats the block's first line and a half, so the answer is a copy a few
# tokens away (with the solution first, a 270M model re-derives it instead).
TEMPLATE = 'Question: {question}\nFinal answer: {answer}\nSolution: {solution}\n\n'
# A short answer (QA) has no solution to show: its block is the answer alone.
ANSWER_TEMPLATE = 'Question: {question}\nFinal answer: {answer}\n\n'
FORMS = ('solution', 'answer', 'code')
RECALL_QUERY = 'Question: {question}\nFinal answer:'
SOLVE_QUERY = 'Question: {question}\nSolution:'
# Code (an answer of several lines) is held once, in a fence whose close ends a recalled answer.
CODE_QUERY = 'Question: {question}\nFinal answer:\n```python\n'
CODE_TEMPLATE = CODE_QUERY + '{answer}\n```\n\n'
# Where a solution's own closing answer line starts (ours, or GSM8K's '####').
_ANSWER_LINE = re.compile(r'\n\s*(?:Final answer:|####)')

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS deposits (
  key TEXT NOT NULL,
  task TEXT NOT NULL,
  item_id TEXT NOT NULL,
  question TEXT NOT NULL,
  text TEXT NOT NULL,
  answer TEXT NOT NULL,
  source TEXT NOT NULL CHECK (source IN ('self', 'reference')),
  verdict TEXT NOT NULL,
  tokens_spent INTEGER NOT NULL,
  block_tokens INTEGER NOT NULL,
  tokens_sha256 TEXT NOT NULL,
  row_sha256 TEXT NOT NULL,
  PRIMARY KEY (task, item_id)
)
"""
# The deposit records (by name) whose rows are in the catalog: `sync` does not read them again.
_SYNCED = 'CREATE TABLE IF NOT EXISTS synced (name TEXT PRIMARY KEY) WITHOUT ROWID'
_RECORD_NAME = re.compile(r'[0-9a-f]{64}\.json')
BindingError = indexes.BindingError
CatalogFileError = indexes.CatalogFileError
RemovalRefusedError = indexes.RemovalRefusedError


class DepositError(GraftjaxError, ValueError):
  """A solution cannot be deposited: it does not re-verify, or the item is inconsistent."""


class SharedLibraryError(GraftjaxError, ValueError):
  """A library on an object store was opened without a local catalog path (`index`)."""


class DamagedLibraryError(GraftjaxError, ValueError):
  """The catalog is missing or empty beside a non-empty store, of another schema, or a row or
  record does not match its own digest: rebuild it (`Library.rebuild`)."""


@dataclasses.dataclass(frozen=True)
class Shape:
  """The cache every block of a library is computed in (and grafted into).

  Attributes:
    capacity: cache slots (block + query + answer must fit).
    chunk_size: prefill chunk of the block's template.
  """

  capacity: int = 1024
  chunk_size: int = 64


@dataclasses.dataclass(frozen=True)
class Entry:
  """One catalog row: a deposited block and what it holds."""

  key: str
  task: str
  item_id: str
  question: str
  text: str
  answer: str
  source: str
  verdict: dict[str, Any]
  tokens_spent: int
  block_tokens: int
  tokens_sha256: str

  @property
  def name(self) -> str:
    return f'library row {self.task}/{self.item_id}'

  def fields(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def row(self) -> tuple:
    """The sqlite row: every field (the verdict as JSON), then the SHA-256 of the fields."""
    fields = self.fields()
    stored = {**fields, 'verdict': json.dumps(self.verdict, sort_keys=True)}
    return (*stored.values(), indexes.row_sha256(fields))

  @classmethod
  def from_fields(cls, fields: dict[str, Any], digest: str, where: str) -> Entry:
    """The entry of a row's or record's fields, checked against their digest.

    Raises:
      DamagedLibraryError: a field is missing or malformed, or the digest does not match.
    """
    try:
      entry = cls(**fields)
      ok = indexes.row_sha256(entry.fields()) == digest
    except (TypeError, ValueError) as e:
      raise DamagedLibraryError(f'{where}: malformed ({e}); rebuild the library') from e
    if not ok:
      raise DamagedLibraryError(
        f'{where} does not match its own digest {str(digest)[:16]}…: it was altered; rebuild'
        ' the library (Library.rebuild)'
      )
    return entry


@dataclasses.dataclass(frozen=True)
class Synced:
  """What one `Library.sync` did.

  Attributes:
    listed: blocks the store listed.
    records: deposit records the store listed.
    read: records and manifests read (those of deposits not seen before).
    added: rows catalogued (a router is extended by `route_pairs(added)`).
    removed: rows whose blocks are known to be gone (`indexes.gone`), taken out.
    records_without_block: names of records whose block is not stored (read again next time).
    list_seconds: wall time of listing the blocks and the records.
    seconds: wall time of the whole sync.
    kept: keys the listing lacks whose blocks are not known to be gone: their rows are kept.
  """

  listed: int
  records: int
  read: int
  added: tuple[Entry, ...]
  removed: tuple[Entry, ...]
  records_without_block: tuple[str, ...]
  list_seconds: float
  seconds: float
  kept: tuple[str, ...] = ()


_FIELDS = [f.name for f in dataclasses.fields(Entry)]
_CATALOG = 'catalog.db'


class Library(sqlite_index.SqliteIndex):
  """Blocks in a `BlockStore` under `root`, their catalog in `root/catalog.db` (or `index`).

  Args:
    root: a local folder, or a tensorstore kvstore spec (dict) or URL of a library shared
      through an object store (blocks under `blocks/`, deposit records under `records/`).
    shape: the cache every block is computed in.
    timeout: seconds to wait for another writer's lock on the catalog.
    index: the catalog's sqlite file: this machine's index of the library, started empty if
      missing and brought up to date by `sync`. Required for a shared library; None: the
      catalog beside a local library, which must not be missing beside its blocks.
  Raises:
    DamagedLibraryError: the catalog beside a local library is missing or empty beside a
      non-empty store, or a catalog is of another schema (rebuild it: `Library.rebuild`).
    SharedLibraryError: a shared library without `index`.
    CatalogFileError: sqlite cannot use the catalog (corrupt, locked, unreadable).
  """

  schema = sqlite_index.Schema(
    table='deposits',
    create=_SCHEMA,
    columns=(*_FIELDS, 'row_sha256'),
    synced=_SYNCED,
    version=SCHEMA_VERSION,
    names="SELECT task || '/' || item_id, key FROM deposits",
    noun='library catalog',
    rebuild='Library.rebuild',
    damaged=DamagedLibraryError,
  )

  def __init__(
    self,
    root: Any,
    *,
    shape: Shape = Shape(),
    timeout: float = 5.0,
    index: str | os.PathLike[str] | None = None,
  ):
    self.shape = shape
    self.root, store, self._records = _open(root)
    if index is None and not isinstance(self.root, pathlib.Path):
      raise SharedLibraryError(
        f'{store.root}: a library on an object store needs a local catalog path (index=)'
      )
    path = pathlib.Path(index) if index is not None else self.root / _CATALOG
    if index is None and (not path.exists() or indexes.is_empty_file(path)) and store.list():
      state = 'is 0 bytes' if path.exists() else 'is missing'
      raise DamagedLibraryError(
        f'{path} {state} beside {len(store.list())} stored blocks: rebuild it from the'
        f' store and the deposit records (Library.rebuild({str(self.root)!r}))'
      )
    self.rebuilt: dict[str, Any] | None = None  # what `rebuild` found, on a rebuilt library
    super().__init__(path, store=store, timeout=timeout)

  @classmethod
  def rebuild(
    cls,
    root: Any,
    *,
    shape: Shape = Shape(),
    index: str | os.PathLike[str] | None = None,
    allow_fewer_rows: bool = False,
    **kwargs,
  ) -> Library:
    """Writes the catalog again from the store's manifests and the deposit records; opens it.

    Every record's own digest is checked, and its claims (token digest, token count) against
    its block's manifest. Blocks without a record and records without a block are left out
    and listed in the returned library's `rebuilt` (with the number of rows). A catalog of
    the earlier schema (rows without token digests, deposits without records) is adopted
    first: each of its rows whose block is stored gets its block's token digest, is checked
    as any row is, and is written as a record.

    The new catalog is written only if it holds a
    row of every item the one in place holds, but those whose blocks are known to be gone
    (unlisted, missing on two reads, tombstoned by `indexes.delete_block`): a missing
    `records/` folder never empties a catalog. The check and the write hold the lock writers
    take, in the file in place; a file that is not a catalog of this schema is replaced.

    Raises:
      DamagedLibraryError: a record does not match its own digest.
      BindingError: a record (or an adopted row) does not match the block it names.
      RemovalRefusedError: the new catalog lacks rows of the one in place whose blocks are
        not known to be gone (unless `allow_fewer_rows`); the one in place is kept.
      CatalogFileError: the new catalog cannot be written.
    """
    local, store, records = _open(root)
    if index is None and not isinstance(local, pathlib.Path):
      raise SharedLibraryError(f'{store.root}: rebuilding a shared library needs index=')
    path = pathlib.Path(index) if index is not None else local / _CATALOG
    stored = set(store.list())
    for entry in _earlier_rows(path, store, stored):
      records.write(entry)
    entries, orphans, names = [], [], []
    for name in records.names():
      entry = records.read(name)
      if entry.key not in stored:
        orphans.append(entry.key)
        continue
      check(entry, indexes.block_meta(store, entry.key))
      entries.append(entry)
      names.append(name)
    cls._replace(
      path,
      store,
      listed=stored,
      rows=[entry.row() for entry in entries],
      names={f'{entry.task}/{entry.item_id}' for entry in entries},
      synced=names,
      allow_fewer_rows=allow_fewer_rows,
    )
    library = cls(root, shape=shape, index=index, **kwargs)
    library.rebuilt = {
      'rows': len(entries),
      'blocks_without_record': sorted(stored - {e.key for e in entries}),
      'records_without_block': sorted(orphans),
    }
    return library

  def sync(self, *, allow_removing_all: bool = False) -> Synced:
    """Brings the catalog up to date with the store; returns what it did.

    The store's blocks and records are listed (on an object store the listing is the floor
    of the cost); only records not catalogued before are read, each with its own digest
    checked and then held against its block's manifest (`BlockStore.read_meta`: one read,
    no arrays). The store is the source of truth: a record replaces a row of the same item
    that differs from it.

    A row is removed only on per-key evidence that its block is gone: the listing lacks it,
    two direct reads of its manifest report it missing, and its deleter left a tombstone
    (`indexes.delete_block`); any other row is kept (`kept`): a store at the wrong root
    answers missing for every block it never held. If the store lists none of the
    catalogued blocks (an unmounted disk, an unreachable bucket), nothing is changed and
    `RemovalRefusedError` says so, unless `allow_removing_all` (the caller vouches for the
    store: rows of blocks missing on two reads go without tombstones). Syncs of one catalog
    file at once all succeed.

    Raises:
      RemovalRefusedError: the store lists none of the catalogued blocks.
      DamagedLibraryError: a record does not match its own digest.
      BindingError: a record does not match the block it names (naming both sides).
      store.StoreError: a block's manifest does not check (CorruptBlockError names the key
        and the block the manifest describes). Nothing of the sync is kept then.
      CatalogFileError: the catalog cannot be written.
    """

    def read_new(stored, seen, names):
      new, orphans, read = [], [], 0
      for name in names:
        if name in seen:
          continue
        entry = self._records.read(name)
        read += 1
        if entry.key not in stored:
          orphans.append(name)
          continue
        try:
          meta, _ = self.store.read_meta(entry.key)
        except store_lib.MissingBlockError:  # deleted since the listing
          orphans.append(name)
          continue
        read += 1
        check(entry, meta)
        new.append((name, entry))
      return new, orphans, read

    removed = []

    def apply(gone, found):
      for key in gone:
        for row in self._read('SELECT * FROM deposits WHERE key = ?', (key,)):
          entry = _entry(row)
          self._db.execute(  # the row as read: not one another sync wrote since
            'DELETE FROM deposits WHERE task = ? AND item_id = ? AND key = ?',
            (entry.task, entry.item_id, entry.key),
          )
          self._db.execute(
            'DELETE FROM synced WHERE name = ?', (_record_name(entry.task, entry.item_id),)
          )
          removed.append(entry)
      for name, entry in found[0]:
        self._db.execute(_UPSERT, entry.row())
        self._db.execute('INSERT OR IGNORE INTO synced VALUES (?)', (name,))

    done = self._sync(
      read_new, apply, allow_removing_all=allow_removing_all, list_more=self._records.names
    )
    new, orphans, read = done.new
    return Synced(
      listed=len(done.listed),
      records=len(done.listing),
      read=read,
      added=tuple(entry for _, entry in new),
      removed=tuple(sorted(removed, key=lambda e: (e.task, e.item_id))),
      records_without_block=tuple(orphans),
      list_seconds=done.list_seconds,
      seconds=done.seconds,
      kept=tuple(done.kept),
    )

  def entries(self) -> list[Entry]:
    """Every row by task and item, each checked against its digest."""
    return [_entry(row) for row in self._read('SELECT * FROM deposits ORDER BY task, item_id')]

  def find(self, task: str, item_id: str) -> Entry | None:
    rows = self._read('SELECT * FROM deposits WHERE task = ? AND item_id = ?', (task, item_id))
    return _entry(rows[0]) if rows else None

  def check(self, entry: Entry, model=None) -> blocks.BlockMeta:
    """The block's metadata, once `entry` is checked against it (see the module `check`);
    with `model`, the entry's text must also tokenize to the block's tokens.

    Raises:
      BindingError: naming the row, the block, and both sides of the difference.
      store.StoreError: the block is missing or its manifest does not check.
    """
    meta = indexes.block_meta(self.store, entry.key)
    check(entry, meta)
    if model is not None and tuple(model.tokenizer.encode(entry.text)) != meta.token_ids:
      raise BindingError(
        f'{entry.name}: its text does not tokenize to the tokens of block {entry.key[:12]}…'
        f' ({entry.block_tokens} tokens claimed, {len(meta.token_ids)} held)'
      )
    return meta

  def deposit(
    self,
    model,
    *,
    item,
    verifier,
    solution: str,
    source: str,
    tokens_spent: int,
    record: dict[str, Any] | None = None,
    form: str = 'solution',
  ) -> Entry:
    """Verifies `solution` for `item`, then deposits it as a block (once).

    Args:
      model: the frozen `Gemma` the block is computed with.
      item: a `tasks.Item` (`task`, `id`, `question`, `gold`).
      verifier: `verifier(text, gold) -> verifiers.Verdict` (the task's verifier).
      solution: the worked solution as produced (the model's text, or the
        dataset's); it must verify. Its own closing answer line ('Final
        answer: ...' or '#### ...') gives way to the template's.
      source: 'self' (the model solved it) or 'reference' (the dataset's own).
      tokens_spent: decode tokens the solve step spent on this item.
      record: the verdict recorded when the solution was checked before
        (`verdict.to_json()`); the deposit is refused unless it re-verifies
        to the same record.
      form: 'solution' (TEMPLATE: the worked solution under the verifier's
        canonical answer; CODE_TEMPLATE with the extracted answer alone where
        that spans lines, as code does, so the solution is held once),
        'answer' (ANSWER_TEMPLATE: the solution's first line, a short answer
        such as 'Spain', which must verify on its own) or 'code'
        (CODE_TEMPLATE with the extracted code, one line or several).
    Returns:
      The catalog entry (the existing one if the item was deposited before).
    Raises:
      DepositError: the solution does not verify (or not to `record`), or
        the source or form is unknown.
    """
    if source not in ('self', 'reference'):
      raise DepositError(f"source must be 'self' or 'reference', got {source!r}")
    if form not in FORMS:
      raise DepositError(f'form must be one of {FORMS}, got {form!r}')
    existing = self.find(item.task, item.id)
    if existing is not None:
      return existing
    verdict = verifier(solution, item.gold)
    if not verdict.verdict:
      raise DepositError(
        f'{item.task}/{item.id}: the solution does not verify (extracted'
        f' {verdict.extracted!r}, gold {item.gold!r}); nothing deposited'
      )
    if record is not None and record != verdict.to_json():
      raise DepositError(
        f'{item.task}/{item.id}: the recorded verdict {record} does not re-verify'
        f' ({verdict.to_json()}); nothing deposited'
      )
    if form == 'answer':
      text = ANSWER_TEMPLATE.format(
        question=item.question, answer=_answer_line(item, verifier, solution)
      )
    elif form == 'code' or '\n' in str(verdict.extracted):  # the answer is the code: held once
      text = CODE_TEMPLATE.format(question=item.question, answer=str(verdict.extracted).rstrip())
    else:
      body = _ANSWER_LINE.split(solution.strip(), maxsplit=1)[0].strip()
      text = TEMPLATE.format(question=item.question, solution=body, answer=verdict.extracted)
    ids = model.tokenizer.encode(text)
    if len(ids) > self.shape.capacity:
      raise DepositError(f'{len(ids)} tokens do not fit the library capacity {self.shape.capacity}')
    cache = model.init_cache(capacity=self.shape.capacity)
    cache = prefill_text(model, ids, cache, chunk_size=self.shape.chunk_size)
    block = blocks.capture(
      cache,
      blocks.Span(0, len(ids)),
      token_ids=ids,
      target=model.graft_target,
      chunk_size=self.shape.chunk_size,
    )
    key = self.store.put(block)
    entry = Entry(
      key=key,
      task=item.task,
      item_id=item.id,
      question=item.question,
      text=text,
      answer=str(verdict.extracted),
      source=source,
      verdict=verdict.to_json(),
      tokens_spent=int(tokens_spent),
      block_tokens=len(ids),
      tokens_sha256=indexes.tokens_sha256(ids),
    )
    self._records.write(entry)
    try:
      with self._writing():
        self._db.execute(_INSERT, entry.row())
        name = _record_name(entry.task, entry.item_id)
        self._db.execute('INSERT OR IGNORE INTO synced VALUES (?)', (name,))
    except indexes.CatalogFileError as e:
      if not isinstance(e.__cause__, sqlite3.IntegrityError):
        raise
      return self.find(item.task, item.id)  # another process deposited this item meanwhile
    return entry


def prefill_text(model, ids, cache, *, chunk_size: int):
  """`cache` with `ids` [n] prefilled after what it holds (positions continue its slots).

  Chunks of `chunk_size` slots from the text's start; the last one is padded to
  `chunk_size` slots (within the capacity) with tokens at position -1 after the
  text, and the cache's length is then set back to the text's end. Texts of any
  length so run one compiled program, and the padding slots, never attended to,
  are free for what comes next. A deposit's block and `answer_prompted`'s context
  are both computed so: the same text gives the same rows.

  Deposits are not batched over rows: XLA's bits for a row depend on how many
  rows run beside it (on the tiny config, the keys of a text prefilled beside
  another differ from the same text's alone by up to 3e-6), so a block of a
  batched deposit would not be the block of its text deposited alone.
  """
  start, n = int(cache.length), len(ids)
  region = max(n, min(-(-n // chunk_size) * chunk_size, cache.capacity - start))
  tokens = np.full((cache.batch_size, region), model.config.pad_id, np.int32)
  positions = np.full((cache.batch_size, region), cache_lib.EMPTY_POSITION, np.int32)
  tokens[:, :n] = ids
  positions[:, :n] = start + np.arange(n)
  for begin in range(0, region, chunk_size):
    chunk = slice(begin, begin + chunk_size)
    _, cache = model.forward(tokens[:, chunk], positions[:, chunk], cache, logits='none')
  return cache.replace(length=jnp.asarray(start + n, jnp.int32))


def check(entry: Entry, meta: blocks.BlockMeta) -> None:
  """Raises `BindingError` unless the block's metadata `meta` is what `entry` claims of it.

  The block's token digest and count must be the row's, and the row's text a deposit of its
  own question, under a verdict that verified to the row's answer.
  """
  indexes.check(
    meta, key=entry.key, what=entry.name, tokens=entry.tokens_sha256, n_tokens=entry.block_tokens
  )
  head = RECALL_QUERY.format(question=entry.question)
  if not entry.text.startswith(head) or entry.verdict.get('verdict') is not True:
    raise BindingError(
      f'{entry.name}: its text {entry.text[:40]!r}… is not the deposit of its question'
      f' {entry.question[:40]!r} under a verdict that verified'
    )
  if str(entry.verdict.get('extracted')) != entry.answer:
    raise BindingError(
      f'{entry.name}: answer {entry.answer!r}, but its verdict extracted'
      f' {entry.verdict.get("extracted")!r}'
    )


def route_pairs(entries) -> list[tuple[str, str]]:
  """(key, question) of each entry: what a router of the library holds (`Router.add_many`)."""
  return [(entry.key, entry.question) for entry in entries]


_INSERT = f'INSERT INTO deposits VALUES ({", ".join("?" * (len(_FIELDS) + 1))})'
_UPSERT = _INSERT.replace('INSERT', 'INSERT OR REPLACE', 1)


def _open(root: Any) -> tuple[pathlib.Path | Any, store_lib.BlockStore, _Records]:
  """(root, block store, records) of a library: a local folder, or an object-store prefix."""
  if isinstance(root, (str, os.PathLike)) and '://' not in os.fspath(root):
    root = pathlib.Path(root)
    return root, store_lib.BlockStore(root / 'blocks'), _Records(root / 'records')
  kv, _ = store_kvstore.open_kvstore(root, read_only=False)
  return root, store_lib.BlockStore(kv / 'blocks/'), _Records(kv / 'records/')


def _record_name(task: str, item_id: str) -> str:
  return hashlib.sha256(json.dumps([task, item_id]).encode()).hexdigest() + '.json'


def _record_body(entry: Entry) -> bytes:
  body = {'fields': entry.fields(), 'sha256': indexes.row_sha256(entry.fields())}
  return (json.dumps(body, sort_keys=True, indent=1, ensure_ascii=True) + '\n').encode()


class _Records:
  """The deposit records, one JSON file per item (`_record_name`): in a local folder, or
  under a kvstore prefix (a shared library on an object store)."""

  def __init__(self, where: pathlib.Path | ts.KvStore):
    self.where = where
    self._local = isinstance(where, pathlib.Path)
    self._name = str(where) if self._local else store_kvstore.location(where)

  def names(self) -> list[str]:
    """The records' names, sorted."""
    if self._local:
      return sorted(path.name for path in self.where.glob('*.json'))
    with _record_errors(self._name, 'cannot list the deposit records'):
      listed = store_kvstore.result(self.where.list())
    return sorted(n.decode() for n in listed if _RECORD_NAME.fullmatch(n.decode('latin-1')))

  def read(self, name: str) -> Entry:
    """The entry of record `name`, its digest checked, and its item the one `name` is of.

    Raises:
      DamagedLibraryError: the record is unreadable, does not match its own digest, or is
        another item's (its bytes written over this one's), naming both records.
    """
    if self._local:
      entry = _read_record(self.where / name)
    else:
      try:
        data = store_kvstore.read_value(self.where, name)
      except OSError as e:
        raise DamagedLibraryError(f'deposit record {self._name}{name}: unreadable ({e})') from e
      entry = _parse_record(data, f'deposit record {self._name}{name}')
    own = _record_name(entry.task, entry.item_id)
    if own != name:
      raise DamagedLibraryError(
        f'deposit record {self._name}/{name} holds the record of {entry.task}/{entry.item_id},'
        f" whose own record is {self._name}/{own}: another item's record was written over"
        ' it; its item is unknown here (restore the record, or rebuild the library without it)'
      )
    return entry

  def write(self, entry: Entry) -> None:
    """Writes the entry's deposit record whole (a record already there is kept).

    Raises:
      CatalogFileError: the record cannot be written (e.g. a full disk); nothing is left.
    """
    name = _record_name(entry.task, entry.item_id)
    if self._local:
      _write_record(self.where / name, entry)
      return
    with _record_errors(f'{self._name}{name}', 'cannot write the deposit record'):
      found = store_kvstore.result(self.where.read(name))
      if found.state != 'value':  # conditional: of racing writers, the first one's is kept
        self.where.write(name, _record_body(entry), if_equal=found.stamp.generation).result()


@contextlib.contextmanager
def _record_errors(where: str, doing: str):
  """Re-raises a kvstore failure as a `CatalogFileError` naming `where` and the cause."""
  try:
    yield
  except (OSError, ValueError) as e:
    raise CatalogFileError(where, f'{doing}: {e}') from e


def _write_record(path: pathlib.Path, entry: Entry) -> None:
  """Writes the entry's deposit record at `path` whole (a record already there is kept).

  Raises:
    CatalogFileError: the record cannot be written (e.g. a full disk); nothing is left of it.
  """
  records = path.parent
  try:
    if path.exists():
      return
    records.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=records, prefix='.record-')
    try:
      with os.fdopen(fd, 'wb') as f:
        f.write(_record_body(entry))
        f.flush()
        os.fsync(f.fileno())
      with contextlib.suppress(FileExistsError):  # another process wrote it first
        os.link(partial, path)
    finally:
      os.remove(partial)
  except OSError as e:
    raise CatalogFileError(str(path), f'cannot write the deposit record: {e.strerror or e}') from e


_EARLIER_FIELDS = _FIELDS[:-1]  # schema version 1: no token digest, no row digest


def _earlier_rows(path: pathlib.Path, store: store_lib.BlockStore, stored: set[str]):
  """The rows of a schema-1 catalog at `path` whose blocks are stored, each checked against
  its block (none if the file is absent, unreadable or of another schema)."""
  if not path.is_file() or indexes.is_empty_file(path):
    return []
  try:
    db = sqlite3.connect(f'{path.resolve().as_uri()}?mode=ro', uri=True)
    try:
      version = db.execute('PRAGMA user_version').fetchone()[0]
      columns = [row[1] for row in db.execute('PRAGMA table_info(deposits)')]
      if version != 0 or columns != _EARLIER_FIELDS:
        return []
      rows = db.execute('SELECT * FROM deposits ORDER BY task, item_id').fetchall()
    finally:
      db.close()
  except sqlite3.Error:
    return []
  out = []
  for row in rows:
    fields = dict(zip(_EARLIER_FIELDS, row))
    if fields['key'] not in stored:
      continue
    meta = indexes.block_meta(store, fields['key'])
    try:
      verdict = json.loads(fields['verdict'])
      entry = Entry(
        **{**fields, 'verdict': verdict}, tokens_sha256=indexes.tokens_sha256(meta.token_ids)
      )
    except (TypeError, ValueError, RecursionError) as e:
      raise DamagedLibraryError(
        f'{path}: row {fields["task"]}/{fields["item_id"]} of the earlier schema is malformed ({e})'
      ) from e
    check(entry, meta)
    out.append(entry)
  return out


def _read_record(path: pathlib.Path) -> Entry:
  try:
    data = path.read_bytes()
  except OSError as e:
    raise DamagedLibraryError(f'deposit record {path}: unreadable ({e})') from e
  return _parse_record(data, f'deposit record {path}')


def _parse_record(data: bytes, where: str) -> Entry:
  try:
    body = json.loads(data)
    return Entry.from_fields(body['fields'], body['sha256'], where)
  except (ValueError, TypeError, KeyError, RecursionError) as e:
    if isinstance(e, DamagedLibraryError):
      raise
    raise DamagedLibraryError(f'{where}: unreadable ({e})') from e


def _answer_line(item, verifier, solution: str) -> str:
  """The solution's first non-empty line, which must verify alone."""
  line = next((line.strip() for line in solution.splitlines() if line.strip()), '')
  if not verifier(line, item.gold).verdict:
    raise DepositError(
      f'{item.task}/{item.id}: the answer line {line!r} does not verify alone; nothing deposited'
    )
  return line


def _entry(row) -> Entry:
  *values, digest = row
  fields = dict(zip(_FIELDS, values))
  where = f'library row {fields.get("task")}/{fields.get("item_id")}'
  try:
    fields['verdict'] = json.loads(fields['verdict'])
  except (TypeError, ValueError, RecursionError) as e:
    raise DamagedLibraryError(f'{where}: verdict is not JSON ({e}); rebuild the library') from e
  return Entry.from_fields(fields, digest, where)
