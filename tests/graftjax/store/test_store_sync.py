"""Catalogs and libraries are local indexes of a store, brought up to date by `sync`.

A sync reads only the manifests (and deposit records) it has not seen, drops what the store
no longer holds, and refuses a manifest or record that does not match its block, naming both
sides. Run on `file` and on S3 (moto, store_servers.py).
"""

import dataclasses
import json

import pytest
import tensorstore as ts
from store_servers import FaultyProxy, s3_server, s3_spec, unique_path  # noqa: F401
from test_store import make_block

from graftjax import indexes
from graftjax import store as store_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import tasks
from graftjax.flywheel import verifiers
from graftjax.paging import catalog as catalog_lib

SHAPE = library_lib.Shape(capacity=128, chunk_size=16)


def describe(key, meta):
  """A routable text from the block's own metadata (what another machine can know of it)."""
  return ' '.join(f'w{t % 97}' for t in meta.token_ids[:6]), 'synced'


@pytest.fixture(params=['file', pytest.param('s3', marks=pytest.mark.subprocess)])
def spec(request, tmp_path):
  """A function: path -> a store spec on the backend (a fresh prefix each test)."""
  if request.param == 'file':
    return lambda path: str(tmp_path / path)
  server = request.getfixturevalue('s3_server')
  return lambda path: s3_spec(server.url, path)


def _raw(store):
  """The store's kvstore, to write behind its back."""
  if store._local is not None:
    return ts.KvStore.open({'driver': 'file', 'path': store._local + '/'}).result()
  return store._kv


class CountingReads:
  """Wraps `store.read_meta` and records the keys it read."""

  def __init__(self, store, monkeypatch):
    self.keys = []
    read_meta = store.read_meta

    def counted(key):
      self.keys.append(key)
      return read_meta(key)

    monkeypatch.setattr(store, 'read_meta', counted)


def test_sync_reads_only_the_manifests_of_new_blocks(spec, tmp_path, monkeypatch):
  path = unique_path()
  writer = store_lib.BlockStore(spec(path))
  first = [writer.put(make_block(i)) for i in range(3)]
  page = writer.put(make_block(3), page_layout=[(0, 3), (1, 3), (0, 3)])
  reader = store_lib.BlockStore(spec(path))
  counted = CountingReads(reader, monkeypatch)
  with catalog_lib.Catalog(tmp_path / 'c.sqlite', store=reader) as catalog:
    synced = catalog.sync(describe)
    assert sorted(counted.keys) == sorted([*first, page]) and synced.read == 4
    assert catalog.keys() == sorted([*first, page]) and synced.listed == 4
    assert catalog.get(page).page_layout == ((0, 3), (1, 3), (0, 3))
    later = [writer.put(make_block(i)) for i in range(10, 12)]
    counted.keys.clear()
    synced = catalog.sync(describe)
    assert sorted(counted.keys) == sorted(later) and synced.read == 2
    assert sorted(e.key for e in synced.added) == sorted(later) and synced.removed == ()
    counted.keys.clear()
    assert catalog.sync(describe).read == 0 and counted.keys == []
    (hit, _), *_ = catalog.route(describe(later[0], make_block(10).meta)[0])
    assert hit.key == later[0]
  with catalog_lib.Catalog(tmp_path / 'c.sqlite', store=reader) as catalog:  # reopened
    assert catalog.sync(describe).read == 0 and counted.keys == []


def test_blocks_left_out_by_describe_are_not_read_again(spec, tmp_path, monkeypatch):
  store = store_lib.BlockStore(spec(unique_path()))
  kept, left = store.put(make_block(0)), store.put(make_block(1))
  counted = CountingReads(store, monkeypatch)
  with catalog_lib.Catalog(tmp_path / 'c.sqlite', store=store) as catalog:
    assert catalog.sync(lambda key, meta: None if key == left else describe(key, meta)).read == 2
    assert catalog.keys() == [kept]
    counted.keys.clear()
    assert catalog.sync(describe).read == 0 and counted.keys == []


@pytest.mark.subprocess  # the S3 server
def test_sync_on_s3_gets_only_the_new_manifests(request, tmp_path):
  """Counted on the wire: the GETs a sync sends, through a proxy in front of the server."""
  server = request.getfixturevalue('s3_server')
  proxy = FaultyProxy(server.url)
  try:
    path = unique_path()
    writer = store_lib.BlockStore(s3_spec(server.url, path))
    reader = store_lib.BlockStore(s3_spec(proxy.url, path))
    gets = []
    proxy.faults.body = lambda url, data: gets.append(url) or data
    keys = [writer.put(make_block(i)) for i in range(3)]
    with catalog_lib.Catalog(tmp_path / 'c.sqlite', store=reader) as catalog:
      catalog.sync(describe)
      assert sorted(u for u in gets if store_lib.MANIFEST in u) == sorted(
        u for u in gets if any(k in u for k in keys)
      )
      assert len([u for u in gets if store_lib.MANIFEST in u]) == 3
      new = writer.put(make_block(7))
      gets.clear()
      catalog.sync(describe)
      manifests = [u for u in gets if store_lib.MANIFEST in u]
      assert len(manifests) == 1 and new in manifests[0]
      assert [u for u in gets if 'list-type' not in u] == manifests  # nothing else is read
      gets.clear()
      catalog.sync(describe)
      assert [u for u in gets if store_lib.MANIFEST in u] == []
  finally:
    proxy.close()


def test_a_block_deleted_with_its_tombstone_leaves_the_index_on_sync(spec, tmp_path):
  path = unique_path()
  store = store_lib.BlockStore(spec(path))
  keys = [store.put(make_block(i)) for i in range(3)]
  gone_text = describe(keys[1], make_block(1).meta)[0]
  with catalog_lib.Catalog(tmp_path / 'c.sqlite', store=store) as catalog:
    catalog.sync(describe)
    assert [e.key for e, _ in catalog.route(gone_text)] == [keys[1]]
    indexes.delete_block(store, keys[1])
    synced = catalog.sync(describe)
    assert synced.removed == (keys[1],) and synced.read == 0
    assert keys[1] not in catalog and catalog.keys() == sorted([keys[0], keys[2]])
    assert keys[1] not in [e.key for e, _ in catalog.route(gone_text, k=3)]
    store.put(make_block(1))  # deposited again: read again
    assert catalog.sync(describe).read == 1 and keys[1] in catalog
  with catalog_lib.Catalog(tmp_path / 'c.sqlite', store=store) as catalog:
    assert catalog.keys() == sorted(keys)


def test_a_tampered_manifest_is_refused_naming_both_sides(spec, tmp_path):
  store = store_lib.BlockStore(spec(unique_path()))
  good, key = store.put(make_block(0)), store.put(make_block(1))
  raw = _raw(store)
  manifest = json.loads(raw.read(f'{key}/{store_lib.MANIFEST}').result().value)
  manifest['meta']['token_ids'][0] += 1  # another block's identity, under this key
  raw.write(f'{key}/{store_lib.MANIFEST}', json.dumps(manifest).encode()).result()
  tokens = tuple(manifest['meta']['token_ids'])
  described = store_lib.key_for(dataclasses.replace(make_block(1).meta, token_ids=tokens))
  with catalog_lib.Catalog(tmp_path / 'c.sqlite', store=store) as catalog:
    with pytest.raises(store_lib.CorruptBlockError) as raised:
      catalog.sync(describe)
    assert key in str(raised.value) and described in str(raised.value)
    assert len(catalog) == 0
    with pytest.raises(store_lib.CorruptBlockError):  # nothing was kept: read again, refused
      catalog.sync(describe)
    assert catalog.keys() == [] and good not in catalog


def test_read_meta_reads_the_manifest_alone_and_names_a_missing_block(spec):
  store = store_lib.BlockStore(spec(unique_path()))
  block = make_block(4)
  key = store.put(block)
  meta, layout = store.read_meta(key)
  assert meta == block.meta and layout is None
  with pytest.raises(store_lib.MissingBlockError, match='no such block'):
    store.read_meta('0' * 64)


def test_a_rebuilt_catalog_has_seen_every_block(spec, tmp_path, monkeypatch):
  store = store_lib.BlockStore(spec(unique_path()))
  keys = [store.put(make_block(i)) for i in range(3)]
  rebuilt = catalog_lib.Catalog.rebuild(tmp_path / 'c.sqlite', store, describe)
  counted = CountingReads(store, monkeypatch)
  with rebuilt:
    assert rebuilt.keys() == sorted(keys) and rebuilt.sync(describe).read == 0
  assert counted.keys == []


def test_a_catalog_without_its_store_cannot_sync(tmp_path):
  catalog = catalog_lib.Catalog(tmp_path / 'c.sqlite')
  with catalog, pytest.raises(catalog_lib.CatalogError, match='without its store'):
    catalog.sync(describe)


# --- the library ------------------------------------------------------------------------------


def last_word(text, gold):
  words = text.replace('.', ' ').split()
  return verifiers.Verdict(
    bool(words) and words[-1] in gold, words[-1] if words else None, tuple(gold), 'last_word', 1
  )


def item(i):
  return tasks.Item(
    task='toy',
    id=f'q{i}',
    question=f'What is {i} plus one?',
    answer=str(i + 1),
    source='test',
    split='test',
  )


def deposit(model, library, i):
  return library.deposit(
    model,
    item=item(i),
    verifier=last_word,
    solution=f'{i} + 1 = {i + 1}',
    source='reference',
    tokens_spent=0,
  )


def test_a_second_library_index_syncs_only_new_records(text_model, spec, tmp_path):
  root = spec(unique_path())
  a = library_lib.Library(root, shape=SHAPE, index=tmp_path / 'a.db')
  first = [deposit(text_model, a, i) for i in range(2)]
  b = library_lib.Library(root, shape=SHAPE, index=tmp_path / 'b.db')
  assert b.entries() == []
  synced = b.sync()
  assert synced.read == 4 and sorted(synced.added, key=lambda e: e.item_id) == first
  assert b.entries() == a.entries() == first
  later = deposit(text_model, a, 5)
  synced = b.sync()
  assert synced.read == 2 and synced.added == (later,) and synced.records == 3
  assert b.sync().read == 0
  assert a.sync().read == 0  # a deposit is indexed where it was made
  assert library_lib.route_pairs(synced.added) == [(later.key, later.question)]


def test_a_library_sync_drops_rows_of_deleted_blocks(text_model, spec, tmp_path):
  root = spec(unique_path())
  a = library_lib.Library(root, shape=SHAPE, index=tmp_path / 'a.db')
  kept, gone = deposit(text_model, a, 1), deposit(text_model, a, 2)
  b = library_lib.Library(root, shape=SHAPE, index=tmp_path / 'b.db')
  b.sync()
  indexes.delete_block(a.store, gone.key)
  synced = b.sync()
  assert synced.removed == (gone,) and b.entries() == [kept]
  again = b.sync()  # its record is read again, and found without its block
  assert again.records_without_block == (library_lib._record_name('toy', 'q2'),)
  assert again.read == 1 and b.entries() == [kept]


def test_a_record_that_does_not_match_its_block_is_refused_naming_both_sides(
  text_model, spec, tmp_path
):
  root = spec(unique_path())
  a = library_lib.Library(root, shape=SHAPE, index=tmp_path / 'a.db')
  entry = deposit(text_model, a, 3)
  name = library_lib._record_name(entry.task, entry.item_id)
  forged = library_lib.Entry(**{**entry.fields(), 'tokens_sha256': 'e' * 64})
  raw = a._records.where
  if isinstance(raw, type(tmp_path)):
    (raw / name).write_bytes(library_lib._record_body(forged))
  else:
    raw.write(name, library_lib._record_body(forged)).result()
  b = library_lib.Library(root, shape=SHAPE, index=tmp_path / 'b.db')
  with pytest.raises(library_lib.BindingError) as raised:
    b.sync()
  held = indexes.tokens_sha256(a.store.read_meta(entry.key)[0].token_ids)
  assert "'eeeeeeee" in str(raised.value) and held[:20] in str(raised.value)
  assert b.entries() == []


@pytest.mark.subprocess  # the S3 server
def test_a_shared_library_needs_a_local_index(request):
  url = request.getfixturevalue('s3_server').url
  with pytest.raises(library_lib.SharedLibraryError, match='index='):
    library_lib.Library(s3_spec(url, unique_path()), shape=SHAPE)
