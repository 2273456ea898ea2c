"""The block store on `file`, and on S3 and GCS through their local servers (store_servers.py).

The same tests run on every backend: put, get, verify, list, delete, gc, conflicting
payloads, damage, quarantine, pages and restore.
"""

import dataclasses
import json

import numpy as np
import pytest
import tensorstore as ts
from store_servers import (  # noqa: F401  (the fixtures s3_server, gcs_server)
  AWS_ENV,
  GCS_TOKEN,
  gcs_server,
  gcs_spec,
  s3_server,
  s3_spec,
  unique_path,
)
from test_store import _assert_same_block, _layer_digests, make_block

from graftjax import blocks
from graftjax import restore as restore_lib
from graftjax import store as store_lib
from graftjax.store import encode as store_encode

BACKENDS = ['file', 's3', 'gcs']
_CHUNK = 'k/c.0.0.0.0'


@dataclasses.dataclass
class Backend:
  """A way to open stores on one backend; `raw(store)` reaches its objects directly."""

  name: str
  spec: callable  # path -> tensorstore spec (or a local directory)

  def store(self, path=None, **kwargs):
    return store_lib.BlockStore(self.spec(path or unique_path()), **kwargs)

  @staticmethod
  def payload(raw, key):
    """Where the payload of the block under `key` lies in `raw` (`raw(store)`): `<key>/`, or
    the writer's prefix its manifest names (format 5, on object stores)."""
    data = json.loads(raw[f'{key}/manifest.json']).get('data')
    return f'{key}/{data}/' if data else f'{key}/'

  def raw(self, store):
    if store._local is not None:
      return ts.KvStore.open({'driver': 'file', 'path': store._local + '/'}).result()
    return store._kv


def _backend(request, tmp_path):
  if request.param == 'file':
    return Backend('file', lambda path: str(tmp_path / path))
  if request.param == 's3':
    server = request.getfixturevalue('s3_server')
    return Backend('s3', lambda path: s3_spec(server.url, path))
  request.getfixturevalue('gcs_server')
  return Backend('gcs', gcs_spec)


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
  return _backend(request, tmp_path)


@pytest.fixture(params=['s3', 'gcs'])
def remote(request, tmp_path):
  """An object store: a deposit there has no staging folder, its manifest commits it."""
  return _backend(request, tmp_path)


@pytest.fixture
def store(backend):
  return backend.store()


def _no_secret(text):
  for secret in (AWS_ENV['AWS_SECRET_ACCESS_KEY'], AWS_ENV['AWS_ACCESS_KEY_ID'], GCS_TOKEN):
    assert secret not in text


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_round_trip_list_contains_and_idempotent_put(backend, store, dtype):
  block, other = make_block(0, dtype), make_block(1, dtype)
  key = store.put(block)
  other_key = store.put(other)

  _assert_same_block(store.get(key), block)
  store.verify(key)
  assert store.list() == sorted([key, other_key])
  assert key in store and 'e' * 64 not in store
  assert store.put(make_block(0, dtype)) == key
  assert store.list() == sorted([key, other_key])
  if backend.name != 'file':
    assert store.root.startswith(f'{"gs" if backend.name == "gcs" else "s3"}://graftjax-test/')
  _no_secret(store.root)


def test_a_second_store_on_the_same_prefix_sees_the_blocks(backend):
  path = unique_path()
  writer = backend.store(path)
  key = writer.put(make_block(0))
  reader = backend.store(path, read_only=True)

  assert reader.list() == [key]
  _assert_same_block(reader.get(key), make_block(0))
  with pytest.raises(store_lib.ReadOnlyStoreError):
    reader.put(make_block(1))


def test_delete_then_put_again(store):
  kept = store.put(make_block(1))
  key = store.put(make_block(0))

  store.delete(key)

  assert store.list() == [kept]
  assert key not in store
  with pytest.raises(store_lib.MissingBlockError, match=f'{key}: no such block'):
    store.get(key)
  with pytest.raises(store_lib.MissingBlockError, match=f'{key}: no such block'):
    store.delete(key)
  assert store.put(make_block(0)) == key
  store.verify(key)


def test_gc_keeps_every_complete_block(backend, store):
  keys = sorted(store.put(make_block(seed)) for seed in range(3))

  assert store.gc() == 0  # nothing crashed here

  assert store.list() == keys
  for key in keys:
    store.verify(key)


def test_payload_without_manifest_neither_lists_nor_reads(remote):
  """What a writer killed between its payload and its manifest leaves (on `file` it is
  left in `.tmp/`, never in place: test_store.py)."""
  store = remote.store()
  block = make_block(0)
  key = store.put(block)
  raw = remote.raw(store)
  raw.delete_range(ts.KvStore.KeyRange(f'{key}/manifest.json', f'{key}/manifest.json\0')).result()

  assert store.list() == []
  assert key not in store
  with pytest.raises(store_lib.MissingBlockError, match=key):
    store.get(key)
  assert store.put(block) == key
  _assert_same_block(store.get(key), block)


def test_a_block_copied_from_an_object_store_to_a_directory_reads_there(remote, tmp_path):
  """Its objects copied as they are (`<key>/manifest.json`, `<key>/<data>/...`, as a sync
  tool copies a bucket) make a block the `file` store reads and verifies, and deduplicates
  a put of the same block against."""
  block = make_block(0)
  store = remote.store()
  key = store.put(block)
  raw = remote.raw(store)
  for name in raw.list().result():
    path = tmp_path / 'copy' / name.decode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw[name.decode()])
  local = store_lib.BlockStore(str(tmp_path / 'copy'))

  assert local.list() == [key]
  local.verify(key)
  _assert_same_block(local.get(key), block)
  assert local.put(block) == key
  with pytest.raises(store_lib.ConflictingBlockError):
    local.put(dataclasses.replace(make_block(1), meta=block.meta))


def test_a_block_of_format_4_on_an_object_store_keeps_reading(remote):
  """A block as code before format 5 wrote it on an object store (the payload beside its
  manifest, under `<key>/`) reads, verifies and deduplicates as before, with a writer's
  prefix beside it (a deposit that lost); a deletion removes its payload and not the prefix,
  which gc then collects."""
  store = remote.store()
  block = make_block(0)
  files, manifest = store_encode.block_files(block, store.root)
  key = manifest['key']
  raw = remote.raw(store)
  for name, data in files.items():
    raw[f'{key}/{name}'] = bytes(data)
  stray = f'{key}/1000000000-{"a" * 32}/k/c.0.0.0.0'
  raw[stray] = b'a lost deposit'

  assert manifest['format'] == store_lib.FORMAT and store.list() == [key]
  store.verify(key)
  _assert_same_block(store.get(key), block)
  assert store.put(block) == key
  assert json.loads(raw[f'{key}/manifest.json'])['format'] == store_lib.FORMAT  # left as it is
  with pytest.raises(store_lib.ConflictingBlockError):
    store.put(dataclasses.replace(make_block(1), meta=block.meta))
  store.delete(key)
  assert [n.decode() for n in raw.list().result()] == [stray]
  assert store.gc() == 1 and raw.list().result() == []


def test_conflicting_payload_names_the_difference_and_keeps_the_stored_block(store):
  block = make_block(0)
  key = store.put(block)
  k = np.asarray(block.k).copy()
  k[1, 0, 0, 0] += np.float32(1)
  old, new = _layer_digests(block.k), _layer_digests(k)

  with pytest.raises(store_lib.ConflictingBlockError) as error:
    store.put(dataclasses.replace(block, k=k))

  assert f"arrays.k.chunk_blake3.1: '{old[1]}' != '{new[1]}'" in str(error.value)
  assert key in str(error.value)
  _assert_same_block(store.get(key), block)


def test_flipped_byte_is_named_with_both_digests(backend, store):
  block = make_block(0, 'bfloat16')
  key = store.put(block)
  raw = backend.raw(store)
  data = bytearray(raw[backend.payload(raw, key) + _CHUNK])
  data[5] ^= 1
  raw[backend.payload(raw, key) + _CHUNK] = bytes(data)
  expected = _layer_digests(block.k)[0]

  for read in (store.verify, store.get):
    with pytest.raises(store_lib.CorruptBlockError, match=f'digest expected {expected}, found'):
      read(key)


def test_truncated_chunk_is_named_with_sizes(backend, store):
  key = store.put(make_block(0))
  raw = backend.raw(store)
  raw[backend.payload(raw, key) + _CHUNK] = raw[backend.payload(raw, key) + _CHUNK][:-4]

  with pytest.raises(store_lib.CorruptBlockError, match='holds 44 bytes, expected 48'):
    store.get(key)


def test_quarantine_sets_the_block_aside_and_frees_the_key(backend, store):
  block = make_block(0)
  key = store.put(block)
  raw = backend.raw(store)
  raw[backend.payload(raw, key) + _CHUNK] = bytes(
    len(raw[backend.payload(raw, key) + _CHUNK])
  )  # damaged: zeros

  with pytest.raises(store_lib.CorruptBlockError):
    store.put(block)
  where = store.quarantine(key)

  assert '.quarantine/' in where and key in where
  assert store.list() == []
  assert store.put(block) == key
  _assert_same_block(store.get(key), block)
  kept = [n for n in raw.list().result() if n.startswith(b'.quarantine/')]
  assert any(n.endswith(_CHUNK.encode()) for n in kept)


def test_page_round_trip_keeps_its_rows_and_layout(store):
  block = make_block(0)
  layout = ((0, 3), (1, 3), (0, 3))  # layers 0, 2 whole; the last 2 rows of layer 1
  key = store.put(block, page_layout=layout)

  got, got_layout = store.get_page(key)

  assert key == store_lib.key_for(block.meta, layout)
  assert got_layout == layout
  k = np.asarray(got.k)
  np.testing.assert_array_equal(k[[0, 2]], np.asarray(block.k)[[0, 2]])
  np.testing.assert_array_equal(k[1, 1:], np.asarray(block.k)[1, 1:])
  assert not k[1, 0].any()
  store.verify(key)


PREFIX = np.random.default_rng(2).integers(3, 256, 12).astype(np.int32)
CONT = np.random.default_rng(3).integers(3, 256, 5).astype(np.int32)
CAPACITY = 24


def test_restore_from_the_store_continues_byte_equal_to_fresh(tiny_model, store):
  _, cache = tiny_model.prefill(
    PREFIX, cache=tiny_model.init_cache(capacity=CAPACITY), chunk_size=4, logits='none'
  )
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX.size),
    token_ids=PREFIX,
    target=tiny_model.graft_target,
    chunk_size=4,
  )
  key = store.put(block)
  fresh, _ = tiny_model.prefill(
    CONT, cache=cache, chunk_size=4, start_position=PREFIX.size, logits='all'
  )

  restored = restore_lib.restore(
    store,
    key,
    tiny_model.init_cache(capacity=CAPACITY),
    target=tiny_model.graft_target,
    token_ids=PREFIX,
    chunk_size=4,
  )
  grafted, _ = tiny_model.prefill(
    CONT, cache=restored, chunk_size=4, start_position=PREFIX.size, logits='all'
  )

  assert np.asarray(grafted).tobytes() == np.asarray(fresh).tobytes()
