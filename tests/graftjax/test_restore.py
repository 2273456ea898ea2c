"""restore: read, verify and graft in one call; any failure leaves the cache as it was."""

import os

import jax
import numpy as np
import pytest

from graftjax import blocks
from graftjax import restore as restore_lib
from graftjax import store as store_lib
from graftjax.paging import pages

PREFIX = np.random.default_rng(2).integers(3, 256, 12).astype(np.int32)
CONT = np.random.default_rng(3).integers(3, 256, 5).astype(np.int32)
CAPACITY = 24


@pytest.fixture
def deposited(tiny_model, tmp_path):
  """(store, key, fresh continuation logits) of PREFIX's block."""
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
  store = store_lib.BlockStore(tmp_path / 'store')
  key = store.put(block)
  fresh, _ = continued(tiny_model, cache)
  return store, key, np.asarray(fresh)


def continued(model, cache):
  return model.prefill(CONT, cache=cache, chunk_size=4, start_position=PREFIX.size, logits='all')


def snapshot(cache):
  return {
    name: np.asarray(getattr(cache, name)).copy()
    for name in ('k', 'v', 'positions', 'segments', 'length')
  }


@pytest.mark.slow
@pytest.mark.parametrize('donate', [False, True])
def test_restore_then_continue_is_byte_equal_to_fresh(tiny_model, deposited, donate):
  store, key, fresh = deposited
  cache = restore_lib.restore(
    store,
    key,
    tiny_model.init_cache(capacity=CAPACITY),
    target=tiny_model.graft_target,
    token_ids=PREFIX,
    donate=donate,
    chunk_size=4,
  )
  assert int(cache.length) == PREFIX.size
  grafted, _ = continued(tiny_model, cache)
  assert np.asarray(grafted).tobytes() == fresh.tobytes()


def _corrupt(store, key):
  chunk = os.path.join(store.root, key, 'v_tail', 'c.2.0.0.0')  # layer 2's last W - 1 rows
  data = bytearray(open(chunk, 'rb').read())
  data[5] ^= 1
  with open(chunk, 'wb') as f:
    f.write(data)


@pytest.mark.parametrize('donate', [False, True])
@pytest.mark.parametrize(
  'damage, error',
  [
    (lambda store, key: store.delete(key), store_lib.MissingBlockError),
    (_corrupt, store_lib.CorruptBlockError),
  ],
)
def test_missing_or_corrupt_block_raises_and_leaves_the_cache(
  tiny_model, deposited, damage, error, donate
):
  store, key, _ = deposited
  damage(store, key)
  cache = tiny_model.init_cache(capacity=CAPACITY)
  before = snapshot(cache)
  with pytest.raises(error, match=key):
    restore_lib.restore(
      store, key, cache, target=tiny_model.graft_target, donate=donate, chunk_size=4
    )
  assert not cache.k.is_deleted()
  after = snapshot(cache)
  assert all(after[name].tobytes() == before[name].tobytes() for name in before)


def test_restore_refuses_other_tokens_and_other_models(tiny_model, deposited):
  store, key, _ = deposited
  cache = tiny_model.init_cache(capacity=CAPACITY)
  with pytest.raises(blocks.GraftError, match='other tokens'):
    restore_lib.restore(
      store,
      key,
      cache,
      target=tiny_model.graft_target,
      token_ids=PREFIX[::-1],
      donate=True,
      chunk_size=4,
    )
  other = tiny_model.with_position_scheme('alibi')
  with pytest.raises(blocks.GraftError, match='position scheme'):
    restore_lib.restore(store, key, cache, target=other.graft_target, donate=True, chunk_size=4)
  assert not cache.k.is_deleted() and int(cache.length) == 0


def _grafted(model, store, key, capacity, **kwargs):
  """The cache `blocks.graft` builds from the stored block (the reference for a restore)."""
  kwargs.setdefault('chunk_size', 4)
  return blocks.graft(
    model.init_cache(capacity=capacity), store.get(key), target=model.graft_target, **kwargs
  )


def test_one_staging_restores_blocks_of_other_sizes_as_graft_does(tiny_model, deposited):
  store, key, _ = deposited
  longer = np.random.default_rng(4).integers(3, 256, 20).astype(np.int32)
  _, cache = tiny_model.prefill(
    longer, cache=tiny_model.init_cache(capacity=CAPACITY), chunk_size=4, logits='none'
  )
  other = store.put(
    blocks.capture(
      cache,
      blocks.Span(0, longer.size),
      token_ids=longer,
      target=tiny_model.graft_target,
      chunk_size=4,
    )
  )
  staging = restore_lib.Staging()
  assert staging.memory == ('host' if jax.default_backend() == 'cpu' else 'pinned_host')
  for k in (key, other, key):  # the staging's buffers change shape and are reused
    restored = restore_lib.restore(
      store, k, tiny_model.init_cache(capacity=CAPACITY), target=tiny_model.graft_target,
      staging=staging, donate=True, chunk_size=4,
    )  # fmt: skip
    want = snapshot(_grafted(tiny_model, store, k, CAPACITY))
    got = snapshot(restored)
    assert all(got[name].tobytes() == want[name].tobytes() for name in want), k


def test_install_into_a_smaller_cache_than_read_was_told(tiny_model, deposited):
  store, key, _ = deposited
  staged = restore_lib.read(store, key, restore_lib.Staging(), capacity=64)
  assert staged.rows['k'] == 64  # PREFIX.size rounded up to blocks.INSTALL_BUCKET
  cache = restore_lib.install(
    tiny_model.init_cache(capacity=CAPACITY),
    staged,
    target=tiny_model.graft_target,
    allow_other_shape=True,
    chunk_size=4,
  )
  want = snapshot(_grafted(tiny_model, store, key, CAPACITY, allow_other_shape=True))
  got = snapshot(cache)
  assert all(got[name].tobytes() == want[name].tobytes() for name in want)


@pytest.mark.parametrize(
  'case',
  ['shifted', 'past capacity', 'overlap', 'other shape', 'other chunk size', 'no chunk size'],
)
def test_restore_refuses_what_graft_refuses_with_its_words(tiny_model, deposited, case):
  store, key, _ = deposited
  block, capacity, kwargs = store.get(key), CAPACITY, {}
  assert block.meta.chunk_size == 4
  if case == 'other chunk size':
    kwargs['chunk_size'] = 2
  if case != 'no chunk size':  # the caller passes none: refused too (XLA kernels)
    kwargs.setdefault('chunk_size', 4)
  if case == 'shifted':
    block = blocks.relocate(block, 3, model=tiny_model)
    key = store.put(block)
  if case == 'past capacity':
    capacity = PREFIX.size - 1
    kwargs['allow_other_shape'] = True
  if case == 'other shape':
    capacity = CAPACITY + 8
  cache = tiny_model.init_cache(capacity=capacity)
  if case == 'overlap':
    _, cache = tiny_model.prefill(PREFIX[:2], cache=cache, chunk_size=2, logits='none')
  with pytest.raises(blocks.GraftError) as graft_error:
    blocks.graft(cache, block, target=tiny_model.graft_target, **kwargs)
  with pytest.raises(blocks.GraftError) as restore_error:
    restore_lib.restore(
      store, key, cache, target=tiny_model.graft_target, staging=restore_lib.Staging(), **kwargs
    )
  assert str(restore_error.value) == str(graft_error.value)


def test_staging_zeroes_a_pages_dropped_rows_over_stale_bytes(tiny_model, tmp_path):
  """A page read into buffers that held a block reads back as `store.get` gives it."""
  ids = np.random.default_rng(5).integers(3, 256, 20).astype(np.int32)
  _, cache = tiny_model.prefill(
    ids, cache=tiny_model.init_cache(capacity=CAPACITY), chunk_size=4, logits='none'
  )
  block = blocks.capture(
    cache, blocks.Span(0, ids.size), token_ids=ids, target=tiny_model.graft_target, chunk_size=4
  )
  page = pages.to_page(block, tiny_model.config, local_rows=4)
  assert (page.block.meta.tail_rows, page.layout) == (4, None)
  store = store_lib.BlockStore(tmp_path / 'store')
  staging = restore_lib.Staging()
  restore_lib.read(store, store.put(block), staging, capacity=CAPACITY)  # fills every row
  staged = restore_lib.read(store, pages.put(store, page), staging, capacity=CAPACITY)
  assert staged.layout is None
  for name in ('k', 'v', 'k_tail', 'v_tail', 'positions'):
    assert (
      np.asarray(getattr(staged.block, name)).tobytes()
      == np.asarray(getattr(page.block, name)).tobytes()
    )


def test_staging_refuses_pinned_memory_on_cpu():
  if jax.default_backend() != 'cpu':
    pytest.skip(f'{jax.devices()[0]} offers pinned_host memory: nothing to refuse here')
  with pytest.raises(ValueError, match='offers no pinned_host memory'):
    restore_lib.Staging(memory='pinned_host')
  with pytest.raises(ValueError, match='memory must be'):
    restore_lib.Staging(memory='gpu')


def test_a_pinned_host_array_moves_to_device_memory_as_written_through_its_view():
  """The H200 path's two steps, on CPU (which offers pinned_host memory too): bytes written
  through the host view arrive, and the move names the device memory kind (jax refuses
  `device_put(pinned, device)`: that is how the first H200 run failed)."""
  device = jax.devices()[0]
  view, pinned = restore_lib._make_buffer((4, 8), np.dtype(np.float32), device)
  view[:] = np.arange(32, dtype=np.float32).reshape(4, 8)
  moved = jax.device_put(pinned, restore_lib.device_memory(device))
  assert moved.sharding.memory_kind == 'device'
  assert np.asarray(moved).tobytes() == np.arange(32, dtype=np.float32).tobytes()
  assert restore_lib._pinned_view_works(device)


def _reported(store, key):
  verified = []
  store.get_page(key, on_verified=lambda name, stop: verified.append((name, stop)))
  return verified


@pytest.mark.parametrize('copy_bytes', [1, 1 << 40])
def test_read_copies_layers_of_k_and_v_to_the_device_as_they_verify(
  tiny_model, deposited, monkeypatch, copy_bytes
):
  """Layer by layer (a copy per layer at copy_bytes=1), or whole arrays: the same bytes."""
  store, key, _ = deposited
  arrays = store.get(key).arrays()
  layers = {name: a.shape[0] for name, a in arrays.items() if name != 'positions'}
  assert _reported(store, key) == [
    ('positions', None),
    *[(name, i + 1) for name in ('k', 'v', 'k_tail', 'v_tail') for i in range(layers[name])],
  ]

  monkeypatch.setattr(restore_lib, 'COPY_BYTES', copy_bytes)
  staging = restore_lib.Staging(early_copies=True)
  staged = restore_lib.read(store, key, staging, capacity=CAPACITY)
  assert sorted(staged.copies) == sorted(arrays)
  (positions,) = staged.copies['positions']
  assert np.asarray(positions)[: PREFIX.size].tobytes() == staged.block.positions.tobytes()
  for name, count in layers.items():
    parts = staged.copies[name]
    assert [part.shape[0] for part in parts] == ([1] * count if copy_bytes == 1 else [count])
    rows = np.concatenate([np.asarray(part) for part in parts])[:, : arrays[name].shape[1]]
    assert rows.tobytes() == np.asarray(getattr(staged.block, name)).tobytes()

  ids = np.random.default_rng(5).integers(3, 256, 20).astype(np.int32)
  _, cache = tiny_model.prefill(
    ids, cache=tiny_model.init_cache(capacity=CAPACITY), chunk_size=4, logits='none'
  )
  page = pages.to_page(
    blocks.capture(
      cache, blocks.Span(0, ids.size), token_ids=ids, target=tiny_model.graft_target, chunk_size=4
    ),
    tiny_model.config,
    local_rows=3,
  )
  page_key = pages.put(store, page)
  staged = restore_lib.read(
    store, page_key, restore_lib.Staging(early_copies=True), capacity=CAPACITY
  )
  for name in ('k', 'v', 'k_tail', 'v_tail'):
    rows = np.concatenate([np.asarray(part) for part in staged.copies[name]])
    kept = np.asarray(getattr(page.block, name))
    assert rows[:, : kept.shape[1]].tobytes() == kept.tobytes()


def test_restore_from_layer_by_layer_copies_is_byte_equal_to_fresh(
  tiny_model, deposited, monkeypatch
):
  monkeypatch.setattr(restore_lib, 'COPY_BYTES', 1)
  store, key, fresh = deposited
  cache = restore_lib.restore(
    store,
    key,
    tiny_model.init_cache(capacity=CAPACITY),
    target=tiny_model.graft_target,
    staging=restore_lib.Staging(early_copies=True),
    chunk_size=4,
  )
  grafted, _ = continued(tiny_model, cache)
  assert np.asarray(grafted).tobytes() == fresh.tobytes()


def test_on_cpu_read_copies_nothing_early_and_install_takes_whole_arrays(
  tiny_model, deposited, monkeypatch
):
  """On the host CPU XLA takes a staging buffer without copying it: a copy per verified
  layer overlaps nothing there and costs its dispatch, so none is made while reading."""
  monkeypatch.setattr(restore_lib, 'COPY_BYTES', 1)
  store, key, fresh = deposited
  staging = restore_lib.Staging()
  assert staging.early_copies == (staging.device.platform != 'cpu')
  if staging.device.platform != 'cpu':
    pytest.skip('early copies are off on the host CPU only')
  staged = restore_lib.read(store, key, staging, capacity=CAPACITY)
  assert staged.copies == {} and staging.timings['copy_dispatch_s'] == 0.0
  cache = restore_lib.install(
    tiny_model.init_cache(capacity=CAPACITY),
    staged,
    target=tiny_model.graft_target,
    chunk_size=4,
  )
  grafted, _ = continued(tiny_model, cache)
  assert np.asarray(grafted).tobytes() == fresh.tobytes()


def test_a_damaged_layer_is_never_reported_verified(tiny_model, deposited):
  store, key, _ = deposited
  _corrupt(store, key)  # v_tail's layer 2
  verified = []
  with pytest.raises(store_lib.CorruptBlockError, match=key):
    store.get_page(key, on_verified=lambda name, stop: verified.append((name, stop)))
  # read in that order, v_tail last: its layers before the damaged one at most
  assert ('v_tail', 3) not in verified and ('v_tail', 5) not in verified
  assert all(stop <= 2 for name, stop in verified if name == 'v_tail')


@pytest.fixture
def page_of_20(tiny_model, tmp_path):
  """(store, full 20-token block, query continuation ids) for pages of a 20-token block."""
  ids = np.random.default_rng(6).integers(3, 256, 20).astype(np.int32)
  _, cache = tiny_model.prefill(
    ids, cache=tiny_model.init_cache(capacity=CAPACITY + 8), chunk_size=4, logits='none'
  )
  block = blocks.capture(
    cache, blocks.Span(0, ids.size), token_ids=ids, target=tiny_model.graft_target, chunk_size=4
  )
  return store_lib.BlockStore(tmp_path / 'store'), block


@pytest.mark.parametrize(
  'local_rows, query_position', [(3, None), (3, 21), (None, None), (3, 24), (0, 27)]
)
def test_restore_refuses_the_pages_page_in_refuses_with_its_words(
  tiny_model, page_of_20, local_rows, query_position
):
  """Before: restore installed a page of fewer than W - 1 local rows for any query."""
  store, block = page_of_20
  page = pages.to_page(block, tiny_model.config, local_rows=local_rows)
  key = pages.put(store, page)
  cache = tiny_model.init_cache(capacity=CAPACITY + 8)
  before = snapshot(cache)
  kwargs = {'target': tiny_model.graft_target, 'config': tiny_model.config, 'chunk_size': 4}
  try:
    paged = pages.page_in(store, key, cache, query_position=query_position, **kwargs)
  except pages.PageError as e:
    with pytest.raises(pages.PageError) as error:
      restore_lib.restore(store, key, cache, query_position=query_position, donate=True, **kwargs)
    assert str(error.value) == str(e)
    assert all(np.array_equal(a, snapshot(cache)[n]) for n, a in before.items())
    assert local_rows is not None and local_rows < tiny_model.config.sliding_window - 1
  else:
    restored = restore_lib.restore(store, key, cache, query_position=query_position, **kwargs)
    for name in ('k', 'v', 'positions', 'segments', 'length'):
      assert np.asarray(getattr(restored, name)).tobytes() == (
        np.asarray(getattr(paged, name)).tobytes()
      )


def test_restore_of_a_page_needs_the_query_position(tiny_model, page_of_20):
  """A page (a compact block of fewer than W - 1 tail rows) is checked against the target's
  windows: refused without the first query's position; a block that keeps W - 1 needs none."""
  store, block = page_of_20
  key = pages.put(store, pages.to_page(block, tiny_model.config, local_rows=3))
  cache = tiny_model.init_cache(capacity=CAPACITY + 8)
  with pytest.raises(pages.PageError, match='pass query_position'):
    restore_lib.restore(store, key, cache, target=tiny_model.graft_target, chunk_size=4)
  plain = store.put(block)  # a block as captured needs none
  restore_lib.restore(store, plain, cache, target=tiny_model.graft_target, chunk_size=4)


def test_staging_records_the_stages_of_its_last_restore(tiny_model, deposited, monkeypatch):
  monkeypatch.setattr(restore_lib, 'COPY_BYTES', 1)  # a copy dispatched per verified layer
  store, key, _ = deposited
  staging = restore_lib.Staging(early_copies=True)
  restore_lib.restore(
    store,
    key,
    tiny_model.init_cache(capacity=CAPACITY),
    target=tiny_model.graft_target,
    staging=staging,
    chunk_size=4,
  )
  timings = staging.timings
  assert sorted(timings) == ['copy_dispatch_s', 'install_s', 'read_s']
  assert 0 < timings['copy_dispatch_s'] < timings['read_s'] and timings['install_s'] > 0
