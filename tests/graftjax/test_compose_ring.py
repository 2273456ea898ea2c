"""Composition on a ring cache (`with_local_cache('ring')`): byte-equal to a fresh
block-attention prefill of the same layout in the same ring, with pages that are whole rings,
and refused where the ring would drop rows the query sees.

Tiny model (window 8) cut to one sliding and one global layer (a program's compile time grows
with its layers), float32, rope_relative, Pallas kernels (the interpreter on CPU).
"""

import hashlib

import numpy as np
import pytest

from graftjax import blocks
from graftjax import compose
from graftjax import store as store_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

CAPACITY, CHUNK = 1024, 8
LAYERS = config_lib.attention_pattern(2, 1)  # one sliding layer, one global
RNG = np.random.default_rng(11)
TEXTS = [[2] + [int(t) for t in RNG.integers(3, 256, n - 1)] for n in (24, 40, 16, 8)]
QUERY = [int(t) for t in RNG.integers(3, 256, CHUNK)]
FIELDS = ('k', 'v', 'positions', 'segments', 'length')
RING_FIELDS = ('ring_k', 'ring_v', 'ring_positions', 'ring_segments')


def _model(ring_chunk: int):
  base = (
    gemma_model.tiny(attention_types=LAYERS)
    .with_position_scheme('rope_relative')
    .with_impl('pallas')
  )
  return base.with_local_cache('ring', chunk_size=ring_chunk)


@pytest.fixture(scope='module')
def model():
  return _model(CHUNK)  # a ring of 64 slots: the window 8 less one plus a chunk, in tiles of 64


def _deposit(model, store, texts):
  keys = []
  for ids in texts:
    _, cache = model.prefill(
      ids, cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='none'
    )
    block = blocks.capture(
      cache, blocks.Span(0, len(ids)), token_ids=ids, target=model.graft_target, chunk_size=CHUNK
    )
    keys.append(store.put(block))
  return keys


@pytest.fixture(scope='module')
def library(model, tmp_path_factory):
  store = store_lib.BlockStore(tmp_path_factory.mktemp('ring') / 'blocks')
  return store, _deposit(model, store, TEXTS)


def _digest(a) -> str:
  return hashlib.sha256(np.asarray(a).tobytes()).hexdigest()


def _query(model, cache, layout):
  logits, _ = model.prefill(
    QUERY, cache=cache, chunk_size=CHUNK, start_position=layout.next_position, logits='all'
  )
  return np.asarray(logits)


def test_pages_are_whole_rings_and_whole_splits(model):
  assert model.ring_capacity(CAPACITY) == 64
  assert compose.ring_page(model, CAPACITY) == 256  # lcm(split 256, ring 64)
  wide = _model(185)  # a ring of 192 slots
  assert compose.ring_page(wide, CAPACITY) == 768
  with pytest.raises(compose.ComposeError, match='ring of 192 slots'):
    compose.check_model(wide, 256, capacity=CAPACITY)


def test_a_composed_ring_is_byte_equal_to_a_fresh_prefill_in_the_ring(model, library):
  store, keys = library
  cache, layout = compose.compose(model, store, keys[:3], capacity=CAPACITY)
  assert [p.slot for p in layout.placements] == [0, 256, 512]
  assert cache.ring_capacity == 64
  fresh = compose.fresh_layout(model, TEXTS[:3], layout, chunk_size=CHUNK)
  for field in FIELDS + ('ring_positions', 'ring_segments'):
    assert _digest(getattr(cache, field)) == _digest(getattr(fresh, field)), field
  # The ring rows a query sees are the fresh ones; a compact block holds no older rows.
  window = model.config.sliding_window
  positions = np.asarray(cache.ring_positions)  # [B, R]
  held = positions >= layout.next_position - (window - 1)
  for field in ('ring_k', 'ring_v'):
    got, want = (np.asarray(getattr(c, field))[:, held] for c in (cache, fresh))
    assert got.tobytes() == want.tobytes(), field
  # The ring holds every position the query's window sees.
  seen = set(range(layout.next_position - window + 1, layout.next_position))
  assert seen <= set(np.asarray(cache.ring_positions[0]).tolist())
  assert _digest(_query(model, cache, layout)) == _digest(_query(model, fresh, layout))


@pytest.mark.slow
def test_a_layout_whose_query_would_overwrite_rows_it_sees_is_refused(model, library, tmp_path):
  """A last block of 4 tokens holds fewer than the W - 1 = 7 rows the query's window sees; the
  other 3 are the 100-token block's last rows, at ring indices a query chunk written after the
  page gap lands on before its first token has seen them."""
  store = store_lib.BlockStore(tmp_path / 'blocks')
  long, short = [2] + [int(t) for t in RNG.integers(3, 256, 99)], [2, 5, 6, 7]
  keys = _deposit(model, store, [long, short])
  with pytest.raises(compose.ComposeError, match='overwrites before the query has seen it'):
    compose.compose(model, store, keys, capacity=CAPACITY)
  # What the check prevents: installed anyway, a 40-token query chunk drops rows it sees.
  layout = compose.plan([100, 4], capacity=CAPACITY, page=256)
  placed = [compose._placed(model, store.get(k), p) for k, p in zip(keys, layout.placements)]
  cache = compose._install(model, model.init_cache(capacity=CAPACITY), placed)
  window = model.config.sliding_window
  seen = set(range(layout.next_position - window + 1, layout.next_position))
  assert seen <= set(np.asarray(cache.ring_positions[0]).tolist())  # held before the query
  query = [int(t) for t in RNG.integers(3, 256, 40)]
  _, after = model.prefill(
    query, cache=cache, chunk_size=40, start_position=layout.next_position, logits='none'
  )
  assert not seen <= set(np.asarray(after.ring_positions[0]).tolist())
