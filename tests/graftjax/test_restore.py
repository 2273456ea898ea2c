"""restore: read, verify and graft in one call; any failure leaves the cache as it was."""

import os

import numpy as np
import pytest

from graftjax import blocks
from graftjax import restore as restore_lib
from graftjax import store as store_lib

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
    cache, blocks.Span(0, PREFIX.size), token_ids=PREFIX, target=tiny_model.graft_target
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
  )
  assert int(cache.length) == PREFIX.size
  grafted, _ = continued(tiny_model, cache)
  assert np.asarray(grafted).tobytes() == fresh.tobytes()


def _corrupt(store, key):
  chunk = os.path.join(store.root, key, 'v', 'c', '2', '0', '0', '0')
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
    restore_lib.restore(store, key, cache, target=tiny_model.graft_target, donate=donate)
  assert not cache.k.is_deleted()
  after = snapshot(cache)
  assert all(after[name].tobytes() == before[name].tobytes() for name in before)


def test_restore_refuses_other_tokens_and_other_models(tiny_model, deposited):
  store, key, _ = deposited
  cache = tiny_model.init_cache(capacity=CAPACITY)
  with pytest.raises(blocks.GraftError, match='other tokens'):
    restore_lib.restore(
      store, key, cache, target=tiny_model.graft_target, token_ids=PREFIX[::-1], donate=True
    )
  other = tiny_model.with_position_scheme('alibi')
  with pytest.raises(blocks.GraftError, match='position scheme'):
    restore_lib.restore(store, key, cache, target=other.graft_target, donate=True)
  assert not cache.k.is_deleted() and int(cache.length) == 0
