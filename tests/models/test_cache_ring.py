"""Ring caches for sliding-window layers: writes, attention, capture and graft stay exact."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax import blocks
from graftjax.models import cache as cache_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

CHUNK = 4  # tiny: window 8, so an XLA ring of 8 - 1 + 4 = 11 slots


def _ids(n, seed=0):
  return np.random.default_rng(seed).integers(3, 256, size=n).astype(np.int32)


def _bytes(x):
  return np.asarray(x).tobytes()


@pytest.fixture(scope='module')
def ring_model():
  return gemma_model.tiny().with_local_cache('ring', chunk_size=CHUNK)


def _reference_put(ring, rows, start, n):
  out = np.array(ring)
  for i in range(n):
    out[(start + i) % ring.shape[0]] = rows[i]
  return out


@pytest.mark.parametrize(
  'start, m, n', [(0, 3, 3), (9, 5, 5), (10, 1, 1), (7, 64, 30), (3, 64, 11), (5, 6, 2)]
)
def test_ring_put_lands_each_row_at_its_slot_mod_r(start, m, n):
  ring = np.arange(11 * 2, dtype=np.float32).reshape(11, 2)
  rows = -np.arange(1, m * 2 + 1, dtype=np.float32).reshape(m, 2)
  got = cache_lib.ring_put(jnp.asarray(ring), jnp.asarray(rows), start, axis=0, n=n)
  np.testing.assert_array_equal(np.asarray(got), _reference_put(ring, rows, start, n))


def test_ring_slots_is_window_plus_chunk_within_capacity():
  assert cache_lib.ring_slots(1000, window=8, chunk_size=4) == 11
  assert cache_lib.ring_slots(1000, window=512, chunk_size=256, multiple=64) == 768
  assert cache_lib.ring_slots(100, window=512, chunk_size=256) == 100


def test_ring_cache_keeps_only_the_ring_for_local_layers(ring_model):
  cache = ring_model.init_cache(capacity=64)
  assert cache.ring_layers == (0, 1, 2, 3, 4) and cache.ring_capacity == 11
  assert cache.k.shape[0] == 1 and cache.ring_k.shape == (5, 1, 11, 1, 16)
  assert cache.num_layers == 6 and cache.layout == 'ring'
  assert ring_model.fingerprint != gemma_model.tiny().fingerprint
  assert gemma_model.tiny().with_local_cache('full').fingerprint == gemma_model.tiny().fingerprint


def test_ring_attends_to_the_same_keys_as_the_full_cache(ring_model):
  """Past the wrap, the ring's logits agree with the full layout's (other shapes: not bits)."""
  ids = _ids(40)
  full = gemma_model.tiny()
  got, _ = ring_model.prefill(
    ids, cache=ring_model.init_cache(capacity=64), chunk_size=CHUNK, logits='all'
  )
  want, _ = full.prefill(ids, cache=full.init_cache(capacity=64), chunk_size=CHUNK, logits='all')
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5)


def _fresh_and_grafted(model, prompt, continuation, *, capacity, chunk, span=None):
  cache = model.init_cache(capacity=capacity)
  _, cache = model.prefill(prompt, cache=cache, chunk_size=chunk, logits='none')
  span = span or blocks.Span(0, len(prompt))
  block = blocks.capture(
    cache,
    span,
    token_ids=prompt[span.start : span.stop],
    target=model.graft_target,
    chunk_size=chunk,
  )
  grafted = blocks.graft(
    model.init_cache(capacity=capacity), block, target=model.graft_target, chunk_size=chunk
  )
  start = len(prompt)
  fresh, _ = model.prefill(
    continuation, cache=cache, chunk_size=chunk, start_position=start, logits='all'
  )
  after, _ = model.prefill(
    continuation, cache=grafted, chunk_size=chunk, start_position=start, logits='all'
  )
  return fresh, after, block


def test_graft_into_a_ring_is_byte_equal_to_fresh(ring_model):
  prompt, continuation = _ids(37), _ids(9, seed=1)
  fresh, after, block = _fresh_and_grafted(
    ring_model, prompt, continuation, capacity=64, chunk=CHUNK
  )
  assert _bytes(fresh) == _bytes(after)
  # The block keeps the local layers' last W - 1 rows only (the ring had dropped older ones).
  assert block.k_tail.shape[1] == 7 and np.asarray(block.k_tail).any()


def test_decode_after_graft_into_a_ring_is_byte_equal(ring_model):
  prompt, continuation = _ids(30), _ids(12, seed=2)
  fresh, after, _ = _fresh_and_grafted(ring_model, prompt, continuation, capacity=64, chunk=1)
  assert _bytes(fresh) == _bytes(after)


def test_capture_of_a_span_the_ring_dropped_is_refused(ring_model):
  prompt = _ids(40)
  cache = ring_model.init_cache(capacity=64)
  _, cache = ring_model.prefill(prompt, cache=cache, chunk_size=CHUNK, logits='none')
  with pytest.raises(blocks.GraftError, match='capture it before writing further'):
    blocks.capture(
      cache,
      blocks.Span(0, 20),
      token_ids=prompt[:20],
      target=ring_model.graft_target,
      chunk_size=CHUNK,
    )


def test_block_of_a_ring_model_is_refused_by_the_full_model(ring_model):
  prompt = _ids(20)
  cache = ring_model.init_cache(capacity=64)
  _, cache = ring_model.prefill(prompt, cache=cache, chunk_size=CHUNK, logits='none')
  block = blocks.capture(
    cache, blocks.Span(0, 20), token_ids=prompt, target=ring_model.graft_target, chunk_size=CHUNK
  )
  full = gemma_model.tiny()
  with pytest.raises(blocks.GraftError, match='fingerprint'):
    blocks.graft(full.init_cache(capacity=64), block, target=full.graft_target, chunk_size=CHUNK)


def test_forward_refuses_a_chunk_larger_than_the_ring_takes(ring_model):
  cache = ring_model.init_cache(capacity=64)
  with pytest.raises(ValueError, match='at most 4 per call'):
    ring_model.prefill(_ids(8), cache=cache, chunk_size=8)


def test_forward_refuses_a_cache_of_another_layout(ring_model):
  with pytest.raises(ValueError, match='make it with init_cache'):
    ring_model.prefill(_ids(4), cache=gemma_model.tiny().init_cache(capacity=64), chunk_size=4)


def test_ring_as_large_as_the_capacity_is_the_full_layout():
  """A ring that never wraps gives the full layout's bits."""
  ids = _ids(24)
  full = gemma_model.tiny()
  ring = full.with_local_cache('ring', chunk_size=64)
  cache = ring.init_cache(capacity=32)
  assert cache.ring_capacity == 32
  got, _ = ring.prefill(ids, cache=cache, chunk_size=8, logits='all')
  want, _ = full.prefill(ids, cache=full.init_cache(capacity=32), chunk_size=8, logits='all')
  assert _bytes(got) == _bytes(want)


@pytest.mark.slow
def test_ring_is_chunk_invariant_under_pallas():
  """Pallas (interpreted): a continuation after a graft equals one pass over prompt and
  continuation, through a ring that wrapped (64 of 128 slots). Three chunk shapes only, and
  two layers (a sliding one in the ring, a global one)."""
  two_layers = config_lib.attention_pattern(2, 1)
  model = gemma_model.tiny(impl='pallas', attention_types=two_layers).with_local_cache(
    'ring', chunk_size=57
  )
  capacity = 128
  assert model.ring_capacity(capacity) == 64 and model.max_chunk(capacity) == 57
  prompt, continuation = _ids(72), _ids(24, seed=3)
  whole, _ = model.prefill(
    np.concatenate([prompt, continuation]),
    cache=model.init_cache(capacity=capacity),
    chunk_size=48,
    logits='all',
  )
  cache = model.init_cache(capacity=capacity)
  _, cache = model.prefill(prompt, cache=cache, chunk_size=24, logits='none')
  block = blocks.capture(
    cache, blocks.Span(0, 72), token_ids=prompt, target=model.graft_target, chunk_size=24
  )
  # chunk-invariant kernels: no chunk size in force is needed (the block's is 24)
  grafted = blocks.graft(model.init_cache(capacity=capacity), block, target=model.graft_target)
  after, _ = model.prefill(
    continuation, cache=grafted, chunk_size=8, start_position=72, logits='all'
  )
  assert _bytes(np.asarray(whole)[:, 72:]) == _bytes(after)


def test_ring_block_as_a_page_and_through_the_store_stays_exact(ring_model, tmp_path):
  from graftjax import restore
  from graftjax import store as store_lib
  from graftjax.paging import pages

  prompt, continuation = _ids(37), _ids(9, seed=4)
  fresh, after, block = _fresh_and_grafted(
    ring_model, prompt, continuation, capacity=64, chunk=CHUNK
  )
  page = pages.to_page(block, ring_model.config)
  assert page.local_rows == 7
  store = store_lib.BlockStore(tmp_path / 'store')
  key, page_key = store.put(block), pages.put(store, page)
  target = ring_model.graft_target
  caches = {
    'restore': restore.restore(
      store, key, ring_model.init_cache(capacity=64), target=target, chunk_size=CHUNK
    ),
    'page_in': pages.page_in(
      store,
      page_key,
      ring_model.init_cache(capacity=64),
      target=target,
      config=ring_model.config,
      chunk_size=CHUNK,
    ),
  }
  for name, cache in caches.items():
    logits, _ = ring_model.prefill(
      continuation, cache=cache, chunk_size=CHUNK, start_position=37, logits='all'
    )
    assert _bytes(logits) == _bytes(fresh), name


def test_a_ring_leaves_no_slots_empty_after_written_ones(ring_model):
  """Composition-style gaps would drop rows the full layout still shows: refused."""
  prompt = _ids(20)
  cache = ring_model.init_cache(capacity=64)
  _, cache = ring_model.prefill(prompt, cache=cache, chunk_size=CHUNK, logits='none')
  with pytest.raises(ValueError, match='leaves slots empty only before its first write'):
    cache_lib.reserve(cache, 4)
  block = blocks.capture(
    cache,
    blocks.Span(12, 20),
    token_ids=prompt[12:],
    target=ring_model.graft_target,
    chunk_size=CHUNK,
  )
  moved = block.replace(meta=dataclasses.replace(block.meta, start=40))
  with pytest.raises(blocks.GraftError, match='leaves slots empty only before its first write'):
    blocks.graft(cache, moved, target=ring_model.graft_target, chunk_size=CHUNK)
  # Before the first write a ring may skip slots (a block computed alone at its own slot).
  assert int(cache_lib.reserve(ring_model.init_cache(capacity=64), 30).length) == 30


def test_relocated_ring_block_is_exact_under_rope_relative():
  """A block computed at position 0 and moved to 500 (keys carry no position under
  rope_relative) continues as a fresh prefill at 500 does, through a ring that wrapped."""
  model = (
    gemma_model.tiny()
    .with_position_scheme('rope_relative')
    .with_local_cache('ring', chunk_size=CHUNK)
  )
  prompt, continuation = _ids(30, seed=5), _ids(6, seed=6)
  target = model.graft_target

  def prefill(ids, cache, start):
    return model.prefill(ids, cache=cache, chunk_size=CHUNK, start_position=start, logits='all')

  _, at_zero = prefill(prompt, model.init_cache(capacity=64), 0)
  block = blocks.capture(
    at_zero, blocks.Span(0, 30), token_ids=prompt, target=target, chunk_size=CHUNK
  )
  moved = blocks.relocate(block, 500, model=model)
  grafted = blocks.graft(
    model.init_cache(capacity=64), moved, target=target, allow_shifted=True, chunk_size=CHUNK
  )
  _, fresh = prefill(prompt, model.init_cache(capacity=64), 500)
  want, _ = prefill(continuation, fresh, 530)
  got, _ = prefill(continuation, grafted, 530)
  assert _bytes(got) == _bytes(want)


@pytest.mark.slow
def test_generation_decodes_through_a_wrapping_ring(ring_model):
  """The jitted decode loop writes the ring one row at a time and sees what the full layout does."""
  from graftjax.models.gemma import sampler

  run = lambda m: sampler.generate(
    m, _ids(20, seed=7), max_new_tokens=30, capacity=64, chunk_size=4, stop_ids=(), keep_logits=True
  )
  ring, full = run(ring_model), run(gemma_model.tiny())
  assert ring['cache'].ring_capacity == 11 and int(ring['cache'].length) == 50
  assert ring['tokens'] == full['tokens']
  np.testing.assert_allclose(ring['logits'], full['logits'], rtol=0, atol=2e-5)
