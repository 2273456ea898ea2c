"""ShardedStore with a cache split over kv heads, on 8 forced host devices; run by
test_sharded_store.py in a process of its own (the flag must be set before jax starts).

Blocks are compact (the global layers whole in k, v; the sliding layers' last W - 1 rows in
k_tail, v_tail), captured from full-size and ring local caches of tiny Gemma 3 and Gemma 4
structures; pages are cut from a block that holds every row of every layer."""

import dataclasses
import json

import jax
import numpy as np
import pytest
import tensorstore as ts

from graftjax import blocks
from graftjax.store import sharded as sharded_store
from graftjax import store as store_lib
from graftjax import restore as restore_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import sharding
from graftjax.paging import pages

PREFIX, CONTINUATION, CHUNK, CAPACITY = 24, 16, 8, 64
HEADS = 8
KV_ARRAYS = ('k', 'v', 'k_tail', 'v_tail')


@pytest.fixture(scope='module', autouse=True)
def eight_devices():
  if jax.device_count() != 8:
    pytest.fail(f'needs 8 host devices (XLA_FLAGS), found {jax.device_count()}')


@pytest.fixture(scope='module')
def base():
  return gemma_model.tiny(num_heads=HEADS, num_kv_heads=HEADS)


def _run(model, *, every_row=False):
  """(ids, the block of the prefix, the continuation's fresh logits); with `every_row`, the
  block holds every row of every layer (a target naming no windows), as a page needs."""
  ids = np.random.default_rng(0).integers(3, 256, PREFIX + CONTINUATION)
  cache = model.init_cache(capacity=CAPACITY)
  _, cache = model.prefill(ids[:PREFIX], cache=cache, chunk_size=CHUNK, logits='none')
  block = blocks.capture(  # before the continuation: a ring drops rows as it is written
    cache,
    blocks.Span(0, PREFIX),
    token_ids=ids[:PREFIX],
    target=dataclasses.replace(model.graft_target, windows=()) if every_row else model.graft_target,
    chunk_size=CHUNK,
  )
  fresh, _ = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
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
  assert len(list((tmp_path / key / 'k').glob('c.*'))) == block.k.shape[0] * ways
  assert len(list((tmp_path / key / 'k_tail').glob('c.*'))) == block.k_tail.shape[0] * ways
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
  for name, array in block.arrays().items():
    assert np.asarray(getattr(got, name)).tobytes() == array.tobytes(), name
  assert {s.data.shape[2] for s in got.k_tail.addressable_shards} == {HEADS // ways}
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
  ids, block, fresh = _run(model, every_row=True)
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
  again = block.replace(
    **{name: jax.device_put(jax.device_get(getattr(block, name)), two) for name in KV_ARRAYS}
  )
  assert store.put(again) == key
  v_tail = np.asarray(block.v_tail).copy()
  v_tail[0, 0, HEADS - 1, 0] += 1
  rival = again.replace(v_tail=jax.device_put(v_tail, two))
  with pytest.raises(store_lib.ConflictingBlockError, match='another kv-head split'):
    store.put(rival)
  manifest = json.loads((tmp_path / key / 'manifest.json').read_text())
  assert manifest['arrays']['k']['chunk_shape'][2] == HEADS // 4  # the stored one, untouched


GEMMA4 = {'num_kv_heads': 4, 'num_global_kv_heads': 2}  # 4 sliding, 2 global kv heads


@pytest.mark.parametrize(
  'name, layout, ways',
  [
    ('tiny', 'full', 2),
    ('tiny', 'ring', 2),
    ('tiny-gemma4-31b', 'full', 2),  # every array split
    ('tiny-gemma4-31b', 'ring', 4),  # the global layer's 2 kv heads replicated over 4 devices
  ],
)
def test_a_compact_block_splits_each_array_by_its_own_kv_heads(name, layout, ways, tmp_path):
  """Gemma 3 (one row shape) and Gemma 4 (global and sliding layers of two), full-size and
  ring local caches: each of k, v, k_tail, v_tail is chunked by the kv heads a device holds
  of it; restored, the cache is BlockStore's restore of the same block byte for byte, and
  the continuation the fresh one."""
  overrides = GEMMA4 if name.startswith('tiny-gemma4') else {'num_heads': 8, 'num_kv_heads': 8}
  config = config_lib.get_config(name, **overrides)
  model = gemma_model.random(config, seed=4).with_local_cache(layout, chunk_size=CHUNK)
  model = sharding.shard_model(model, sharding.make_mesh(1, ways))
  ids, block, fresh = _run(model)
  store = sharded_store.ShardedStore(tmp_path / 'sharded')
  key = store.put(block)
  manifest = json.loads((tmp_path / 'sharded' / key / 'manifest.json').read_text())
  assert manifest['format'] == sharded_store.FORMAT
  for name_ in ('k', 'k_tail'):
    heads, width = getattr(block, name_).shape[2:]
    split = heads // ways if heads % ways == 0 else heads
    rows = getattr(block, name_).shape[1]
    assert manifest['arrays'][name_]['chunk_shape'] == [1, rows, split, width], name_
  plain = store_lib.BlockStore(tmp_path / 'plain')
  assert plain.put(jax.device_get(block)) == key
  ours = store.restore(
    key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  one_device = gemma_model.Gemma.init_cache(model, capacity=CAPACITY)  # BlockStore's restore
  theirs = restore_lib.restore(plain, key, one_device, target=model.graft_target, chunk_size=CHUNK)
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  out, _ = model.prefill(
    ids[PREFIX:], cache=ours, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert np.asarray(out).tobytes() == fresh.tobytes()
  # On an object store (memory here): the payload under the deposit's own prefix, format 5.
  memory = sharded_store.ShardedStore(ts.KvStore.open('memory://blocks/').result())
  assert memory.put(block) == key
  assert json.loads(memory._manifest_bytes(key))['format'] == sharded_store.PREFIXED_FORMAT
  again = memory.restore(
    key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(theirs), strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  # Read onto one device: the block store's block, array for array.
  one = sharding.make_mesh(1, 1)
  got = store.read(key, jax.sharding.NamedSharding(one, jax.sharding.PartitionSpec()))
  want = plain.get(key)
  for name_, array in want.arrays().items():
    assert np.asarray(getattr(got, name_)).tobytes() == array.tobytes(), name_
