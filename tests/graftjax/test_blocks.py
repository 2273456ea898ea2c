"""capture / graft: exact round trip, and refusals that change nothing.

Tests marked "fails on the code before GraftTarget" exercise a refusal that
code accepted silently (it grafted, with a wrong result).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

from graftjax import blocks

PREFIX = np.random.default_rng(2).integers(3, 256, 12).astype(np.int32)
CONT = np.random.default_rng(3).integers(3, 256, 5).astype(np.int32)
CAPACITY = 24


def prefilled(model, ids=PREFIX, chunk_size=4):
  _, cache = model.prefill(
    ids, cache=model.init_cache(capacity=CAPACITY), chunk_size=chunk_size, logits='none'
  )
  return cache


def captured(model, cache=None, chunk_size=4, keep='needed'):
  """The prefix's block, from `cache` (prefilled in chunks of `chunk_size`)."""
  cache = prefilled(model, chunk_size=chunk_size) if cache is None else cache
  return blocks.capture(
    cache,
    blocks.Span(0, PREFIX.size),
    token_ids=PREFIX,
    target=model.graft_target,
    chunk_size=chunk_size,
    keep=keep,
  )


def graft_into_new(model, block, capacity=CAPACITY, chunk_size=4):
  return blocks.graft(
    model.init_cache(capacity=capacity),
    block,
    target=model.graft_target,
    chunk_size=chunk_size,
  )


def test_graft_reproduces_the_captured_cache_bit_for_bit(tiny_model):
  """keep='span': every row; the default: every row a continuation sees, zeros before."""
  cache = prefilled(tiny_model)
  restored = graft_into_new(tiny_model, captured(tiny_model, cache, keep='span'))
  for name in ('k', 'v', 'positions', 'segments', 'length'):
    assert (
      np.asarray(getattr(restored, name)).tobytes() == np.asarray(getattr(cache, name)).tobytes()
    ), name
  restored = graft_into_new(tiny_model, captured(tiny_model, cache))
  seen = PREFIX.size - (tiny_model.config.sliding_window - 1)
  for layer in range(tiny_model.config.num_layers):
    first = 0 if tiny_model.config.window(layer) is None else seen
    for name in ('k', 'v'):
      got, want = (np.asarray(getattr(c, name))[layer, 0] for c in (restored, cache))
      assert got[first:].tobytes() == want[first:].tobytes(), (name, layer)
      assert not got[:first].any(), (name, layer)
  for name in ('positions', 'segments', 'length'):
    assert np.array_equal(getattr(restored, name), getattr(cache, name)), name


@pytest.mark.slow
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
  other = captured(tiny_model, chunk_size=1)  # M=1 rows round differently
  grafted, _ = tiny_model.prefill(
    CONT,
    # said to be in force: `graft(chunk_size=4)`, the fresh path's, refuses it
    cache=graft_into_new(tiny_model, other, chunk_size=1),
    chunk_size=4,
    start_position=PREFIX.size,
    logits='all',
  )
  assert np.asarray(fresh).tobytes() != np.asarray(grafted).tobytes()
  np.testing.assert_allclose(fresh, grafted, atol=1e-4)


def test_graft_covers_sliding_window_layers(tiny_model):
  block = captured(tiny_model)
  local_layers = [i for i in range(tiny_model.config.num_layers) if tiny_model.config.window(i)]
  assert local_layers and block.meta.tail_layers == tuple(local_layers)
  assert block.num_layers == tiny_model.config.num_layers
  assert all(float(jnp.abs(block.k_tail[i]).sum()) > 0 for i in range(len(local_layers)))


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
    blocks.graft(occupied, block, target=tiny_model.graft_target, chunk_size=4)
  np.testing.assert_array_equal(occupied.k, before)  # nothing changed


def test_graft_that_would_do_nothing_is_an_error(tiny_model):
  cache = prefilled(tiny_model)
  with pytest.raises(ValueError, match='empty span'):
    blocks.capture(
      cache, blocks.Span(3, 3), token_ids=(), target=tiny_model.graft_target, chunk_size=4
    )
  with pytest.raises(blocks.GraftError, match='reaches past'):
    blocks.capture(
      cache,
      blocks.Span(0, CAPACITY),
      token_ids=range(CAPACITY),
      target=tiny_model.graft_target,
      chunk_size=4,
    )


def test_graft_leaves_its_input_cache_unchanged(tiny_model):
  empty = tiny_model.init_cache(capacity=CAPACITY)
  blocks.graft(empty, captured(tiny_model), target=tiny_model.graft_target, chunk_size=4)
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
  donated = blocks.graft(fresh, block, target=tiny_model.graft_target, donate=True, chunk_size=4)
  for name in ('k', 'v', 'positions', 'segments', 'length'):
    assert np.asarray(getattr(donated, name)).tobytes() == np.asarray(getattr(kept, name)).tobytes()
  assert fresh.k.is_deleted()  # its buffer now holds the result


def graft_target_of(model, **changes):
  return dataclasses.replace(model.graft_target, **changes)


def test_the_model_hands_out_its_graft_target():
  m = gemma_model.tiny()
  target = m.graft_target
  assert (target.fingerprint, target.position_scheme, target.dtype) == (
    m.fingerprint,
    'rope',
    'float32',
  )
  assert dict(target.kernels) == {op: 'xla' for op in ('attention', 'matmul', 'norm', 'rotary')}
  assert not target.chunk_invariant
  assert gemma_model.tiny(impl='pallas').graft_target.chunk_invariant
  assert not m.with_impl('pallas', matmul='xla').graft_target.chunk_invariant
  assert gemma_model.tiny(dtype=jnp.bfloat16).graft_target.dtype == 'bfloat16'


def test_block_is_a_pytree_with_static_metadata(tiny_model):
  block = captured(tiny_model)
  leaves, treedef = jax.tree.flatten(block)
  assert len(leaves) == 5  # k, v, positions, k_tail, v_tail; meta is static
  zeroed = jax.tree.map(jnp.zeros_like, block)
  assert isinstance(zeroed, blocks.KVBlock) and zeroed.meta == block.meta
  assert not np.any(np.asarray(zeroed.k))
  shapes = jax.tree.map(lambda a: a.shape, block)  # leaves that are not arrays: no checks
  assert shapes.k == block.k.shape
  doubled = jax.jit(lambda b: b.replace(v=b.v * 2))(block)
  np.testing.assert_array_equal(doubled.v, np.asarray(block.v) * 2)
  assert doubled.meta == block.meta
  assert jax.tree.structure(doubled) == treedef
  with pytest.raises(ValueError, match='differ in shape'):
    block.replace(v=block.v[:, :-1])


def test_v_of_another_dtype_is_refused(tiny_model):
  """Fails on the code before GraftTarget: it checked k's dtype only and cast v silently."""
  block = captured(tiny_model)
  bad = block.replace(v=jnp.asarray(block.v, jnp.bfloat16))
  with pytest.raises(blocks.GraftError, match='block v is bfloat16'):
    graft_into_new(tiny_model, bad)


def test_v_of_another_shape_is_refused(tiny_model):
  """Fails on the code before GraftTarget: a v one slot short grafted, its last slot zeros.

  KVBlock refuses such a v on construction; graft checks again for a block
  built around that check.
  """
  block = captured(tiny_model)
  bad = block.replace()
  object.__setattr__(bad, 'v', block.v[:, :-1])
  with pytest.raises(blocks.GraftError, match=r'block v is \(1, 11, 1, 16\)'):
    graft_into_new(tiny_model, bad)


def test_positions_moved_without_shift_are_refused(tiny_model):
  """Fails on the code before GraftTarget: it grafted (max |Δlogit| 4.05 on this tiny model)."""
  block = captured(tiny_model)
  moved = blocks.relocate(block, 5, model=tiny_model)
  forged = moved.replace(meta=block.meta)  # positions and keys moved, metadata says shift 0
  with pytest.raises(blocks.GraftError, match='start at 5, but its metadata says 0'):
    graft_into_new(tiny_model, forged)
  # The same move, declared, is grafted when asked for.
  blocks.graft(
    tiny_model.init_cache(capacity=CAPACITY),
    moved,
    target=tiny_model.graft_target,
    allow_shifted=True,
    chunk_size=4,
  )


@pytest.mark.parametrize(
  'edit, message',
  [
    (lambda p: p.at[4].set(-1), 'empty slots'),
    (lambda p: p.at[3].set(4).at[4].set(3), 'not consecutive'),
    (lambda p: p.at[-1].set(40), 'not consecutive'),
  ],
)
def test_positions_that_disagree_with_the_metadata_are_refused(tiny_model, edit, message):
  """Fails on the code before GraftTarget: it grafted any positions the block carried."""
  block = captured(tiny_model)
  bad = block.replace(positions=edit(jnp.asarray(block.positions)))
  with pytest.raises(blocks.GraftError, match=message):
    graft_into_new(tiny_model, bad)


@pytest.mark.slow
def test_capture_refuses_positions_that_are_not_consecutive(tiny_model):
  cache = tiny_model.init_cache(capacity=CAPACITY)
  _, cache = tiny_model.forward(PREFIX[None, :3], np.arange(3)[None], cache)
  _, cache = tiny_model.forward(PREFIX[None, 3:5], np.array([[10, 11]]), cache)
  with pytest.raises(blocks.GraftError, match='not consecutive'):
    blocks.capture(
      cache, blocks.Span(0, 5), token_ids=PREFIX[:5], target=tiny_model.graft_target, chunk_size=4
    )
  blocks.capture(
    cache, blocks.Span(3, 5), token_ids=PREFIX[3:5], target=tiny_model.graft_target, chunk_size=4
  )


@pytest.mark.slow
def test_capture_records_cache_shape_and_segment(tiny_model):
  _, cache = tiny_model.prefill(
    PREFIX,
    cache=tiny_model.init_cache(batch_size=2, capacity=CAPACITY),
    chunk_size=4,
    logits='none',
    segment=3,
  )
  meta = captured(tiny_model, cache).meta
  assert (meta.capacity, meta.batch_size, meta.segment) == (CAPACITY, 2, 3)


def test_capture_refuses_a_span_that_mixes_segments(tiny_model):
  """Fails on the code before GraftTarget: it captured the span, segments dropped."""
  _, cache = tiny_model.prefill(
    PREFIX[:4], cache=tiny_model.init_cache(capacity=CAPACITY), chunk_size=4, logits='none'
  )
  _, cache = tiny_model.prefill(
    PREFIX[4:8], cache=cache, chunk_size=4, start_position=4, logits='none', segment=1
  )
  with pytest.raises(blocks.GraftError, match=r'mixes attention segments \[0, 1\]'):
    blocks.capture(
      cache, blocks.Span(0, 8), token_ids=PREFIX[:8], target=tiny_model.graft_target, chunk_size=4
    )


def test_block_of_segment_1_is_restored_in_segment_1(tiny_model):
  """Fails on the code before GraftTarget: the block came back in segment 0.

  A continuation in segment 1 then saw none of it (max |Δlogit| 3.15 on this tiny model).
  """
  _, cache = tiny_model.prefill(
    PREFIX, cache=tiny_model.init_cache(capacity=CAPACITY), chunk_size=4, logits='none', segment=1
  )
  block = captured(tiny_model, cache)
  assert block.meta.segment == 1
  grafted_cache = graft_into_new(tiny_model, block)
  np.testing.assert_array_equal(grafted_cache.segments, cache.segments)
  continue_in_1 = lambda c: tiny_model.prefill(
    CONT, cache=c, chunk_size=4, start_position=PREFIX.size, logits='all', segment=1
  )[0]
  fresh = continue_in_1(cache)
  grafted = continue_in_1(grafted_cache)
  assert np.asarray(fresh).tobytes() == np.asarray(grafted).tobytes()


@pytest.mark.parametrize('batch_size, capacity', [(1, 2 * CAPACITY), (2, CAPACITY)])
def test_cache_of_another_shape_needs_consent_under_xla_kernels(tiny_model, batch_size, capacity):
  """Fails on the code before GraftTarget: it grafted, not byte-exact (7.8e-5 on the real model)."""
  block = captured(tiny_model)
  other = lambda: tiny_model.init_cache(batch_size=batch_size, capacity=capacity)
  with pytest.raises(blocks.GraftError) as refused:
    blocks.graft(other(), block, target=tiny_model.graft_target, chunk_size=4)
  message = str(refused.value)
  assert f'batch 1 x capacity {CAPACITY}' in message
  assert f'batch {batch_size} x capacity {capacity}' in message
  assert 'not chunk-invariant' in message and '7.8e-5' in message
  assert 'allow_other_shape=True' in message
  consented = blocks.graft(
    other(), block, target=tiny_model.graft_target, allow_other_shape=True, chunk_size=4
  )
  invariant = blocks.graft(
    other(), block, target=graft_target_of(tiny_model, chunk_invariant=True), chunk_size=4
  )
  for cache in (consented, invariant):
    assert cache.batch_size == batch_size and int(cache.length) == PREFIX.size


def test_cache_of_another_dtype_or_model_dtype_is_refused(tiny_model):
  block = captured(tiny_model)
  with pytest.raises(blocks.GraftError, match='model dtype bfloat16'):
    blocks.graft(
      tiny_model.init_cache(capacity=CAPACITY),
      block,
      target=graft_target_of(tiny_model, dtype='bfloat16'),
      chunk_size=4,
    )


def _json_meta(tiny_model):
  return captured(tiny_model).meta.to_json()


@pytest.mark.parametrize(
  'edit, field',
  [
    (lambda d: d.update(start=True), 'start'),
    (lambda d: d.update(start='0'), 'start'),
    (lambda d: d.update(shift=0.0), 'shift'),
    (lambda d: d.update(capacity=None), 'capacity'),
    (lambda d: d.update(batch_size=0), 'batch_size'),
    (lambda d: d.update(segment=-1), 'segment'),
    (lambda d: d.update(first_position=2**31), 'first_position'),
    (lambda d: d.update(model_fingerprint=7), 'model_fingerprint'),
    (lambda d: d.update(dtype=['float32']), 'dtype'),
    (lambda d: d.update(position_scheme=None), 'position_scheme'),
    (lambda d: d['token_ids'].__setitem__(0, str(d['token_ids'][0])), 'token_ids'),
    (lambda d: d['token_ids'].__setitem__(0, True), 'token_ids'),
    (lambda d: d['token_ids'].__setitem__(0, 2**32 + 5), 'token_ids'),
    (lambda d: d['token_ids'].__setitem__(0, -1), 'token_ids'),
    (lambda d: d['token_ids'].__setitem__(0, 5.0), 'token_ids'),
    (lambda d: d.update(token_ids='abc'), 'token_ids'),
    (lambda d: d.pop('capacity'), 'capacity'),
    (lambda d: d.update(evil=1), 'evil'),
    (lambda d: d.update(start=CAPACITY), 'capacity'),  # slots past the capacity
  ],
)
def test_metadata_from_json_checks_every_field(tiny_model, edit, field):
  """Fails on the code before GraftTarget: it read '5' or 5.0 as 5, True as 1, and so on."""
  data = _json_meta(tiny_model)
  edit(data)
  with pytest.raises(blocks.BlockMetaError, match=f"field '{field}'") as refused:
    blocks.BlockMeta.from_json(data)
  assert refused.value.field == field and isinstance(refused.value, ValueError)


def test_metadata_of_another_layout_is_named_so(tiny_model):
  data = {'layout_version': 1, 'start': 0}
  with pytest.raises(
    blocks.UnsupportedLayoutError, match=r'layout version 1, this code reads \(2, 3, 4\)'
  ):
    blocks.BlockMeta.from_json(data)
  with pytest.raises(blocks.BlockMetaError, match="field 'meta'"):
    blocks.BlockMeta.from_json([_json_meta(tiny_model)])


@pytest.mark.slow
def test_blocks_of_any_length_share_compiled_installs(tiny_model):
  """Rows are padded to INSTALL_BUCKET: a new length compiles nothing new (else the first
  restore of each block length paid a compile, 3.3 s on the H200)."""
  capacity = 2 * blocks.INSTALL_BUCKET
  first = tiny_model.prefill(
    PREFIX, cache=tiny_model.init_cache(capacity=capacity), chunk_size=4, logits='none'
  )[1]
  graft_into_new(
    tiny_model,
    blocks.capture(
      first, blocks.Span(0, 12), token_ids=PREFIX, target=tiny_model.graft_target, chunk_size=4
    ),
    capacity,
  )
  before = blocks._install_compact._cache_size()
  for n in (3, 7, 11):
    _, cache = tiny_model.prefill(
      PREFIX[:n], cache=tiny_model.init_cache(capacity=capacity), chunk_size=4, logits='none'
    )
    block = blocks.capture(
      cache,
      blocks.Span(0, n),
      token_ids=PREFIX[:n],
      target=tiny_model.graft_target,
      chunk_size=4,
      keep='span',
    )
    restored = graft_into_new(tiny_model, block, capacity)
    for name in ('k', 'v', 'positions', 'segments', 'length'):
      assert (
        np.asarray(getattr(restored, name)).tobytes() == np.asarray(getattr(cache, name)).tobytes()
      )
  assert blocks._install_compact._cache_size() == before


def test_padded_install_keeps_what_the_slots_after_the_block_hold(tiny_model):
  cache = tiny_model.init_cache(capacity=CAPACITY)
  marked = cache.replace(k=cache.k.at[:, :, PREFIX.size + 1].set(7.0))
  restored = blocks.graft(
    marked, captured(tiny_model), target=tiny_model.graft_target, chunk_size=4
  )
  assert float(restored.k[0, 0, PREFIX.size + 1, 0, 0]) == 7.0
  assert int(restored.length) == PREFIX.size


def test_a_block_on_the_device_and_its_host_copy_install_the_same_bytes(tiny_model):
  block = captured(tiny_model)
  assert isinstance(block.k, jax.Array)  # captured from a cache on the device: padded there
  on_host = jax.tree.map(np.asarray, block)
  from_device, from_host = graft_into_new(tiny_model, block), graft_into_new(tiny_model, on_host)
  for name in ('k', 'v', 'positions', 'segments', 'length'):
    assert (
      np.asarray(getattr(from_device, name)).tobytes()
      == np.asarray(getattr(from_host, name)).tobytes()
    ), name


def test_capture_records_the_prefill_chunk_size_always(tiny_model):
  """Fails on the code before: it recorded none unless asked, and none on invariant kernels."""
  cache = prefilled(tiny_model, chunk_size=4)
  span = blocks.Span(0, PREFIX.size)
  capture = lambda **kwargs: blocks.capture(cache, span, token_ids=PREFIX, **kwargs)

  block = capture(target=tiny_model.graft_target, chunk_size=4)
  assert (block.meta.chunk_size, block.meta.layout_version) == (4, blocks.LAYOUT_VERSION)
  invariant = graft_target_of(tiny_model, chunk_invariant=True)
  assert capture(target=invariant, chunk_size=4).meta.chunk_size == 4
  with pytest.raises(TypeError, match='chunk_size'):
    capture(target=tiny_model.graft_target)  # never assumed: it must be said
  for bad in (0, -4, 4.0, True, None):
    with pytest.raises(blocks.GraftError, match='chunk_size must be a positive int'):
      capture(target=tiny_model.graft_target, chunk_size=bad)


def test_layout_3_records_the_chunk_size_and_layout_2_keeps_its_form(tiny_model):
  """A block of layout 2 (before chunk sizes were recorded) reads back with the JSON form
  it had, so its key is unchanged; one of layout 3 must record its chunk size."""
  block = captured(tiny_model)
  assert block.meta.to_json()['chunk_size'] == 4
  assert blocks.BlockMeta.from_json(block.meta.to_json()) == block.meta
  old = dataclasses.replace(block.meta, chunk_size=0, layout_version=2, tail_layers=(), tail_rows=0)
  assert 'chunk_size' not in old.to_json() and old.to_json()['layout_version'] == 2
  assert blocks.BlockMeta.from_json(old.to_json()) == old
  unversioned = {k: v for k, v in block.meta.to_json().items() if k != 'layout_version'}
  unversioned.update(chunk_size=0, tail_layers=(), tail_rows=0)
  assert blocks.BlockMeta(**unversioned).layout_version == 2  # made without one: layout 2
  stripped = {k: v for k, v in block.meta.to_json().items() if k != 'chunk_size'}
  with pytest.raises(blocks.BlockMetaError, match="field 'chunk_size': missing"):
    blocks.BlockMeta.from_json(stripped)
  with pytest.raises(blocks.BlockMetaError, match="field 'chunk_size': layout 4 records it"):
    dataclasses.replace(block.meta, chunk_size=0)


def test_block_of_another_prefill_chunk_size_needs_consent_under_xla_kernels(tiny_model):
  """Fails on the code before: a block grafted with no chunk size given, or one that records
  none, passed; it is not byte-exact (test_block_from_another_chunk_schedule_is_not_byte_equal)."""
  target = tiny_model.graft_target
  # Every row of every layer in k, v (a target naming no windows): the form of layout 2.
  block = blocks.capture(
    prefilled(tiny_model, chunk_size=1),
    blocks.Span(0, PREFIX.size),
    token_ids=PREFIX,
    target=dataclasses.replace(target, windows=()),
    chunk_size=1,
  )
  new = lambda: tiny_model.init_cache(capacity=CAPACITY)

  with pytest.raises(blocks.GraftError) as refused:
    blocks.graft(new(), block, target=target, chunk_size=4)
  message = str(refused.value)
  assert 'prefill chunks of 1 tokens' in message and 'chunks of 4' in message
  assert 'not chunk-invariant' in message and 'allow_other_shape=True' in message
  with pytest.raises(blocks.GraftError, match='chunks of 4'):
    blocks.check_graft(new(), block, target=target, chunk_size=4)
  with pytest.raises(blocks.GraftError, match='no chunk size in force was given: pass chunk_size'):
    blocks.graft(new(), block, target=target)  # the caller passes none
  unrecorded = dataclasses.replace(
    block, meta=dataclasses.replace(block.meta, chunk_size=0, layout_version=2)
  )
  for chunk_size in (None, 1):
    with pytest.raises(blocks.GraftError, match='records no prefill chunk size .layout 2'):
      blocks.graft(new(), unrecorded, target=target, chunk_size=chunk_size)

  invariant = graft_target_of(tiny_model, chunk_invariant=True)
  for kwargs in (
    {'chunk_size': 1},
    {'chunk_size': 4, 'allow_other_shape': True},
    {'allow_other_shape': True},
  ):
    assert int(blocks.graft(new(), block, target=target, **kwargs).length) == PREFIX.size
  for candidate, kwargs in ((block, {}), (block, {'chunk_size': 4}), (unrecorded, {})):
    grafted = blocks.graft(new(), candidate, target=invariant, **kwargs)
    assert int(grafted.length) == PREFIX.size


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize('name', ['k', 'v', 'k_tail', 'v_tail'])
def test_graft_refuses_a_block_holding_nan_or_inf(tiny_model, bad, name):
  """Fails on the code before: graft installed it (the store's `put` refused it)."""
  block = captured(tiny_model)
  array = np.array(getattr(block, name))
  array[0, 5, 0, 7] = bad
  poisoned = dataclasses.replace(block, **{name: array})
  cache = tiny_model.init_cache(capacity=CAPACITY)
  with pytest.raises(blocks.GraftError, match=rf'block {name}\[0, 5, 0, 7\] is -?(nan|inf)'):
    blocks.graft(cache, poisoned, target=tiny_model.graft_target, chunk_size=4)
  on_device = dataclasses.replace(block, **{name: jnp.asarray(array)})
  with pytest.raises(blocks.GraftError, match='finite keys and values only'):
    blocks.graft(cache, on_device, target=tiny_model.graft_target, chunk_size=4)
  assert int(cache.length) == 0


def test_capture_checks_token_ids_against_the_captured_rows(tiny_model):
  """Fails on the code before: any token ids of the right length were recorded."""
  cache = prefilled(tiny_model)
  capture = lambda ids: blocks.capture(
    cache,
    blocks.Span(0, PREFIX.size),
    token_ids=ids,
    target=tiny_model.graft_target,
    chunk_size=4,
  )
  assert capture(PREFIX).meta.token_ids == tuple(PREFIX.tolist())
  shifted = np.concatenate([PREFIX[1:], PREFIX[:1]])  # off by one: the usual slicing slip
  # The first layer slides: a compact block holds its last W - 1 = 7 rows, from slot 5.
  with pytest.raises(blocks.GraftError, match='slot 5 holds the state of another token'):
    capture(shifted)
  one_wrong = PREFIX.copy()
  one_wrong[7] = (one_wrong[7] + 1) % 256
  with pytest.raises(blocks.GraftError, match='slot 7 holds the state of another token'):
    capture(one_wrong)
  with pytest.raises(blocks.GraftError, match='token ids must be ints'):
    capture(PREFIX.astype(np.float32))
  blind = dataclasses.replace(tiny_model.graft_target, first_values=None)
  block = blocks.capture(
    cache, blocks.Span(0, PREFIX.size), token_ids=shifted, target=blind, chunk_size=4
  )
  assert len(block) == PREFIX.size  # a target that cannot compute first-layer values: no check


def test_token_check_holds_for_bfloat16_and_every_chunk_schedule():
  """The recomputed first-layer values are within TOKEN_TOLERANCE of what prefills in chunks
  of 1, 3 and 12 rows wrote, in bfloat16 too (the check never refuses its own tokens). It
  reads the first layer only: a model of one sliding and one global layer shows it."""
  for dtype in (jnp.float32, jnp.bfloat16):
    m = gemma_model.tiny(dtype=dtype, attention_types=config_lib.attention_pattern(2, 1))
    for chunk in (1, 3, 12):
      block = captured(m, chunk_size=chunk, keep='span')
      captured_v = np.asarray(block.v_tail[0], np.float32).reshape(PREFIX.size, -1)
      expected = np.asarray(m.first_values(PREFIX), np.float32).reshape(PREFIX.size, -1)
      error = np.linalg.norm(captured_v - expected, axis=1) / np.linalg.norm(expected, axis=1)
      assert error.max() < blocks.TOKEN_TOLERANCE / 10
