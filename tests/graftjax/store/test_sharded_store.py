"""graftjax/store/sharded.py on one device, with compact blocks (a Gemma 3 structure's sliding
layers in k_tail, v_tail); the kv-head-split cases run in sharded_store_cases.py."""

import dataclasses
import json
import pathlib

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

CASES = pathlib.Path(__file__).with_name('sharded_store_cases.py')
PREFIX, CHUNK, CAPACITY = 24, 8, 64


def _prefilled(seed=1):
  model = sharding.shard_model(gemma_model.tiny(), sharding.make_mesh(1, 1))
  ids = np.random.default_rng(seed).integers(3, 256, PREFIX + 8)
  cache = model.init_cache(capacity=CAPACITY)
  _, cache = model.prefill(ids[:PREFIX], cache=cache, chunk_size=CHUNK, logits='none')
  fresh, cache = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  return model, ids, cache, np.asarray(fresh)


@pytest.fixture(scope='module')
def captured():
  """A compact block: the global layer whole, the sliding layers' last W - 1 rows."""
  model, ids, cache, fresh = _prefilled()
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=ids[:PREFIX],
    target=model.graft_target,
    chunk_size=CHUNK,
  )
  assert block.k_tail is not None
  return model, ids, block, fresh


@pytest.fixture(scope='module')
def every_row():
  """A block that holds every row of every layer (captured by a target naming no windows):
  the only kind a page is cut from."""
  model, ids, cache, fresh = _prefilled()
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=ids[:PREFIX],
    target=dataclasses.replace(model.graft_target, windows=()),
    chunk_size=CHUNK,
  )
  return model, ids, block, fresh


def _kv_bytes(block):
  return sum(a.nbytes for name, a in block.arrays().items() if name != 'positions')


def test_an_unsplit_block_is_written_as_block_store_writes_it(captured, tmp_path):
  _, _, block, _ = captured
  key = sharded_store.ShardedStore(tmp_path / 'sharded').put(block)
  assert store_lib.BlockStore(tmp_path / 'plain').put(block) == key
  assert store_lib.digest_tree(tmp_path / 'sharded' / key) == store_lib.digest_tree(
    tmp_path / 'plain' / key
  )
  got = store_lib.BlockStore(tmp_path / 'sharded').get(key)
  assert np.asarray(got.k).tobytes() == np.asarray(block.k).tobytes()


def test_restore_of_a_block_store_block_continues_byte_equal(captured, tmp_path):
  model, ids, block, fresh = captured
  key = store_lib.BlockStore(tmp_path).put(block)
  store = sharded_store.ShardedStore(tmp_path, read_only=True)
  cache = store.restore(
    key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  out, _ = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert np.asarray(out).tobytes() == fresh.tobytes()
  layers = model.config.num_layers
  assert store.reads.chunks == 2 * layers
  assert store.reads.bytes == _kv_bytes(block)


def test_a_memory_kvstore_publishes_the_manifest_last(captured):
  model, _, block, _ = captured
  kv = ts.KvStore.open('memory://blocks/').result()
  store = sharded_store.ShardedStore(kv)
  key = store.put(block)
  assert store.list() == [key] and key in store
  assert store.put(block) == key  # already published: left as it is
  cache = store.restore(
    key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  again = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=block.meta.token_ids,
    target=model.graft_target,
    chunk_size=CHUNK,
  )
  for name, array in block.arrays().items():
    assert np.asarray(getattr(again, name)).tobytes() == array.tobytes(), name


def test_refusals_name_the_block_and_the_cause(captured, tmp_path):
  model, _, block, _ = captured
  store = sharded_store.ShardedStore(tmp_path)
  with pytest.raises(store_lib.InvalidKeyError, match='invalid block key'):
    store.read('nope', None)
  with pytest.raises(store_lib.MissingBlockError, match='no such block'):
    store.restore(
      '0' * 64, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
    )
  with pytest.raises(store_lib.ReadOnlyStoreError, match='read-only'):
    sharded_store.ShardedStore(tmp_path, read_only=True).put(block)
  moved = block.replace(positions=np.asarray(block.positions) + 1)
  with pytest.raises(store_lib.InvalidBlockError, match='not 0 \\+ shift 0 \\+ i'):
    store.put(moved)
  halved = block.replace(k=block.k.astype('bfloat16'))
  with pytest.raises(store_lib.InvalidBlockError, match='block k is bfloat16'):
    store.put(halved)
  halved = block.replace(v_tail=block.v_tail.astype('bfloat16'))
  with pytest.raises(store_lib.InvalidBlockError, match=r'block v_tail is bfloat16\[5, 7, 1, 16\]'):
    store.put(halved)
  v_tail = np.array(block.v_tail)
  v_tail[1, 3, 0, 2] = np.nan
  with pytest.raises(store_lib.InvalidBlockError, match=r'v_tail\[1, 3, 0, 2\] is nan'):
    store.put(block.replace(v_tail=v_tail))
  assert store.list() == []
  key = store.put(block)
  other = sharding.shard_model(gemma_model.tiny(seed=1), sharding.make_mesh(1, 1))
  with pytest.raises(blocks.GraftError, match=f'{key}.*another model'):
    store.restore(
      key, other.init_cache(capacity=CAPACITY), target=other.graft_target, chunk_size=CHUNK
    )
  with pytest.raises(store_lib.InvalidBlockError, match='takes no page_layout'):
    store.put(block, page_layout=pages.page_layout(model.config, PREFIX))
  chunk = tmp_path / key / 'v_tail' / 'c.2.0.0.0'
  chunk.write_bytes(b'\0' * chunk.stat().st_size)
  with pytest.raises(store_lib.CorruptBlockError, match=r'v_tail/c\.2\.0\.0\.0: BLAKE3'):
    store.restore(
      key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
    )
  manifest = tmp_path / key / 'manifest.json'
  data = json.loads(manifest.read_text())
  paged = {**data, 'page_layout': {'rows': [[0, PREFIX]] * 5 + [[1, PREFIX]]}}
  manifest.write_text(json.dumps(paged))
  with pytest.raises(store_lib.CorruptBlockError, match='page_layout beside meta.tail_layers'):
    store.read(key, model.layout(1).block)
  data['meta']['start'] = 1
  manifest.write_text(json.dumps(data))
  with pytest.raises(store_lib.CorruptBlockError, match='metadata hashes to'):
    store.read(key, model.layout(1).block)


def _windows(model):
  return tuple(model.config.window(i) for i in range(model.config.num_layers))


def test_an_unsplit_page_is_written_as_block_store_writes_it(every_row, tmp_path):
  model, ids, block, fresh = every_row
  rows = pages.page_layout(model.config, PREFIX)
  assert rows is not None and any(first for first, _ in rows)
  store = sharded_store.ShardedStore(tmp_path / 'sharded')
  key = store.put(block, page_layout=rows)
  plain = store_lib.BlockStore(tmp_path / 'plain')
  assert plain.put(block, page_layout=rows) == key != store_lib.key_for(block.meta)
  assert store_lib.digest_tree(tmp_path / 'sharded' / key) == store_lib.digest_tree(
    tmp_path / 'plain' / key
  )
  got, layout = store.read_page(key, model.layout(1).block)
  assert layout == rows
  want, _ = plain.get_page(key)
  assert np.asarray(got.k).tobytes() == np.asarray(want.k).tobytes()
  # The page restores and continues as the block does: the query sees no dropped row.
  cache = store.restore(
    key,
    model.init_cache(capacity=CAPACITY),
    target=model.graft_target,
    windows=_windows(model),
    query_position=PREFIX,
    chunk_size=CHUNK,
  )
  out, _ = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert np.asarray(out).tobytes() == fresh.tobytes()


def test_a_page_is_checked_against_the_windows_before_it_is_grafted(every_row, tmp_path):
  model, _, block, _ = every_row
  store = sharded_store.ShardedStore(tmp_path)
  short = pages.page_layout(model.config, PREFIX, local_rows=2)  # fewer than W - 1 rows
  key = store.put(block, page_layout=short)
  cache = model.init_cache(capacity=CAPACITY)
  with pytest.raises(blocks.PageError, match="pass the model's windows"):
    store.restore(key, cache, target=model.graft_target, chunk_size=CHUNK)
  with pytest.raises(blocks.PageError):
    store.restore(
      key,
      cache,
      target=model.graft_target,
      windows=_windows(model),
      query_position=PREFIX,
      chunk_size=CHUNK,
    )
  with pytest.raises(store_lib.InvalidBlockError, match='cannot store the page'):
    store.put(block, page_layout=[(0, PREFIX)])


@pytest.mark.parametrize('name, layout', [('tiny-gemma4-31b', 'ring')])
def test_a_compact_block_of_either_local_cache_is_the_block_stores(name, layout, tmp_path):
  """A ring's block (the ring's rows) of Gemma 4 (global and sliding layers of two row
  shapes; the full-size Gemma 3 block is `captured`'s): on one device the files are the
  block store's, byte for byte, and the restored cache is the block store's restore of the
  same block, byte for byte (sharded_store_cases.py splits both local caches of both)."""
  model = sharding.shard_model(
    gemma_model.random(config_lib.get_config(name), seed=2).with_local_cache(
      layout, chunk_size=CHUNK
    ),
    sharding.make_mesh(1, 1),
  )
  ids = np.random.default_rng(3).integers(3, 256, PREFIX + 8)
  _, cache = model.prefill(
    ids[:PREFIX], cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='none'
  )
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=ids[:PREFIX],
    target=model.graft_target,
    chunk_size=CHUNK,
  )
  fresh, _ = model.prefill(
    ids[PREFIX:], cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert block.k_tail is not None
  assert (block.k.shape[2:] != block.k_tail.shape[2:]) == name.startswith('tiny-gemma4')
  store = sharded_store.ShardedStore(tmp_path / 'sharded')
  plain = store_lib.BlockStore(tmp_path / 'plain')
  key = store.put(block)
  assert plain.put(block) == key
  assert store_lib.digest_tree(tmp_path / 'sharded' / key) == store_lib.digest_tree(
    tmp_path / 'plain' / key
  )
  ours = store.restore(
    key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  theirs = restore_lib.restore(
    plain, key, model.init_cache(capacity=CAPACITY), target=model.graft_target, chunk_size=CHUNK
  )
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  out, _ = model.prefill(
    ids[PREFIX:], cache=ours, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  assert np.asarray(out).tobytes() == np.asarray(fresh).tobytes()


@pytest.mark.parametrize('rows', [2, 0])
def test_a_compact_block_cut_to_fewer_rows_restores_for_later_queries(captured, rows, tmp_path):
  """A compact block whose tail keeps 2 rows, or none (then no tail arrays), as
  `pages.to_page` cuts it: stored as it is, grafted only for a first query far enough (the
  query position reaches `graft`), as the block store restores it."""
  model, _, block, _ = captured
  cut = pages.to_page(block, model.config, local_rows=rows).block
  assert cut.meta.tail_rows == rows and (cut.k_tail is None) == (rows == 0)
  store = sharded_store.ShardedStore(tmp_path)
  key = store.put(cut)
  plain = store_lib.BlockStore(tmp_path)
  assert plain.get(key).meta == cut.meta
  cache = model.init_cache(capacity=CAPACITY)
  with pytest.raises(blocks.PageError):
    store.restore(key, cache, target=model.graft_target, chunk_size=CHUNK, query_position=PREFIX)
  far = blocks.page_exact_from(cut, cut.layout, _windows(model))
  ours = store.restore(key, cache, target=model.graft_target, chunk_size=CHUNK, query_position=far)
  theirs = restore_lib.restore(
    plain, key, cache, target=model.graft_target, chunk_size=CHUNK, query_position=far
  )
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_on_eight_host_devices(eight_host_devices):
  """Blocks and pages of a cache split over 2, 4, 8 devices: chunks along kv heads, restored
  on any split, each chunk read once; in a process started with 8 forced host devices."""
  eight_host_devices(CASES)
