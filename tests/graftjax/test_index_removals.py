"""Indexes never delete what they cannot rebuild: a sync removes a row only on per-key
evidence (unlisted, absent on two direct reads of the block's manifest, and tombstoned by its
deleter), never on a listing or a store at the wrong root; a rebuild writes the index only when
it is at least as complete; two syncs of one file at once both succeed."""

import shutil
import sqlite3
import threading

import pytest
from test_store import make_block

from graftjax import indexes
from graftjax import store as store_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers
from graftjax.paging import catalog as catalog_lib

SHAPE = library_lib.Shape(capacity=128, chunk_size=16)


def describe(key, meta):
  return ' '.join(f'w{t % 97}' for t in meta.token_ids[:6]), 'synced'


def _rows(path, table='pages'):
  db = sqlite3.connect(path)
  try:
    return db.execute(f'SELECT * FROM {table} ORDER BY 1, 2').fetchall()
  finally:
    db.close()


@pytest.fixture
def synced(tmp_path):
  """(store, catalog path, keys): three blocks and a catalog beside them, synced."""
  store = store_lib.BlockStore(tmp_path / 'store')
  keys = sorted(store.put(make_block(i)) for i in range(3))
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path, store=store) as catalog:
    catalog.sync(describe)
  return store, path, keys


def _unmount(root):
  """The store's folder moved away and an empty one in its place (an unmounted disk)."""
  away = root.with_name(root.name + '.away')
  root.rename(away)
  root.mkdir()
  return away


def test_a_store_that_lists_empty_removes_no_row(synced, tmp_path):
  store, path, keys = synced
  before = _rows(path)
  away = _unmount(tmp_path / 'store')
  with catalog_lib.Catalog(path, store=store) as catalog:
    with pytest.raises(indexes.RemovalRefusedError, match='lists 0 blocks.*unmounted'):
      catalog.sync(describe)
    assert catalog.keys() == keys
  assert _rows(path) == before
  shutil.rmtree(tmp_path / 'store')
  away.rename(tmp_path / 'store')
  with catalog_lib.Catalog(path, store=store) as catalog:
    assert catalog.sync(describe).removed == () and catalog.keys() == keys


def test_a_store_emptied_on_purpose_is_synced_with_the_flag(synced):
  store, path, keys = synced
  for key in keys:
    store.delete(key)
  with catalog_lib.Catalog(path, store=store) as catalog:
    with pytest.raises(indexes.RemovalRefusedError):
      catalog.sync(describe)
    assert catalog.sync(describe, allow_removing_all=True).removed == tuple(keys)
    assert len(catalog) == 0


def test_a_listing_that_fails_changes_nothing(synced, monkeypatch):
  store, path, keys = synced
  before = _rows(path)

  def fails():
    raise store_lib.StoreIOError(str(store.root), 'cannot list the store: connection reset')

  monkeypatch.setattr(store, 'list', fails)
  with catalog_lib.Catalog(path, store=store) as catalog:
    with pytest.raises(store_lib.StoreIOError, match='connection reset'):
      catalog.sync(describe)
  assert _rows(path) == before


def test_a_listing_that_misses_a_block_whose_manifest_reads_removes_nothing(synced, monkeypatch):
  store, path, keys = synced
  listed = store.list()
  monkeypatch.setattr(store, 'list', lambda: [k for k in listed if k != keys[1]])
  with catalog_lib.Catalog(path, store=store) as catalog:
    done = catalog.sync(describe)
    assert done.removed == () and done.kept == (keys[1],) and catalog.keys() == keys


def test_a_manifest_read_that_fails_is_not_evidence(synced, monkeypatch):
  store, path, keys = synced
  listed, read_meta = store.list(), store.read_meta

  def read(key):
    if key == keys[0]:
      raise store_lib.StoreIOError(key, 'connection reset')
    return read_meta(key)

  monkeypatch.setattr(store, 'list', lambda: [k for k in listed if k not in keys[:2]])
  monkeypatch.setattr(store, 'read_meta', read)
  indexes.delete_block(store, keys[1])  # gone for real: unlisted, missing, tombstoned
  with catalog_lib.Catalog(path, store=store) as catalog:
    done = catalog.sync(describe)
    assert done.removed == (keys[1],) and done.kept == (keys[0],)
    assert catalog.keys() == [keys[0], keys[2]]


def test_a_rebuild_against_an_unmounted_store_keeps_the_catalog(synced, tmp_path):
  store, path, _ = synced
  before = _rows(path)
  _unmount(tmp_path / 'store')
  with pytest.raises(indexes.RemovalRefusedError, match='lists 0 blocks'):
    catalog_lib.Catalog.rebuild(path, store, describe)
  assert _rows(path) == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ['c.sqlite', 'store', 'store.away']


def test_a_rebuild_that_would_lose_rows_keeps_the_catalog(synced):
  store, path, keys = synced
  leave_out = lambda key, meta: None if key == keys[2] else describe(key, meta)
  with pytest.raises(indexes.RemovalRefusedError, match=f'lacks 1 rows.*{keys[2]}'):
    catalog_lib.Catalog.rebuild(path, store, leave_out)
  with catalog_lib.Catalog(path, store=store) as catalog:
    assert catalog.keys() == keys
  with catalog_lib.Catalog.rebuild(path, store, leave_out, allow_fewer_rows=True) as catalog:
    assert catalog.keys() == keys[:2]


def test_a_rebuild_drops_the_rows_of_blocks_that_are_gone(synced):
  store, path, keys = synced
  indexes.delete_block(store, keys[0])
  with catalog_lib.Catalog.rebuild(path, store, describe) as catalog:
    assert catalog.keys() == keys[1:]


@pytest.fixture
def five(tmp_path):
  """(catalog path, keys, a store at another root that holds only the first block)."""
  store = store_lib.BlockStore(tmp_path / 'store')
  keys = [store.put(make_block(i)) for i in range(5)]
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path, store=store) as catalog:
    catalog.sync(describe)
  other = store_lib.BlockStore(tmp_path / 'other')
  other.put(make_block(0))  # a mis-set root that happens to hold one of the blocks
  return path, keys, other


def test_a_sync_against_a_root_that_lists_one_of_five_blocks_removes_no_row(five):
  path, keys, other = five
  before = _rows(path)
  with catalog_lib.Catalog(path, store=other) as catalog:
    done = catalog.sync(describe)  # four keys answer absent twice: no tombstone, no evidence
    assert done.removed == () and sorted(done.kept) == sorted(keys[1:])
    assert catalog.keys() == sorted(keys)
  assert _rows(path) == before  # every row and its text


def test_a_rebuild_against_a_root_that_lists_one_of_five_blocks_keeps_the_catalog(five):
  path, keys, other = five
  before = _rows(path)
  with pytest.raises(indexes.RemovalRefusedError, match='lacks 4 rows'):
    catalog_lib.Catalog.rebuild(path, other, describe)
  assert _rows(path) == before


def test_a_block_deleted_without_a_tombstone_keeps_its_row_until_vouched_for(synced):
  store, path, keys = synced
  store.delete(keys[0])  # a plain deletion: no tombstone
  with catalog_lib.Catalog(path, store=store) as catalog:
    assert catalog.sync(describe).kept == (keys[0],) and catalog.keys() == keys
    assert catalog.sync(describe, allow_removing_all=True).removed == (keys[0],)
    assert catalog.keys() == keys[1:]


def test_a_tombstone_of_a_block_put_again_removes_nothing(synced):
  store, path, keys = synced
  indexes.delete_block(store, keys[0])
  assert store.put(make_block(0)) == keys[0]  # deposited again after its deletion
  with catalog_lib.Catalog(path, store=store) as catalog:
    done = catalog.sync(describe)
    assert done.removed == () and catalog.keys() == keys


def _racing(n):
  """A describe for each of `n` syncs that holds each one until all have read the file."""
  barrier = threading.Barrier(n, timeout=30)

  def describe_after_all(key, meta):
    barrier.wait()
    return describe(key, meta)

  return describe_after_all


def test_two_syncs_of_one_catalog_file_at_once_both_succeed(tmp_path):
  store = store_lib.BlockStore(tmp_path / 'store')
  store.put(make_block(0))
  path = tmp_path / 'c.sqlite'
  catalogs = [catalog_lib.Catalog(path, store=store) for _ in range(2)]
  both = _racing(2)
  results, errors = [], []

  def sync(catalog):
    try:
      results.append(catalog.sync(both))
    except Exception as e:  # noqa: BLE001  (reported below)
      errors.append(e)

  threads = [threading.Thread(target=sync, args=(c,)) for c in catalogs]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert errors == [] and len(results) == 2
  assert [len(r.added) for r in results] == [1, 1]  # each routes the row
  for catalog in catalogs:
    assert len(catalog) == 1 and catalog.route(results[0].added[0].text)
    catalog.close()


# --- the library ------------------------------------------------------------------------------


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return verifiers.Verdict(
    bool(words) and words[-1] in gold, words[-1] if words else None, tuple(gold), 'last_word', 1
  )


def deposit(model, library, i):
  item = tasks.Item(
    task='toy', id=f'q{i}', question=f'What is {i} plus one?', answer=str(i + 1), source='t',
    split='test',
  )  # fmt: skip
  return library.deposit(
    model,
    item=item,
    verifier=last_word,
    solution=f'{i} + 1 = {i + 1}',
    source='reference',
    tokens_spent=0,
  )


@pytest.fixture
def library(text_model, tmp_path):
  library = library_lib.Library(tmp_path / 'lib', shape=SHAPE)
  for i in range(2):
    deposit(text_model, library, i)
  library.close()
  return tmp_path / 'lib'


def test_a_library_rebuild_without_its_records_keeps_the_catalog(library):
  before = _rows(library / 'catalog.db', 'deposits')
  shutil.rmtree(library / 'records')
  with pytest.raises(indexes.RemovalRefusedError, match='lacks 2 rows.*toy/q0'):
    library_lib.Library.rebuild(library, shape=SHAPE)
  assert _rows(library / 'catalog.db', 'deposits') == before
  assert len(library_lib.Library(library, shape=SHAPE).entries()) == 2


def test_a_library_rebuild_drops_the_rows_of_blocks_that_are_gone(library):
  opened = library_lib.Library(library, shape=SHAPE)
  first, second = opened.entries()
  indexes.delete_block(opened.store, first.key)
  opened.close()
  rebuilt = library_lib.Library.rebuild(library, shape=SHAPE)
  assert rebuilt.entries() == [second] and rebuilt.rebuilt['records_without_block'] == [first.key]
  rebuilt.close()


def test_a_library_sync_against_a_root_that_lists_one_of_its_blocks_removes_no_row(library):
  with library_lib.Library(library, shape=SHAPE) as opened:
    first, second = opened.entries()
    before = _rows(library / 'catalog.db', 'deposits')
    opened.store.delete(second.key)  # a root that lists one block: no tombstone of the other
    done = opened.sync()
    assert done.removed == () and done.kept == (second.key,)
    assert opened.entries() == [first, second]
  assert _rows(library / 'catalog.db', 'deposits') == before


def test_a_record_written_over_with_another_items_bytes_is_refused_naming_both(library, tmp_path):
  records = library / 'records'
  first, second = (records / library_lib._record_name('toy', f'q{i}') for i in range(2))
  first.write_bytes(second.read_bytes())  # both digests still hold: each is a whole record
  with library_lib.Library(library, shape=SHAPE, index=tmp_path / 'fresh.db') as fresh:
    with pytest.raises(library_lib.DamagedLibraryError) as raised:
      fresh.sync()
    assert len(fresh) == 0
  message = str(raised.value)
  assert f'{first.name} holds the record of toy/q1' in message and second.name in message
  with pytest.raises(library_lib.DamagedLibraryError, match='holds the record of toy/q1'):
    library_lib.Library.rebuild(library, shape=SHAPE)


# A sync against an unmounted library and two library syncs at once: the contract tests of
# tests/graftjax/test_sqlite_index.py, which run against the library and the catalog alike.
