"""Garbage collection with a short grace racing a slow writer, on S3 (plain and versioned),
the GCS emulator and `ShardedStore`; a manifest write the server drops; gc's arguments.

Before, a deposit checked its age against half the fixed `GRACE_SECONDS` whatever grace a
collection ran with: `gc(grace_seconds=0)` while a put was between its read-back and its
manifest deleted the payload, and the put returned a key that did not read. Now a deposit
announces the prefix it is committing (`<key>/<data>/.commit`) before it reads the graces
of the collections in progress (`.gc/`), and a collection records its grace before it
lists the store and leaves announced prefixes alone.
"""

import urllib.request

import pytest
from store_servers import (  # noqa: F401  (the fixtures s3_server, gcs_server, bucket)
  Bucket,
  bucket_fixture,
  gcs_server,
  s3_server,
  s3_spec,
  unique_path,
)
from test_sharded_store_races import _sharded
from test_store import _assert_same_block, make_block
from test_store_races import _held, _in_thread

from graftjax import store as store_lib
from graftjax.store import commit as store_commit
from graftjax.store import manifest as store_manifest
from graftjax.store import sharded as sharded_store

pytestmark = pytest.mark.subprocess

_VERSIONED = 'graftjax-test-versioned'


def _manifest_write(method, name):
  return method in ('PUT', 'POST') and name.endswith(store_lib.MANIFEST)


@pytest.fixture(name='any_bucket', params=['s3', 's3-versioned', 'gcs'])
def any_bucket_fixture(request):
  """A `Bucket` on S3, on an S3 bucket with versioning on, and on GCS."""
  kind = request.param.split('-')[0]
  server = request.getfixturevalue(f'{kind}_server')
  bucket = Bucket(kind, server.url, [])
  if request.param == 's3-versioned':
    put = lambda path, data=None: urllib.request.urlopen(
      urllib.request.Request(
        server.url + path, data, {'Content-Type': 'application/xml'}, method='PUT'
      ),
      timeout=10,
    ).close()
    put(f'/{_VERSIONED}')
    put(
      f'/{_VERSIONED}?versioning',
      b'<VersioningConfiguration><Status>Enabled</Status></VersioningConfiguration>',
    )
    bucket.store = lambda path, proxy=None: store_lib.BlockStore(
      s3_spec((proxy or bucket.proxy()).url, path, bucket=_VERSIONED)
    )
    bucket.sharded = lambda path, proxy: sharded_store.ShardedStore(
      s3_spec(proxy.url, path, bucket=_VERSIONED)
    )
  else:
    bucket.sharded = lambda path, proxy: _sharded(bucket, path, proxy)
  yield bucket
  for proxy in bucket.proxies:
    proxy.close()


@pytest.mark.parametrize('how', ['BlockStore', 'ShardedStore'])
def test_a_short_grace_collection_never_takes_a_deposit_it_races(any_bucket, how):
  """The writer staged and read back its payload and is held before its manifest; a
  collection with grace 0 runs to the end; then the manifest lands. Before, the collection
  deleted the payload (1 collected) and put returned a key whose block did not read (for
  ShardedStore too, which had no check at all). Now the collection leaves the announced
  prefix alone and the block reads back exact."""
  path = unique_path()
  block = make_block(0)
  proxy = any_bucket.proxy()
  proxy.faults.hold = _manifest_write
  if how == 'BlockStore':
    writer = any_bucket.store(path, proxy)
  else:
    writer = any_bucket.sharded(path, proxy)
  thread, outcome = _in_thread(lambda: writer.put(block))
  _held(proxy, thread)
  # The staged prefix is already older than the collection's grace of 0: its id holds the
  # second it was made, rounded down.
  collector = any_bucket.store(path)

  assert collector.gc(grace_seconds=0) == 0
  proxy.faults.release.set()
  thread.join(timeout=120)

  key = store_lib.key_for(block.meta)
  assert outcome == ['returned', key], outcome
  _assert_same_block(collector.get(key), block)
  collector.verify(key)
  assert collector.gc(grace_seconds=0) == 0
  assert [n for n in _names(collector) if not n.startswith(f'{key}/')] == []
  assert not [n for n in _names(collector) if n.endswith(store_commit.INTENT)]


def test_a_deposit_made_during_a_short_grace_collection_commits_only_a_young_prefix(bucket):
  """A collection with grace 0 is in progress (its record written, its listing held):
  a deposit now may be older than half of 0 s, so it commits nothing, says why, and
  leaves nothing behind; once the collection ends, the same put commits."""
  path = unique_path()
  block = make_block(0)
  proxy = bucket.proxy()
  proxy.faults.hold = lambda method, name: method == 'GET' and name == ''  # the listing
  collector = bucket.store(path, proxy)
  thread, outcome = _in_thread(lambda: collector.gc(grace_seconds=0))
  _held(proxy, thread)
  writer = bucket.store(path)

  with pytest.raises(store_lib.StoreIOError, match='more than half the 0 s'):
    writer.put(block)
  proxy.faults.release.set()
  thread.join(timeout=120)

  assert outcome[0] == 'returned', outcome
  key = store_lib.key_for(block.meta)
  assert writer.list() == [] and key not in writer
  assert writer.put(block) == key
  _assert_same_block(writer.get(key), block)


def test_a_sharded_deposit_that_staged_for_longer_than_half_the_grace_commits_nothing(
  bucket, monkeypatch
):
  """BlockStore refused this deposit; ShardedStore committed it (no guard)."""
  path = unique_path()
  store = _sharded(bucket, path)
  monkeypatch.setattr(store_commit, 'GRACE_SECONDS', 0.0)
  block = make_block(0)
  with pytest.raises(store_lib.StoreIOError, match='more than half the 0 s'):
    store.put(block)
  key = store_lib.key_for(block.meta)
  assert store.list() == [] and not _names(bucket.store(path))
  monkeypatch.undo()
  assert store.put(block) == key


def test_a_manifest_write_the_server_drops_is_no_returned_put(bucket):
  """The server acknowledges the manifest's write and stores nothing. Before, put returned
  the key of a block that was not there. Now it reads its manifest back: StoreIOError
  naming that, nothing listed, its payloads removed."""
  path = unique_path()
  proxy = bucket.proxy()
  proxy.faults.drop = _manifest_write
  store = bucket.store(path, proxy)
  block = make_block(0)

  with pytest.raises(store_lib.StoreIOError, match='did not keep its manifest'):
    store.put(block)

  assert proxy.faults.dropped
  key = store_lib.key_for(block.meta)
  assert store.list() == [] and key not in store and not _names(store)
  proxy.faults.drop = None
  assert store.put(block) == key
  _assert_same_block(store.get(key), block)


@pytest.mark.parametrize('grace', [-1, float('-inf'), float('nan'), '60', None, True])
@pytest.mark.parametrize('root', ['memory', 'file'])
def test_gc_refuses_a_grace_that_is_not_a_number_of_seconds(grace, root, tmp_path):
  """Before, -1, -inf and NaN collected a payload staged a moment ago; '60' and None raised
  a raw TypeError."""
  store = store_lib.BlockStore('memory://' if root == 'memory' else str(tmp_path))
  young = f'{"a" * 64}/{store_manifest.new_data_id()}/k/c.0.0.0.0'
  if root == 'memory':
    store._kv.write(young, b'staged').result()
  with pytest.raises(store_lib.InvalidArgumentError, match='grace_seconds') as error:
    store.gc(grace_seconds=grace)
  assert repr(grace) in str(error.value)
  if root == 'memory':
    assert store._kv.read(young).result().value == b'staged'


def _names(store):
  return sorted(n.decode() for n in store._kv.list().result())


def test_a_sharded_store_names_a_missing_bucket_where_it_looks_for_a_key(request):
  """As `BlockStore`: `key in store` on a bucket that is not there raises, not False."""
  url = request.getfixturevalue('s3_server').url
  store = sharded_store.ShardedStore(s3_spec(url, 'p/', bucket='graftjax-absent'))
  with pytest.raises(store_lib.StoreIOError, match='NoSuchBucket'):
    'a' * 64 in store  # noqa: B015  (the lookup is what raises)
