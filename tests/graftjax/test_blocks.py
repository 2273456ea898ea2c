"""capture / graft: exact round trip, and refusals that change nothing."""

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax import blocks
from graftjax.models.gemma import model as gemma_model

PREFIX = np.random.default_rng(2).integers(3, 256, 12).astype(np.int32)
CONT = np.random.default_rng(3).integers(3, 256, 5).astype(np.int32)
CAPACITY = 24


def prefilled(model, ids=PREFIX, chunk_size=4):
  _, cache = model.prefill(
    ids, cache=model.init_cache(capacity=CAPACITY), chunk_size=chunk_size, logits='none'
  )
  return cache


def captured(model, cache=None):
  cache = prefilled(model) if cache is None else cache
  return blocks.capture(
    cache,
    blocks.Span(0, PREFIX.size),
    token_ids=PREFIX,
    model_fingerprint=model.fingerprint,
    position_scheme=model.position_scheme,
  )


def graft_into_new(model, block, capacity=CAPACITY):
  return blocks.graft(
    model.init_cache(capacity=capacity),
    block,
    model_fingerprint=model.fingerprint,
    position_scheme=model.position_scheme,
  )


def test_graft_reproduces_the_captured_cache_bit_for_bit(tiny_model):
  cache = prefilled(tiny_model)
  restored = graft_into_new(tiny_model, captured(tiny_model, cache))
  for name in ('k', 'v', 'positions', 'length'):
    assert (
      np.asarray(getattr(restored, name)).tobytes() == np.asarray(getattr(cache, name)).tobytes()
    ), name


def test_continuation_after_graft_is_byte_equal(tiny_model):
  fresh, _ = tiny_model.prefill(
    CONT, cache=prefilled(tiny_model), chunk_size=4, start_position=PREFIX.size, logits='all'
  )
  grafted, _ = tiny_model.prefill(
    CONT,
    cache=graft_into_new(tiny_model, captured(tiny_model)),
    chunk_size=4,
    start_position=PREFIX.size,
    logits='all',
  )
  assert np.asarray(fresh).tobytes() == np.asarray(grafted).tobytes()


def test_block_from_another_chunk_schedule_is_not_byte_equal(tiny_model):
  """The byte test can fail: same text, prefix prefilled in other chunks."""
  fresh, _ = tiny_model.prefill(
    CONT,
    cache=prefilled(tiny_model, chunk_size=4),
    chunk_size=4,
    start_position=PREFIX.size,
    logits='all',
  )
  other = captured(tiny_model, prefilled(tiny_model, chunk_size=1))  # M=1 rows round differently
  grafted, _ = tiny_model.prefill(
    CONT,
    cache=graft_into_new(tiny_model, other),
    chunk_size=4,
    start_position=PREFIX.size,
    logits='all',
  )
  assert np.asarray(fresh).tobytes() != np.asarray(grafted).tobytes()
  np.testing.assert_allclose(fresh, grafted, atol=1e-4)


def test_graft_covers_sliding_window_layers(tiny_model):
  block = captured(tiny_model)
  local_layers = [i for i in range(tiny_model.config.num_layers) if tiny_model.config.window(i)]
  assert local_layers and block.k.shape[0] == tiny_model.config.num_layers
  assert all(float(jnp.abs(block.k[i]).sum()) > 0 for i in local_layers)


@pytest.mark.parametrize(
  'change, message',
  [
    (lambda m: m.with_position_scheme('alibi'), 'position scheme'),
    (lambda m: gemma_model.tiny(seed=7), 'another model'),
    (lambda m: gemma_model.tiny(dtype=jnp.bfloat16), 'dtype'),
  ],
)
def test_incompatible_block_is_refused(tiny_model, change, message):
  block = captured(tiny_model)
  other = change(tiny_model)
  with pytest.raises(blocks.GraftError, match=message):
    graft_into_new(other, block)


def test_span_that_does_not_fit_or_overlaps_is_refused(tiny_model):
  block = captured(tiny_model)
  with pytest.raises(blocks.GraftError, match='do not fit'):
    graft_into_new(tiny_model, block, capacity=PREFIX.size - 1)
  occupied = prefilled(tiny_model, ids=PREFIX[:3])
  before = np.asarray(occupied.k).copy()
  with pytest.raises(blocks.GraftError, match='overlap'):
    blocks.graft(
      occupied,
      block,
      model_fingerprint=tiny_model.fingerprint,
      position_scheme=tiny_model.position_scheme,
    )
  np.testing.assert_array_equal(occupied.k, before)  # nothing changed


def test_graft_that_would_do_nothing_is_an_error(tiny_model):
  cache = prefilled(tiny_model)
  with pytest.raises(ValueError, match='empty span'):
    blocks.capture(
      cache, blocks.Span(3, 3), token_ids=(), model_fingerprint='x', position_scheme='rope'
    )
  with pytest.raises(blocks.GraftError, match='reaches past'):
    blocks.capture(
      cache,
      blocks.Span(0, CAPACITY),
      token_ids=range(CAPACITY),
      model_fingerprint='x',
      position_scheme='rope',
    )


def test_graft_leaves_its_input_cache_unchanged(tiny_model):
  empty = tiny_model.init_cache(capacity=CAPACITY)
  blocks.graft(
    empty,
    captured(tiny_model),
    model_fingerprint=tiny_model.fingerprint,
    position_scheme=tiny_model.position_scheme,
  )
  assert int(empty.length) == 0 and not np.any(np.asarray(empty.k))


def test_metadata_round_trips_through_json(tiny_model):
  meta = captured(tiny_model).meta
  assert blocks.BlockMeta.from_json(meta.to_json()) == meta
  with pytest.raises(ValueError, match='unknown'):
    blocks.BlockMeta.from_json({**meta.to_json(), 'evil': 1})


def test_donating_graft_writes_the_same_cache_in_place(tiny_model):
  block = captured(tiny_model)
  kept = graft_into_new(tiny_model, block)
  fresh = tiny_model.init_cache(batch_size=1, capacity=CAPACITY)
  donated = blocks.graft(
    fresh,
    block,
    model_fingerprint=tiny_model.fingerprint,
    position_scheme=tiny_model.position_scheme,
    donate=True,
  )
  for name in ('k', 'v', 'positions', 'segments', 'length'):
    assert np.asarray(getattr(donated, name)).tobytes() == np.asarray(getattr(kept, name)).tobytes()
  assert fresh.k.is_deleted()  # its buffer now holds the result
