"""Blocks of Gemma 4 structures: the cache follows the architecture, and capture, graft,
store and restore stay byte-exact on every one.

Tiny random configs keep each size's structure: kv sharing with per-layer inputs
(E2B-like), K=V global layers with their own kv heads (31B-like), and the
mixture of experts (26B-like); global layers cache head size 32, sliding ones 16.
The byte tests cut each to the fewest layers that keep its structure (a program's compile
time grows with its layers).
"""

import functools

import numpy as np
import pytest
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

from graftjax import blocks
from graftjax import restore as restore_lib
from graftjax import store as store_lib

PREFIX = np.random.default_rng(4).integers(3, 256, 12).astype(np.int32)
CONT = np.random.default_rng(5).integers(3, 256, 4).astype(np.int32)  # one chunk
CAPACITY = 24
STRUCTURES = ('tiny-gemma4-e2b', 'tiny-gemma4-31b', 'tiny-gemma4-26b')
# One sliding and one global layer; E2B's two are each read again by a kv-sharing layer.
_LEAN = {
  'tiny-gemma4-e2b': dict(
    attention_types=config_lib.attention_pattern(4, 1), num_kv_shared_layers=2
  ),
  'tiny-gemma4-31b': dict(attention_types=config_lib.attention_pattern(2, 1)),
  'tiny-gemma4-26b': dict(attention_types=config_lib.attention_pattern(2, 1)),
}


def _model(name, layout='full'):
  """The structure `name` at its full tiny depth (for the cache's shapes)."""
  m = gemma_model.random(config_lib.get_config(name), seed=3)
  return m.with_local_cache(layout, chunk_size=4)


@functools.cache
def _lean(name, layout='full'):
  """The structure `name` cut to `_LEAN`'s layers, shared by the tests that run it."""
  m = gemma_model.random(config_lib.get_config(name, **_LEAN[name]), seed=3)
  return m.with_local_cache(layout, chunk_size=4)


def _prefilled(m, ids=PREFIX):
  # Logits 'all', as the continuation asks: both run one compiled program.
  _, cache = m.prefill(ids, cache=m.init_cache(capacity=CAPACITY), chunk_size=4, logits='all')
  return cache


def _continued(m, cache):
  out, _ = m.prefill(CONT, cache=cache, chunk_size=4, start_position=PREFIX.size, logits='all')
  return np.asarray(out)


def _captured(m):
  cache = _prefilled(m)
  span = blocks.Span(0, PREFIX.size)
  return blocks.capture(cache, span, token_ids=PREFIX, target=m.graft_target, chunk_size=4)


def test_the_cache_holds_only_the_layers_that_compute_keys_and_values():
  m = _model('tiny-gemma4-e2b')  # 10 layers, the last 4 read layers 4 and 5
  cache = m.init_cache(capacity=CAPACITY)
  assert m.config.cached_layers == tuple(range(6))
  assert cache.num_layers == 6
  assert cache.ring_layers == (0, 1, 2, 3, 5)  # sliding; layer 4 is global
  assert cache.k.shape == (1, 1, CAPACITY, 1, 32) and cache.ring_k.shape == (5, 1, CAPACITY, 1, 16)
  assert cache.row_shape() == (1, 1, 32 + 5 * 16)


def test_global_layers_cache_their_own_kv_heads_and_head_size():
  for layout, ring in (('full', CAPACITY), ('ring', 8 - 1 + 4)):
    cache = _model('tiny-gemma4-31b', layout).init_cache(capacity=CAPACITY)
    assert cache.k.shape == (1, 1, CAPACITY, 1, 32)  # one kv head of 32 on the global layer
    assert cache.ring_k.shape == (5, 1, ring, 2, 16)  # two of 16 on the sliding ones
    assert cache.row_shape() == (1, 1, 32 + 5 * 2 * 16)


# Two cases in the fast tier; each of the others compiles programs of its own.
_FAST = {('tiny-gemma4-e2b', 'ring'), ('tiny-gemma4-31b', 'full')}


@pytest.mark.parametrize(
  'name, layout',
  [
    pytest.param(n, l, marks=() if (n, l) in _FAST else pytest.mark.slow)
    for n in STRUCTURES
    for l in ('full', 'ring')
  ],
)
def test_graft_and_restore_then_continue_are_byte_equal_to_fresh(name, layout, tmp_path):
  m = _lean(name, layout)
  fresh = _continued(m, _prefilled(m))
  block = _captured(m)
  cache = m.init_cache(capacity=CAPACITY)
  whole = [i for i in range(cache.num_layers) if i not in block.meta.tail_layers]
  assert block.k.shape == (len(whole), PREFIX.size, *cache.layer_shape(whole[0]))
  assert block.meta.tail_layers == cache.ring_layers  # the sliding layers, their last W - 1 rows
  assert block.k_tail.shape == (len(cache.ring_layers), 7, *cache.layer_shape(0))
  grafted = blocks.graft(
    m.init_cache(capacity=CAPACITY), block, target=m.graft_target, chunk_size=4
  )
  assert _continued(m, grafted).tobytes() == fresh.tobytes()
  store = store_lib.BlockStore(tmp_path / 'store')
  key = store.put(block)
  restored = restore_lib.restore(
    store,
    key,
    m.init_cache(capacity=CAPACITY),
    target=m.graft_target,
    token_ids=PREFIX,
    chunk_size=4,
  )
  assert _continued(m, restored).tobytes() == fresh.tobytes()


def test_a_graft_is_not_byte_equal_when_the_block_is_damaged():
  """The byte test can fail: one flipped key of the global layer changes the continuation."""
  m = _lean('tiny-gemma4-31b')
  fresh = _continued(m, _prefilled(m))
  block = _captured(m)
  k = np.asarray(block.k).copy()
  k[0, 3, 0, 0] += 1.0  # slot 3's first key value of layer 1 (global, the only whole layer)
  grafted = blocks.graft(
    m.init_cache(capacity=CAPACITY), block.replace(k=k), target=m.graft_target, chunk_size=4
  )
  assert _continued(m, grafted).tobytes() != fresh.tobytes()


def test_a_block_is_refused_by_a_model_of_another_layout():
  block = _captured(_lean('tiny-gemma4-31b'))
  other = _lean('tiny-gemma4-e2b')
  with pytest.raises(blocks.GraftError, match='another model'):
    blocks.graft(other.init_cache(capacity=CAPACITY), block, target=other.graft_target)
  own = _lean('tiny-gemma4-31b')  # its own target, but a cache that holds other rows
  with pytest.raises(blocks.GraftError, match='this cache takes'):
    blocks.graft(other.init_cache(capacity=CAPACITY), block, target=own.graft_target)


@pytest.mark.parametrize('name', STRUCTURES)
@pytest.mark.parametrize('layout', ['full', 'ring'])
def test_capture_checks_token_ids_against_the_captured_rows(name, layout):
  """Layer 0 (sliding) holds the last W - 1 = 7 rows' values (value norm applied): a wrong
  token id among them is named."""
  m = _lean(name, layout)
  cache = _prefilled(m)
  capture = lambda ids: blocks.capture(
    cache, blocks.Span(0, PREFIX.size), token_ids=ids, target=m.graft_target, chunk_size=4
  )
  assert capture(PREFIX).meta.token_ids == tuple(PREFIX.tolist())
  one_wrong = PREFIX.copy()
  one_wrong[9] = (one_wrong[9] + 1) % 256
  with pytest.raises(blocks.GraftError, match='slot 9 holds the state of another token'):
    capture(one_wrong)
