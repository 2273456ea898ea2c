"""ShardedStore with a cache split over kv heads, on 8 forced host devices; run by
test_sharded_store.py in a process of its own (the flag must be set before jax starts)."""

import dataclasses
import json

import jax
import numpy as np
import pytest
import tensorstore as ts

from graftjax import blocks
from graftjax.store import sharded as sharded_store
from graftjax import store as store_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import sharding
from graftjax.paging import pages

PREFIX, CONTINUATION, CHUNK, CAPACITY = 24, 16, 8, 64
HEADS = 8


@pytest.fixture(scope='module', autouse=True)
def eight_devices():
  if jax.device_count() != 8:
    pytest.fail(f'needs 8 host devices (XLA_FLAGS), found {jax.device_count()}')


@pytest.fixture(scope='module')
def base():
  return gemma_model.tiny(num_heads=HEADS, num_kv_heads=HEADS)


def _run(model):
  ids = np.random.default_rng(0).integers(3, 256, PREFIX + CONTINUATION)
  cache = model.init_cache(capacity=CAPACITY)
  _, cache = model.prefill(ids[:PREFIX], cache=cache, chunk_size=CHUNK, logits='none')
  fresh, cache = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=ids[:PREFIX],
    target=dataclasses.replace(model.graft_target, windows=()),  # every row: this store's form
    chunk_size=CHUNK,
  )
  return ids, block, np.asarray(fresh)


@pytest.mark.parametrize('ways', [2, 4, 8])
def test_chunks_follow_the_kv_head_split_and_restore_byte_equal(base, ways, tmp_path):
  model = sharding.shard_model(base, sharding.make_mesh(1, ways))
  ids, block, fresh = _run(model)
  store = sharded_store.ShardedStore(tmp_path)
  key = store.put(block)
  manifest = json.loads((tmp_path / key / 'manifest.json').read_text())
  assert manifest['format'] == sharded_store.FORMAT
  assert manifest['arrays']['k']['chunk_shape'] == [1, PREFIX, HEADS // ways, 16]
  layers = base.config.num_layers
  assert len(list((tmp_path / key / 'k').glob('c.*'))) == layers * ways
  # A zarr v3 array tensorstore opens as it is.
  k = ts.open({'driver': 'zarr3', 'kvstore': f'file://{tmp_path / key / "k"}/'}).result()
  assert list(k.chunk_layout.read_chunk.shape) == [1, PREFIX, HEADS // ways, 16]
  assert np.asarray(k.read().result()).tobytes() == np.asarray(block.k).tobytes()

  cache = store.restore(
    key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  assert store.reads.chunks == 2 * layers * ways  # each chunk once
  out, _ = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert np.asarray(out).tobytes() == fresh.tobytes()


@pytest.mark.parametrize('ways', [1, 2, 8])
def test_a_block_reads_into_another_split(base, ways, tmp_path):
  """Written from 4 devices, read into 1, 2 or 8: the same rows, each chunk read once; a graft
  there is refused, since the rows were computed under another split."""
  _, block, _ = _run(sharding.shard_model(base, sharding.make_mesh(1, 4)))
  store = sharded_store.ShardedStore(tmp_path)
  key = store.put(block)
  model = sharding.shard_model(base, sharding.make_mesh(1, ways))
  got = store.read(key, model.layout(1).block)
  assert store.reads.chunks == 2 * base.config.num_layers * 4
  assert np.asarray(got.k).tobytes() == np.asarray(block.k).tobytes()
  assert np.asarray(got.v).tobytes() == np.asarray(block.v).tobytes()
  assert {s.data.shape[2] for s in got.k.addressable_shards} == {HEADS // ways}
  with pytest.raises(blocks.GraftError, match=f'{key}.*fingerprint'):
    store.restore(
      key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
    )


def test_one_kv_head_replicated_over_the_model_axis(tmp_path):
  model = sharding.shard_model(
    gemma_model.tiny(num_heads=4, num_kv_heads=1), sharding.make_mesh(1, 4)
  )
  ids, block, fresh = _run(model)
  store = sharded_store.ShardedStore(tmp_path)
  key = store.put(block)
  # Not split: written as the block store writes it, one chunk a layer.
  assert store_lib.BlockStore(tmp_path).get(key).meta == block.meta
  cache = store.restore(
    key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  assert store.reads.chunks == 2 * model.config.num_layers  # once, not once per device
  assert cache.k.sharding.is_fully_replicated
  out, _ = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert np.asarray(out).tobytes() == fresh.tobytes()


@pytest.mark.parametrize('ways', [2, 8])
def test_a_page_is_written_and_read_in_kv_head_chunks(base, ways, tmp_path):
  """Whole layers in k, v and local tails in k_tail, v_tail, each chunked by kv heads; the
  page restores byte-equal, each of its chunks read once."""
  model = sharding.shard_model(base, sharding.make_mesh(1, ways))
  ids, block, fresh = _run(model)
  rows = pages.page_layout(model.config, PREFIX)
  whole = sum(first == 0 for first, _ in rows)
  tail = len(rows) - whole
  store = sharded_store.ShardedStore(tmp_path)
  key = store.put(block, page_layout=rows)
  manifest = json.loads((tmp_path / key / 'manifest.json').read_text())
  assert manifest['format'] == sharded_store.FORMAT
  kept = PREFIX - rows[0][0] if rows[0][0] else PREFIX - next(f for f, _ in rows if f)
  assert manifest['arrays']['k_tail']['chunk_shape'] == [1, kept, HEADS // ways, 16]
  assert len(list((tmp_path / key / 'k').glob('c.*'))) == whole * ways
  assert len(list((tmp_path / key / 'k_tail').glob('c.*'))) == tail * ways
  windows = tuple(model.config.window(i) for i in range(model.config.num_layers))
  cache = store.restore(
    key,
    model.init_cache(capacity=CAPACITY),
    target=model.graft_target,
    windows=windows,
    query_position=PREFIX,
    chunk_size=CHUNK,
  )
  assert store.reads.chunks == 2 * (whole + tail) * ways
  assert store.reads.bytes < 2 * block.k.size * block.k.dtype.itemsize  # only the kept rows
  out, _ = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert np.asarray(out).tobytes() == fresh.tobytes()
  # Read into one device: the same page as the block store's reading of the unsplit one.
  plain = store_lib.BlockStore(tmp_path / 'plain')
  want, _ = plain.get_page(plain.put(jax.device_get(block), page_layout=rows))
  got = store.read(key, sharding.shard_model(base, sharding.make_mesh(1, 1)).layout(1).block)
  assert np.asarray(got.k).tobytes() == np.asarray(want.k).tobytes()
  assert np.asarray(got.v).tobytes() == np.asarray(want.v).tobytes()


def test_a_block_stored_under_another_split_is_compared_by_its_bytes(base, tmp_path):
  """Stored from 4 devices (chunks of 2 kv heads), put again from 2 (chunks of 4): the chunk
  digests differ, so the stored bytes are read and compared; the same bytes return the key,
  other bytes under the key are ConflictingBlockError."""
  _, block, _ = _run(sharding.shard_model(base, sharding.make_mesh(1, 4)))
  store = sharded_store.ShardedStore(tmp_path)
  key = store.put(block)
  two = sharding.shard_model(base, sharding.make_mesh(1, 2)).layout(1).block
  again = jax.device_put(jax.device_get(block.k), two)
  assert store.put(dataclasses.replace(block, k=again, v=jax.device_put(block.v, two))) == key
  v = np.asarray(block.v).copy()
  v[0, 0, HEADS - 1, 0] += 1
  rival = dataclasses.replace(block, k=again, v=jax.device_put(v, two))
  with pytest.raises(store_lib.ConflictingBlockError, match='another kv-head split'):
    store.put(rival)
  manifest = json.loads((tmp_path / key / 'manifest.json').read_text())
  assert manifest['arrays']['k']['chunk_shape'][2] == HEADS // 4  # the stored one, untouched
