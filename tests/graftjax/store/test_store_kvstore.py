"""graftjax.store on tensorstore kvstores other than `file`, and zarr.json bytes."""

import dataclasses
import json

import pytest
import tensorstore as ts
from test_store import _assert_same_block, make_block

from graftjax import store as store_lib
from graftjax.store import chunks as store_chunks
from graftjax.store import kvstore as store_kvstore


@pytest.fixture
def kv():
  return ts.KvStore.open({'driver': 'memory', 'path': 'blocks/'}).result()


@pytest.fixture
def store(kv):
  return store_lib.BlockStore(kv)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_memory_round_trip_list_and_delete(store, kv, dtype):
  block = make_block(0, dtype)
  key = store.put(block)
  other = store.put(make_block(1, dtype))

  assert store.root == 'memory://blocks/'
  _assert_same_block(store.get(key), block)
  assert store.list() == sorted([key, other])
  assert key in store
  assert store.put(block) == key
  # The files of `file`, the payload under the prefix its manifest names (format 5).
  names = sorted(n.decode() for n in kv.list().result() if n.startswith(key.encode()))
  data = json.loads(kv[f'{key}/manifest.json'])['data']
  assert names[0] == f'{key}/{data}/k/c.0.0.0.0' and f'{key}/manifest.json' in names

  store.delete(key)
  assert store.list() == [other]
  assert not [n for n in kv.list().result() if n.startswith(key.encode())]
  with pytest.raises(store_lib.MissingBlockError, match=f'memory://blocks/{key}: no such block'):
    store.get(key)
  with pytest.raises(store_lib.MissingBlockError):
    store.delete(key)
  assert store.gc() == 0


def test_memory_flipped_byte_is_named(store, kv):
  block = make_block(0)
  key = store.put(block)
  name = f'{key}/{json.loads(kv[f"{key}/manifest.json"])["data"]}/v/c.1.0.0.0'
  data = bytearray(kv[name])
  data[3] ^= 1
  kv[name] = bytes(data)

  with pytest.raises(store_lib.CorruptBlockError, match=r"array 'v' layer 1 .*digest expected"):
    store.verify(key)


def test_memory_payload_without_manifest_is_invisible_and_redeposited(store, kv):
  block = make_block(0)
  key = store.put(block)
  del kv[f'{key}/manifest.json']  # as a deposit that failed before its manifest

  assert store.list() == []
  assert key not in store
  with pytest.raises(store_lib.MissingBlockError, match=f'{key}: no such block'):
    store.get(key)
  assert store.put(block) == key
  _assert_same_block(store.get(key), block)


@pytest.mark.parametrize('winner_seed', [0, 1])
def test_memory_manifest_is_written_only_if_absent(store, monkeypatch, winner_seed):
  """A rival publishes the key between our payload and our manifest."""
  mine = make_block(0)
  winner = dataclasses.replace(make_block(winner_seed), meta=mine.meta)
  rival = store_lib.BlockStore(store._kv)
  write_files = store_kvstore.write_files
  raced = []

  def rival_first(kv, files):
    write_files(kv, files)
    if not raced and 'manifest.json' not in files:
      raced.append(True)
      rival.put(winner)

  monkeypatch.setattr(store_kvstore, 'write_files', rival_first)

  if winner_seed == 0:
    assert store.put(mine) == store_lib.key_for(mine.meta)
    _assert_same_block(store.get(store_lib.key_for(mine.meta)), winner)
  else:
    # Our payload overwrote the rival's before its manifest won: refused, never silent.
    with pytest.raises((store_lib.ConflictingBlockError, store_lib.CorruptBlockError)):
      store.put(mine)
  assert raced


def test_threads_depositing_into_one_memory_store_lose_nothing(store):
  import concurrent.futures

  seeds = list(range(12)) * 2
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    keys = list(pool.map(lambda s: store.put(make_block(s)), seeds))
  assert store.list() == sorted(set(keys))
  for seed in set(seeds):
    _assert_same_block(store.get(store_lib.key_for(make_block(seed).meta)), make_block(seed))


def test_read_only_memory_store_refuses_writes(kv):
  key = store_lib.BlockStore(kv).put(make_block(0))
  reader = store_lib.BlockStore(kv, read_only=True)

  assert reader.list() == [key]
  reader.verify(key)
  with pytest.raises(store_lib.ReadOnlyStoreError, match='memory://blocks/: .*read-only'):
    reader.put(make_block(1))


@pytest.mark.parametrize(
  'root, driver',
  [
    ({'driver': 'nosuchdriver', 'path': 'x/'}, 'nosuchdriver'),
    ('nosuchdriver://bucket/x/', 'nosuchdriver'),
  ],
)
def test_unknown_kvstore_driver_is_named(root, driver):
  with pytest.raises(
    store_lib.UnknownDriverError, match=f"unknown tensorstore kvstore driver '{driver}'"
  ):
    store_lib.BlockStore(root)


def test_file_url_and_spec_open_the_same_directory(tmp_path):
  key = store_lib.BlockStore(tmp_path).put(make_block(0))

  for root in (f'file://{tmp_path}/', {'driver': 'file', 'path': str(tmp_path)}):
    store = store_lib.BlockStore(root)
    assert store.root == str(tmp_path)
    assert store.list() == [key]
    store.verify(key)


@pytest.mark.parametrize('separator', ['.', '/'])
@pytest.mark.parametrize(
  'name, dtype, shape',
  [('k', 'float32', [2, 3, 1, 4]), ('v', 'bfloat16', [2, 3, 1, 4]), ('positions', 'int32', [3])],
)
def test_zarr_json_is_byte_for_byte_what_tensorstore_writes(name, dtype, shape, separator):
  context = ts.Context()
  metadata = store_chunks.zarr_metadata(name, dtype, shape, separator=separator)
  ts.open(
    {'driver': 'zarr3', 'kvstore': {'driver': 'memory'}, 'metadata': metadata},
    create=True,
    context=context,
  ).result()
  written = ts.KvStore.open({'driver': 'memory'}, context=context).result()[b'zarr.json']

  assert store_chunks.zarr_json(name, dtype, shape, separator=separator) == written
  assert json.loads(written) == metadata
