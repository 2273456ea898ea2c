"""One contract for both sqlite indexes of a store (`sqlite_index.SqliteIndex`): the paging
catalog and the flywheel's library are held to the same tests, failure cases included."""

import shutil
import sqlite3
import threading

import pytest
from test_index_removals import SHAPE
from test_index_removals import deposit
from test_index_removals import describe
from test_store import make_block

from graftjax import indexes
from graftjax import sqlite_index
from graftjax import store as store_lib
from graftjax.flywheel import library as library_lib
from graftjax.paging import catalog as catalog_lib


class _Catalog:
  """Three blocks and their catalog (`Catalog`), synced; rows named by block key."""

  kind = catalog_lib.Catalog

  def __init__(self, tmp_path):
    self.root = tmp_path / 'store'
    self.store = store_lib.BlockStore(self.root)
    for i in range(3):
      self.store.put(make_block(i))
    self.path = tmp_path / 'c.sqlite'
    self.rows = 3
    with self.open() as index:
      index.sync(describe)

  def open(self, **kwargs):
    return catalog_lib.Catalog(self.path, store=self.store, **kwargs)

  def sync(self, index, *, wait=lambda: None, **kwargs):
    def describe_after(key, meta):
      wait()
      return describe(key, meta)

    return index.sync(describe_after, **kwargs)

  def rebuild(self, **kwargs):
    return catalog_lib.Catalog.rebuild(self.path, self.store, describe, **kwargs)

  def rebuild_missing_one(self):
    """A rebuild whose descriptions lack one block's (its text lives only in the catalog)."""
    left_out = max(self.store.list())
    leave_out = lambda key, meta: None if key == left_out else describe(key, meta)
    return catalog_lib.Catalog.rebuild(self.path, self.store, leave_out)

  def names(self, index):
    return index.keys()

  def add(self, index, i):
    """Block `i` stored and added through `index`; its row's name."""
    key = self.store.put(make_block(i))
    meta, _ = self.store.read_meta(key)
    assert index.add(
      key,
      describe(key, meta)[0],
      source='added',
      n_tokens=len(meta.token_ids),
      model_fingerprint=meta.model_fingerprint,
      dtype=meta.dtype,
    )
    return key

  def fresh(self):
    """The same store, its index file gone: the next syncs find every row new."""
    indexes.remove_database(self.path)


class _Library:
  """Three deposits and a library index of them (`Library`, its own `index=` file), synced;
  rows named task/item."""

  kind = library_lib.Library

  def __init__(self, tmp_path, model):
    self.model = model
    self.root = tmp_path / 'lib'
    with library_lib.Library(self.root, shape=SHAPE) as library:
      for i in range(3):
        deposit(model, library, i)
    self.path = tmp_path / 'index.db'
    self.rows = 3
    with self.open() as index:
      index.sync()

  def open(self, **kwargs):
    return library_lib.Library(self.root, shape=SHAPE, index=self.path, **kwargs)

  def sync(self, index, *, wait=lambda: None, **kwargs):
    read = index._records.read

    def read_after(name):
      wait()
      return read(name)

    index._records.read = read_after
    try:
      return index.sync(**kwargs)
    finally:
      index._records.read = read

  def rebuild(self, **kwargs):
    return library_lib.Library.rebuild(self.root, shape=SHAPE, index=self.path, **kwargs)

  def rebuild_missing_one(self):
    """A rebuild with one deposit record gone (what a row of it is written from)."""
    (self.root / 'records' / library_lib._record_name('toy', 'q2')).unlink()
    return self.rebuild()

  def names(self, index):
    return [f'{entry.task}/{entry.item_id}' for entry in index.entries()]

  def add(self, index, i):
    """Item `i` deposited through `index`; its row's name."""
    entry = deposit(self.model, index, i)
    return f'{entry.task}/{entry.item_id}'

  def fresh(self):
    indexes.remove_database(self.path)


@pytest.fixture(params=['catalog', 'library'])
def index(request, tmp_path):
  if request.param == 'library':
    return _Library(tmp_path, request.getfixturevalue('text_model'))
  return _Catalog(tmp_path)


def _dump(path):
  """Every table's rows, by table name."""
  db = sqlite3.connect(path)
  try:
    tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {name: db.execute(f'SELECT * FROM {name} ORDER BY 1').fetchall() for name in tables}
  finally:
    db.close()


def _unmount(root):
  """The folder moved away and an empty one in its place (an unmounted disk); returns an undo."""
  away = root.with_name(root.name + '.away')
  root.rename(away)
  root.mkdir()

  def remount():
    shutil.rmtree(root)
    away.rename(root)

  return remount


def test_both_indexes_are_the_one_base(index):
  assert issubclass(index.kind, sqlite_index.SqliteIndex)
  with index.open() as opened:
    assert len(opened) == index.rows == len(index.names(opened))


def test_a_sync_against_a_root_that_lists_empty_deletes_nothing(index):
  before = _dump(index.path)
  remount = _unmount(index.root)
  with index.open() as opened:
    with pytest.raises(indexes.RemovalRefusedError, match='lists 0 blocks.*unmounted'):
      index.sync(opened)
    assert len(index.names(opened)) == index.rows
  assert _dump(index.path) == before
  remount()
  with index.open() as opened:
    done = index.sync(opened)
    assert done.removed == () and done.kept == () and len(opened) == index.rows


def test_a_rebuild_with_missing_records_keeps_a_healthy_index(index):
  with index.open() as opened:
    names = index.names(opened)
  before = _dump(index.path)
  with pytest.raises(indexes.RemovalRefusedError, match=f'lacks 1 rows.*{names[-1]}'):
    index.rebuild_missing_one()
  assert _dump(index.path) == before
  assert not list(index.path.parent.glob('*.rebuild-*'))  # nothing half-written is left
  with index.open() as opened:
    assert index.names(opened) == names


def test_a_rebuild_replaces_an_index_it_can_rebuild_whole(index):
  with index.open() as opened:
    names = index.names(opened)
  index.fresh()
  index.path.write_bytes(b'not an sqlite file ' * 64)
  with index.rebuild() as rebuilt:
    assert index.names(rebuilt) == names


def test_two_syncs_at_once_both_succeed(index):
  index.fresh()
  opened = [index.open() for _ in range(2)]
  barrier = threading.Barrier(2, timeout=30)  # each sync has read the file before either writes
  results, errors = [], []

  def sync(one):
    try:
      results.append(index.sync(one, wait=barrier.wait))
    except Exception as e:  # noqa: BLE001  (reported below)
      errors.append(e)

  threads = [threading.Thread(target=sync, args=(one,)) for one in opened]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(60)
  assert errors == [] and [len(r.added) for r in results] == [index.rows, index.rows]
  for one in opened:
    assert len(one) == index.rows
    one.close()


def test_a_corrupt_sqlite_file_is_a_project_error(index):
  index.fresh()
  index.path.write_bytes(b'not an sqlite file ' * 64)
  with pytest.raises(indexes.CatalogFileError, match='corrupt: not an sqlite database') as raised:
    index.open()
  assert raised.value.path == str(index.path) and 'rebuild' in raised.value.cause


def test_a_locked_index_names_the_lock_and_reads_go_on(index):
  with index.open(timeout=0.05) as opened:
    other = sqlite3.connect(index.path, isolation_level=None)
    other.execute('BEGIN IMMEDIATE')
    try:
      with pytest.raises(indexes.CatalogFileError, match='locked by another connection'):
        index.sync(opened)
      assert len(index.names(opened)) == index.rows  # a reader is not held up (WAL journal)
    finally:
      other.execute('ROLLBACK')
      other.close()
    assert index.sync(opened).added == ()  # free again


def test_an_index_of_another_schema_is_named_and_rebuilt(index):
  with index.open() as opened:
    names = index.names(opened)
  index.fresh()
  db = sqlite3.connect(index.path)
  db.execute(f'CREATE TABLE {index.kind.schema.table} (key TEXT)')
  db.close()
  with pytest.raises(index.kind.schema.damaged, match='schema version 0.*rebuild'):
    index.open()
  assert issubclass(index.kind.schema.damaged, ValueError)
  with index.rebuild() as rebuilt:
    assert index.names(rebuilt) == names


# --- rebuilds and writers at once ---------------------------------------------------------------


def test_a_handle_open_across_a_rebuild_writes_into_the_rebuilt_index(index):
  with index.open() as opened:
    index.rebuild().close()  # another process's rebuild, as far as the file is concerned
    name = index.add(opened, 7)
  with index.open() as again:
    assert name in index.names(again) and len(again) == index.rows + 1


def test_a_write_into_a_replaced_file_is_refused_naming_the_replacement(index, tmp_path):
  with index.open() as opened:
    copy = tmp_path / 'copy.db'
    shutil.copyfile(index.path, copy)
    copy.replace(index.path)  # the file replaced under the open handle (a restore, a copy)
    with pytest.raises(indexes.CatalogFileError, match='replaced or removed since this handle'):
      index.add(opened, 7)
  with index.open() as again:
    assert len(again) == index.rows
    index.add(again, 7)
    assert len(again) == index.rows + 1


def test_a_row_added_while_a_rebuild_checks_is_never_dropped(index, monkeypatch):
  writer = index.open(timeout=0.05)
  check_complete, added = indexes.check_complete, []

  def check_then_add(*args, **kwargs):
    check_complete(*args, **kwargs)
    try:  # between the rebuild's check and its write: an add that returns must be kept
      added.append(index.add(writer, 7))
    except indexes.CatalogFileError as e:
      assert 'locked by another connection' in e.cause  # the rebuild holds the write lock
      added.append(None)

  monkeypatch.setattr(indexes, 'check_complete', check_then_add)
  index.rebuild().close()
  monkeypatch.undo()
  [name] = added
  with index.open() as again:
    assert name is None or name in index.names(again), 'an add that returned was dropped'
  if name is None:  # refused while the rebuild held the lock: it goes through after it
    name = index.add(writer, 7)
    with index.open() as again:
      assert name in index.names(again)
  writer.close()
