"""ShardedStore on object stores with racing writers and a lying server, and the guards it
shares with BlockStore (finite k/v, the payload compared under a stored key, paths, a
read-back of what it wrote). Blocks here are whole numpy arrays: process 0 writes them."""

import dataclasses
import json
import os

import numpy as np
import pytest
from store_servers import (  # noqa: F401  (the fixtures s3_server, gcs_server, bucket)
  Bucket,
  bucket_fixture,
  environment,
  gcs_server,
  gcs_spec,
  s3_server,
  s3_spec,
  unique_path,
)
from test_store import _assert_same_block, make_block
from test_store_races import _held, _in_thread, _rival

from graftjax import store as store_lib
from graftjax.store import manifest as store_manifest
from graftjax.store import sharded as sharded_store


def _sharded(bucket: Bucket, path: str, proxy=None) -> sharded_store.ShardedStore:
  url = (proxy or bucket.proxy()).url
  if bucket.kind == 's3':
    return sharded_store.ShardedStore(s3_spec(url, path))
  with environment({'TENSORSTORE_GCS_HTTP_URL': url}):
    return sharded_store.ShardedStore(gcs_spec(path))


def _objects(store, key):
  return sorted(n.decode() for n in (store._kv / f'{key}/').list().result())


def _committed(store, key):
  data = json.loads(store._kv.read(f'{key}/{store_lib.MANIFEST}').result().value)['data']
  payload = sorted(n.decode() for n in (store._kv / f'{key}/{data}/').list().result())
  return sorted([store_lib.MANIFEST, *(f'{data}/{name}' for name in payload)])


def _chunk_write(method, name):
  return method in ('PUT', 'POST') and '/k/c.' in name


@pytest.mark.subprocess
@pytest.mark.parametrize('same', [False, True], ids=['other_payload', 'same_payload'])
def test_a_slower_sharded_writer_never_touches_the_block_and_says_it_lost(bucket, same):
  """Before, the slower writer's chunks landed over the published block under `<key>/`,
  its manifest write failed silently and both writers reported success: the block failed
  its digests. Now the slower one's chunks lie under its own prefix, removed when it loses,
  and it raises ConflictingBlockError naming both payloads' digests (or, the same payload,
  returns the key)."""
  path = unique_path()
  ours = make_block(0)
  theirs = ours if same else _rival(ours)
  slow_proxy = bucket.proxy()
  slow_proxy.faults.hold = _chunk_write
  slow, fast = _sharded(bucket, path, slow_proxy), _sharded(bucket, path)
  thread, outcome = _in_thread(lambda: slow.put(ours))
  _held(slow_proxy, thread)

  key = fast.put(theirs)
  slow_proxy.faults.release.set()
  thread.join(timeout=120)

  reader = bucket.store(path)
  _assert_same_block(reader.get(key), theirs)
  reader.verify(key)
  if same:
    assert outcome == ['returned', key]
  else:
    assert outcome[0] == 'raised', outcome
    assert isinstance(outcome[1], store_lib.ConflictingBlockError), outcome
    digests = [store_manifest.payload_digest(_alone(bucket, b)) for b in (theirs, ours)]
    assert f'(stored {digests[0]} != new {digests[1]})' in str(outcome[1])
  assert _objects(fast, key) == _committed(fast, key)


def _alone(bucket, block):
  store = bucket.store(unique_path())
  return store._read(store.put(block))[0]


@pytest.mark.subprocess
def test_a_sharded_chunk_the_server_acknowledged_but_never_stored_publishes_nothing(bucket):
  """Before, the manifest was published over a payload missing a chunk."""
  path = unique_path()
  proxy = bucket.proxy()
  proxy.faults.drop = lambda method, name: name.endswith('/k/c.1.0.0.0')
  store = _sharded(bucket, path, proxy)
  block = make_block(0)
  key = store_lib.key_for(block.meta)

  with pytest.raises(store_lib.StoreIOError, match='acknowledged its write but does not hold'):
    store.put(block)

  assert proxy.faults.dropped
  assert store.list() == [] and _objects(store, key) == []
  proxy.faults.drop = None
  assert store.put(block) == key
  _assert_same_block(bucket.store(path).get(key), block)


def test_a_sharded_put_refuses_a_nan_or_infinity_before_writing(tmp_path):
  block = make_block(0)
  for bad in (np.nan, np.inf):
    k = np.asarray(block.k).copy()
    k[1, 2, 0, 3] = bad
    store = sharded_store.ShardedStore(tmp_path)
    with pytest.raises(store_lib.InvalidBlockError, match=r'k\[1, 2, 0, 3\] is .*finite'):
      store.put(dataclasses.replace(block, k=k))
  assert store.list() == []
  assert not [p for p in (tmp_path / '.tmp').rglob('*')] if (tmp_path / '.tmp').exists() else True


def test_a_sharded_put_compares_the_payload_under_a_stored_key(tmp_path):
  """Before, only the metadata was compared: another payload under the key returned it."""
  store = sharded_store.ShardedStore(tmp_path)
  block = make_block(0)
  key = store.put(block)
  assert store.put(block) == key
  stored = json.loads((tmp_path / key / store_lib.MANIFEST).read_text())
  rival = _rival(block)
  with pytest.raises(store_lib.ConflictingBlockError) as raised:
    store.put(rival)
  assert f'stored {store_manifest.payload_digest(stored)} != new' in str(raised.value)
  _assert_same_block(store_lib.BlockStore(tmp_path).get(key), block)


def test_a_sharded_put_reads_back_what_it_wrote(tmp_path, monkeypatch):
  """A value that lands other than written (here: cut short) publishes nothing."""
  write = sharded_store.write_chunk

  def cut(kv, name, data):
    write(kv, name, data[:-4] if name.endswith('k/c.1.0.0.0') else data)

  monkeypatch.setattr(sharded_store, 'write_chunk', cut)
  store = sharded_store.ShardedStore(tmp_path)
  with pytest.raises(store_lib.StoreIOError, match=r'k/c\.1\.0\.0\.0: reads back other bytes'):
    store.put(make_block(0))
  assert store.list() == [] and os.listdir(tmp_path / '.tmp') == []
  monkeypatch.setattr(sharded_store, 'write_chunk', write)
  key = store.put(make_block(0))
  _assert_same_block(store_lib.BlockStore(tmp_path).get(key), make_block(0))


def test_a_sharded_store_refuses_the_paths_block_store_refuses(tmp_path, monkeypatch):
  """A backslash (the file kvstore's separator) and a root inside a block folder; `.`-paths
  are normalised (before, each reached tensorstore as given)."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(store_lib.UnsafePathError, match='backslash'):
    sharded_store.ShardedStore('a\\b')
  assert not os.path.exists(tmp_path / 'a')
  store = sharded_store.ShardedStore('./s/../store')
  assert store.root == str(tmp_path / 'store')
  key = store.put(make_block(0))
  with pytest.raises(store_lib.UnsafePathError, match='block folder'):
    sharded_store.ShardedStore(tmp_path / 'store' / key / 'inner')
  assert store.list() == [key]


@pytest.mark.subprocess
def test_a_sharded_manifest_write_whose_answer_is_lost_and_retried_is_still_committed(bucket):
  """The retry of the manifest's write finds it there, its own: the deposit keeps its
  payload (as `BlockStore.put`, test_store_races.py)."""
  path = unique_path()
  proxy = bucket.proxy()
  lost = []

  def first_manifest_write(method, name):
    if method in ('PUT', 'POST') and name.endswith(store_lib.MANIFEST) and not lost:
      lost.append(name)
      return True
    return False

  proxy.faults.lose_answer = first_manifest_write
  block = make_block(0)
  key = _sharded(bucket, path, proxy).put(block)

  assert lost
  reader = bucket.store(path)
  _assert_same_block(reader.get(key), block)
  assert _objects(reader, key) == _committed(reader, key)
