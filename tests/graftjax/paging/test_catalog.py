"""Catalog: sqlite entries beside the store, routed by the flywheel's routers, bound to their
blocks (token digest, own digest), rebuilt from the store, and sqlite failures named."""

import os
import sqlite3

import numpy as np
import pytest

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.paging import catalog as catalog_lib
from graftjax.routing import route as route_lib

FP = 'f' * 64
TEXTS = {
  'a' * 64: 'the json decoder scans strings and numbers',
  'b' * 64: 'a heap queue keeps the smallest item first',
  'c' * 64: 'the tar archive reader walks member headers',
}


def _fill(catalog):
  for i, (key, text) in enumerate(TEXTS.items()):
    catalog.add(
      key,
      text,
      source=f'file{i}.py',
      n_tokens=10 + i,
      model_fingerprint=FP,
      dtype='bfloat16',
      page_layout=((0, 10), (3, 10)) if i == 0 else None,
      token_ids=range(10 + i),
    )


def test_route_returns_catalogued_entries(tmp_path):
  with catalog_lib.Catalog(tmp_path / 'c.sqlite') as catalog:
    _fill(catalog)
    (entry, score), *_ = catalog.route('how does the json decoder scan strings', k=2)
    assert entry.key == 'a' * 64 and entry.source == 'file0.py' and score > 0
    assert entry.page_layout == ((0, 10), (3, 10))
    assert len(catalog) == 3


def test_catalog_persists_and_reopens_with_its_router(tmp_path):
  store = store_lib.BlockStore(tmp_path / 'store')
  path = os.path.join(store.root, catalog_lib.FILENAME)  # the keys are not the store's
  with catalog_lib.Catalog(path) as catalog:
    _fill(catalog)
  assert store.list() == []  # the store does not see the catalog file
  with catalog_lib.Catalog(path, router=route_lib.ExactRouter()) as catalog:
    assert catalog.keys() == sorted(TEXTS)
    hits = catalog.route('A heap queue keeps the smallest item first.')
    assert [e.key for e, _ in hits] == ['b' * 64]
    assert catalog.get('c' * 64).n_tokens == 12


def test_same_entry_twice_is_a_no_op_and_a_conflict_is_refused(tmp_path):
  with catalog_lib.Catalog(':memory:') as catalog:
    _fill(catalog)
    key, text = next(iter(TEXTS.items()))
    layout = ((0, 10), (3, 10))
    assert not catalog.add(
      key,
      text,
      source='file0.py',
      n_tokens=10,
      model_fingerprint=FP,
      dtype='bfloat16',
      page_layout=layout,
      token_ids=range(10),
    )
    with pytest.raises(catalog_lib.CatalogError, match='other values'):
      catalog.add(
        key,
        text,
        source='elsewhere.py',
        n_tokens=10,
        model_fingerprint=FP,
        dtype='bfloat16',
        token_ids=range(10),
      )
    assert len(catalog) == 3 and len(catalog.router) == 3
    with pytest.raises(catalog_lib.CatalogError, match='not catalogued'):
      catalog.get('d' * 64)


@pytest.mark.parametrize('text, n_tokens', [('...', 5), ('a real text', 0)])
def test_a_refused_entry_leaves_the_catalog_openable(tmp_path, text, n_tokens):
  """Rows used to be committed before the router refused the text: the catalog never reopened."""
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path) as catalog:
    with pytest.raises(catalog_lib.CatalogError):
      catalog.add(
        'd' * 64,
        text,
        source='x',
        n_tokens=n_tokens,
        model_fingerprint=FP,
        dtype='float32',
        token_ids=[1],
      )
    assert len(catalog) == 0
  with catalog_lib.Catalog(path) as reopened:
    assert len(reopened) == 0


# --- bound to the store ------------------------------------------------------------------------

WORDS = ['json decoder strings', 'heap queue smallest', 'tar archive headers']


def _block(seed: int, n: int = 6) -> blocks.KVBlock:
  """A small finite block of `n` tokens at its own positions."""
  rng = np.random.default_rng(seed)
  meta = blocks.BlockMeta(
    model_fingerprint=FP,
    token_ids=tuple(int(t) for t in rng.integers(3, 1000, n)),
    start=0,
    dtype='float32',
    position_scheme='rope',
    capacity=64,
  )
  k, v = (rng.standard_normal((2, n, 1, 4)).astype(np.float32) for _ in range(2))
  return blocks.KVBlock(k=k, v=v, positions=np.arange(n, dtype=np.int32), meta=meta)


@pytest.fixture
def stored(tmp_path):
  """A store of three blocks and its catalog beside it: (store, {key: block})."""
  store = store_lib.BlockStore(tmp_path / 'store')
  put = {}
  for seed in range(3):
    block = _block(seed)
    put[store.put(block)] = block
  with catalog_lib.Catalog.beside(store) as catalog:
    for (key, block), words in zip(put.items(), WORDS):
      catalog.add(
        key, words, source=words.split()[0], n_tokens=6, model_fingerprint=FP, dtype='float32'
      )
  return store, put


def _describe(catalog_entries):
  by_key = {e.key: (e.text, e.source) for e in catalog_entries}
  return lambda key, meta: by_key.get(key)


def test_entries_added_beside_the_store_take_their_token_digest_from_it(stored):
  store, put = stored
  with catalog_lib.Catalog.beside(store) as catalog:
    for key, block in put.items():
      assert catalog.get(key).tokens_sha256 == catalog_lib.tokens_sha256(block.meta.token_ids)


@pytest.mark.parametrize(
  'claim, match',
  [
    ({'token_ids': [1, 2, 3, 4, 5, 6]}, 'tokens_sha256'),
    ({'n_tokens': 7}, 'n_tokens'),
    ({'model_fingerprint': 'e' * 64}, 'model_fingerprint'),
    ({'dtype': 'bfloat16'}, 'dtype'),
    ({'page_layout': ((0, 6), (3, 6))}, 'page layout'),
  ],
)
def test_an_entry_that_lies_about_its_block_is_refused_naming_both(stored, claim, match):
  store, put = stored
  key = next(iter(put))
  fields = {'source': 'x', 'n_tokens': 6, 'model_fingerprint': FP, 'dtype': 'float32', **claim}
  with catalog_lib.Catalog(store.root + '/other.sqlite', store=store) as catalog:
    with pytest.raises(catalog_lib.BindingError, match=match) as raised:
      catalog.add(key, 'some text', **fields)
    assert key[:12] in str(raised.value)
    assert len(catalog) == 0
  no_store = catalog_lib.Catalog(':memory:')  # no store: the token ids are required
  with no_store as catalog, pytest.raises(catalog_lib.CatalogError, match='no token ids'):
    catalog.add('d' * 64, 'text', source='x', n_tokens=1, model_fingerprint=FP, dtype='float32')


def _swap_keys(path, a, b):
  db = sqlite3.connect(path)
  with db:
    db.execute('UPDATE pages SET key = ? WHERE key = ?', ('0' * 64, a))
    db.execute('UPDATE pages SET key = ? WHERE key = ?', (a, b))
    db.execute('UPDATE pages SET key = ? WHERE key = ?', (b, '0' * 64))
  db.close()


def test_rows_with_swapped_keys_are_refused(stored):
  """Two rows with swapped keys used to route each text to the other's block."""
  store, put = stored
  a, b, _ = put
  path = os.path.join(store.root, catalog_lib.FILENAME)
  _swap_keys(path, a, b)
  with pytest.raises(catalog_lib.DamagedCatalogError, match='own digest'):
    catalog_lib.Catalog.beside(store)


def test_a_flipped_byte_in_a_row_is_refused(tmp_path):
  """A row's text edited in place went unnoticed (and was routed by)."""
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path) as catalog:
    _fill(catalog)
  db = sqlite3.connect(path)
  with db:
    db.execute("UPDATE pages SET text = 'the json decoder scans strings and numberz'")
  db.close()
  with pytest.raises(catalog_lib.DamagedCatalogError, match='own digest.*rebuild'):
    catalog_lib.Catalog(path)


def test_a_row_with_nothing_to_route_by_leaves_the_catalog_openable(tmp_path):
  """One row of empty text (written by another writer) made the whole catalog unopenable."""
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path) as catalog:
    _fill(catalog)
  entry = catalog_lib.Entry('d' * 64, '...', 'x', 3, None, FP, 'float32', 'e' * 64)
  db = sqlite3.connect(path)
  with db:
    db.execute(f'INSERT INTO pages VALUES ({",".join("?" * 9)})', entry.row())
  db.close()
  with catalog_lib.Catalog(path) as catalog:
    assert len(catalog) == 4 and catalog.unroutable == ['d' * 64]
    assert catalog.get('d' * 64) == entry
    assert catalog.route('json decoder', k=4)[0][0].key == 'a' * 64


@pytest.mark.parametrize('damage', ['empty', 'garbage'])
def test_a_damaged_catalog_beside_a_store_is_an_error_then_rebuilt(stored, damage):
  store, _ = stored
  path = os.path.join(store.root, catalog_lib.FILENAME)
  with catalog_lib.Catalog.beside(store) as catalog:
    before = catalog.entries()
  for suffix in ('-wal', '-shm'):
    if os.path.exists(path + suffix):
      os.remove(path + suffix)
  with open(path, 'wb') as f:
    f.write(b'' if damage == 'empty' else b'not a database, ' * 512)
  expected = (
    (catalog_lib.DamagedCatalogError, '0 bytes.*rebuild')
    if damage == 'empty'
    else (catalog_lib.CatalogFileError, 'corrupt.*rebuild')
  )
  with pytest.raises(expected[0], match=expected[1]):
    catalog_lib.Catalog.beside(store)
  with catalog_lib.Catalog.rebuild(path, store, _describe(before)) as rebuilt:
    assert rebuilt.entries() == before
    assert rebuilt.route('tar archive headers')[0][0].source == 'tar'
  with catalog_lib.Catalog.beside(store) as reopened:
    assert reopened.entries() == before


def test_rebuild_leaves_out_what_describe_leaves_out(stored, tmp_path):
  store, put = stored
  first = next(iter(put))
  describe = lambda key, meta: ('only this one', 'src') if key == first else None
  with catalog_lib.Catalog.rebuild(tmp_path / 'new.sqlite', store, describe) as rebuilt:
    assert rebuilt.keys() == [first]
    assert rebuilt.get(first).n_tokens == 6 and rebuilt.get(first).page_layout is None


def test_an_empty_file_beside_an_empty_store_is_a_new_catalog(tmp_path):
  store = store_lib.BlockStore(tmp_path / 'store')
  open(os.path.join(store.root, catalog_lib.FILENAME), 'wb').close()
  with catalog_lib.Catalog.beside(store) as catalog:
    assert len(catalog) == 0


def test_an_older_schema_is_named(tmp_path):
  path = tmp_path / 'old.sqlite'
  db = sqlite3.connect(path)
  db.execute('CREATE TABLE pages (key TEXT PRIMARY KEY, text TEXT NOT NULL)')
  db.close()
  with pytest.raises(catalog_lib.DamagedCatalogError, match='schema version 0'):
    catalog_lib.Catalog(path)


# --- sqlite failures ---------------------------------------------------------------------------


def _entry(i: int) -> dict:
  return {
    'source': f's{i}',
    'n_tokens': 1,
    'model_fingerprint': FP,
    'dtype': 'float32',
    'token_ids': [i],
  }


def test_a_locked_catalog_is_named(tmp_path):
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path, timeout=0.05) as catalog:
    other = sqlite3.connect(path, isolation_level=None)
    other.execute('BEGIN IMMEDIATE')
    try:
      with pytest.raises(catalog_lib.CatalogFileError, match='locked by another connection'):
        catalog.add('d' * 64, 'a text', **_entry(1))
    finally:
      other.execute('ROLLBACK')
      other.close()
    assert catalog.add('d' * 64, 'a text', **_entry(1))  # free again


def test_a_full_disk_is_named_and_leaves_the_catalog_as_it_was(tmp_path):
  """sqlite's own limit on the file's pages fails writes as a full disk does (SQLITE_FULL)."""
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path) as catalog:
    _fill(catalog)
    pages = catalog._db.execute('PRAGMA page_count').fetchone()[0]
    catalog._db.execute(f'PRAGMA max_page_count = {pages}')
    big = [(f'{i:064x}', 'word ' * 20_000) for i in range(4)]
    with pytest.raises(catalog_lib.CatalogFileError, match='disk is full') as raised:
      catalog.add_many(
        catalog_lib.Entry(key, text, 's', 1, None, FP, 'float32', 'e' * 64) for key, text in big
      )
    assert 'rollback' not in str(raised.value).lower()
    assert len(catalog) == 3 and len(catalog.router) == 3
    assert catalog.keys() == sorted(TEXTS)


class _FullDisk:
  """A connection whose INSERTs fail as sqlite fails on a full disk, rolling back first."""

  def __init__(self, db):
    self._db = db

  def __getattr__(self, name):
    return getattr(self._db, name)

  def execute(self, statement, *args):
    if statement.startswith('INSERT'):
      self._db.execute('ROLLBACK')  # sqlite may roll the transaction back itself on SQLITE_FULL
      raise sqlite3.OperationalError('database or disk is full')
    return self._db.execute(statement, *args)


def test_a_full_disk_is_not_hidden_by_a_failing_rollback(tmp_path):
  """The catalog's own ROLLBACK failed after sqlite had rolled back, hiding the full disk."""
  with catalog_lib.Catalog(tmp_path / 'c.sqlite') as catalog:
    catalog._db = _FullDisk(catalog._db)
    with pytest.raises(catalog_lib.CatalogFileError, match='disk is full') as raised:
      _fill(catalog)
    assert 'rollback' not in str(raised.value).lower()
    catalog._db = catalog._db._db
    assert len(catalog) == 0 and len(catalog.router) == 0


@pytest.mark.parametrize(
  'change',
  [
    {'page_layout': [(1,)]},
    {'page_layout': 'rows'},
    {'n_tokens': 'ten'},
    {'n_tokens': 2.5},
    {'token_ids': [None]},
    {'source': None},
    {'text': 7},
  ],
)
def test_malformed_entries_are_catalog_errors(change):
  fields = {'text': 'a real text', **_entry(1), **change}
  with catalog_lib.Catalog(':memory:') as catalog:
    with pytest.raises(catalog_lib.CatalogError):
      catalog.add('d' * 64, **fields)
    assert len(catalog) == 0


def test_a_deeply_nested_layout_in_a_row_is_a_damaged_catalog(tmp_path):
  path = tmp_path / 'c.sqlite'
  with catalog_lib.Catalog(path) as catalog:
    _fill(catalog)
  db = sqlite3.connect(path)
  with db:
    db.execute('UPDATE pages SET page_layout = ?', ('[' * 100_000 + ']' * 100_000,))
  db.close()
  with pytest.raises(catalog_lib.DamagedCatalogError, match='malformed'):
    catalog_lib.Catalog(path)
