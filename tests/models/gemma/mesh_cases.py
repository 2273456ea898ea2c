"""Sharded Gemma on 8 forced host devices; run by test_sharding.py in a process of its own.

`XLA_FLAGS=--xla_force_host_platform_device_count=8 pytest tests/models/gemma/mesh_cases.py`
(the flag must be set before jax starts, hence the separate process).
"""

import jax
import numpy as np
import pytest

from graftjax import blocks
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import sharding

PREFIX, CONTINUATION, CHUNK, CAPACITY = 24, 16, 8, 64


@pytest.fixture(scope='module', autouse=True)
def eight_devices():
  if jax.device_count() != 8:
    pytest.fail(f'needs 8 host devices (XLA_FLAGS), found {jax.device_count()}')


def _ids(n=PREFIX + CONTINUATION, seed=0):
  return np.random.default_rng(seed).integers(3, 256, n)


def _fresh_and_grafted(model, ids, *, batch_size=1):
  """Logits [B, C, V] of the continuation after a fresh prefill, and after a graft."""
  prefix, rest = ids[:PREFIX], ids[PREFIX:]
  cache = model.init_cache(batch_size=batch_size, capacity=CAPACITY)
  _, cache = model.prefill(prefix, cache=cache, chunk_size=CHUNK, logits='none')
  # Captured before the continuation is written: a ring then still holds the rows it needs.
  block = blocks.capture(
    cache, blocks.Span(0, PREFIX), token_ids=prefix, target=model.graft_target, chunk_size=CHUNK
  )
  fresh, cache = model.prefill(
    rest, cache=cache, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  grafted = blocks.graft(
    model.init_cache(batch_size=batch_size, capacity=CAPACITY),
    block,
    target=model.graft_target,
    chunk_size=CHUNK,
  )
  assert grafted.k.sharding.is_equivalent_to(cache.k.sharding, 5)
  out, grafted = model.prefill(
    rest, cache=grafted, chunk_size=CHUNK, start_position=PREFIX, logits='all'
  )
  return np.asarray(fresh), np.asarray(out), cache


# 2- and 8-way (one kv head a device); one device and 4-way graft in the ring, one-kv-head,
# data-split and loading cases below.
@pytest.mark.parametrize('ways', [2, 8])
def test_grafted_equals_fresh_under_model_parallelism(ways):
  base = gemma_model.tiny(num_heads=8, num_kv_heads=8)
  model = sharding.shard_model(base, sharding.make_mesh(1, ways))
  fresh, grafted, cache = _fresh_and_grafted(model, _ids())
  assert fresh.tobytes() == grafted.tobytes()
  # Each device holds 8 / ways kv heads of every layer and slot.
  assert {s.data.shape[3] for s in cache.k.addressable_shards} == {8 // ways}
  assert len(cache.k.addressable_shards) == ways
  assert model.params['layers'][0]['q'].addressable_shards[0].data.shape[1] == 8 // ways


@pytest.mark.parametrize(('data', 'ways', 'batch_size'), [(1, 1, 1), (1, 4, 1), (2, 4, 2)])
def test_a_ring_cache_runs_on_a_mesh(data, ways, batch_size):
  """The sliding-window layers' ring (the layout 12B, 27B and Gemma 4 need) is made in its
  shards, kv heads split as the full layers' are; grafted == fresh; one device computes the
  unsharded ring model's bits."""
  base = gemma_model.tiny(num_heads=8, num_kv_heads=8).with_local_cache('ring', chunk_size=CHUNK)
  model = sharding.shard_model(base, sharding.make_mesh(data, ways))
  fresh, grafted, cache = _fresh_and_grafted(model, _ids(), batch_size=batch_size)
  assert fresh.tobytes() == grafted.tobytes()
  assert cache.ring_capacity < CAPACITY  # the ring wraps: its rows are not the full layout's
  for name in ('ring_k', 'ring_v'):
    shards = getattr(cache, name).addressable_shards
    assert {s.data.shape[1:4:2] for s in shards} == {(batch_size // data, 8 // ways)}
  assert getattr(cache.ring_positions.sharding, 'spec', None) == cache.positions.sharding.spec
  if ways == 1 and data == 1:
    reference, _ = base.prefill(
      _ids(), cache=base.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='all'
    )
    out, _ = model.prefill(
      _ids(), cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='all'
    )
    assert np.asarray(out).tobytes() == np.asarray(reference).tobytes()


def test_one_kv_head_replicates_the_cache_over_the_model_axis():
  model = sharding.shard_model(
    gemma_model.tiny(num_heads=4, num_kv_heads=1), sharding.make_mesh(1, 4)
  )
  fresh, grafted, cache = _fresh_and_grafted(model, _ids())
  assert fresh.tobytes() == grafted.tobytes()
  assert cache.k.sharding.is_fully_replicated
  assert [s.data.shape for s in cache.k.addressable_shards] == [cache.k.shape] * 4
  # The query heads still split: one per device.
  assert model.params['layers'][0]['q'].addressable_shards[0].data.shape[1] == 1
  assert model.params['layers'][0]['k'].sharding.is_fully_replicated


def test_batch_rows_split_over_the_data_axis():
  model = sharding.shard_model(
    gemma_model.tiny(num_heads=8, num_kv_heads=4), sharding.make_mesh(2, 4)
  )
  fresh, grafted, cache = _fresh_and_grafted(model, _ids(), batch_size=2)
  assert fresh.tobytes() == grafted.tobytes()
  assert {s.data.shape[1:4:2] for s in cache.k.addressable_shards} == {(1, 1)}


def test_a_split_is_part_of_the_fingerprint():
  """Bits differ between splits (docs/sharding.md): a block computed under one is refused
  under another; one device is the unsharded model."""
  base = gemma_model.tiny(num_heads=8, num_kv_heads=8)
  prints = {
    (data, ways): sharding.shard_model(base, sharding.make_mesh(data, ways)).fingerprint
    for data, ways in ((1, 1), (1, 2), (1, 4), (2, 4), (1, 8))
  }
  assert prints[(1, 1)] == base.fingerprint
  assert len(set(prints.values())) == len(prints)
  four = sharding.shard_model(base, sharding.make_mesh(1, 4))
  cache = four.init_cache(capacity=CAPACITY)
  _, cache = four.prefill(_ids()[:PREFIX], cache=cache, chunk_size=CHUNK, logits='none')
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=_ids()[:PREFIX],
    target=four.graft_target,
    chunk_size=CHUNK,
  )
  two = sharding.shard_model(base, sharding.make_mesh(1, 2))
  with pytest.raises(blocks.GraftError, match='fingerprint'):
    blocks.graft(
      two.init_cache(capacity=CAPACITY), block, target=two.graft_target, chunk_size=CHUNK
    )


def test_place_one_tensor_at_a_time_gives_the_same_model():
  base = gemma_model.tiny(num_heads=8, num_kv_heads=8)
  mesh = sharding.make_mesh(1, 4)
  place = sharding.placer(mesh)
  params = base.params
  placed = {
    'embedding': place('embedding', np.asarray(params['embedding'])),
    'final_norm': place('final_norm', np.asarray(params['final_norm'])),
    'layers': tuple(
      {name: place(f'layers.{i}.{name}', np.asarray(a)) for name, a in layer.items()}
      for i, layer in enumerate(params['layers'])
    ),
  }
  whole = sharding.shard_model(base, mesh)
  for got, want in zip(jax.tree.leaves(placed), jax.tree.leaves(whole.params), strict=True):
    assert got.sharding == want.sharding
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_load_places_each_tensor_on_the_mesh():
  mesh = sharding.make_mesh(1, 4)
  loaded = sharding.load('tiny', weights='random', seed=3, mesh=mesh)
  whole = sharding.shard_model(gemma_model.load('tiny', weights='random', seed=3), mesh)
  assert loaded.graft_target.fingerprint == whole.graft_target.fingerprint
  for got, want in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(whole.params), strict=True):
    assert got.sharding == want.sharding
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
  fresh, grafted, _ = _fresh_and_grafted(loaded, _ids())
  assert fresh.tobytes() == grafted.tobytes()


def test_sharded_and_unsharded_bits(capsys):
  """One device on a mesh computes what the unsharded model does; split heads sum in another
  order (see docs/sharding.md), so only their closeness is checked, and the measure reported."""
  base = gemma_model.tiny(num_heads=8, num_kv_heads=8)
  ids = _ids()
  reference, _ = base.prefill(
    ids, cache=base.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='all'
  )
  reference = np.asarray(reference)
  for ways in (1, 2, 4, 8):
    model = sharding.shard_model(base, sharding.make_mesh(1, ways))
    out, _ = model.prefill(
      ids, cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='all'
    )
    out = np.asarray(out)
    if ways == 1:
      assert out.tobytes() == reference.tobytes()
    np.testing.assert_allclose(out, reference, atol=1e-4, rtol=0)
    with capsys.disabled():
      differ = int(np.sum(out != reference))
      print(
        f'\n{ways}-way: {differ} of {out.size} logits differ from unsharded,'
        f' max |Δ| {np.abs(out - reference).max():.3g}'
      )


def test_data_split_bits(capsys):
  """Decode steps of a batch of 2, whole on one device or a row per device over 'data':
  only their closeness is checked, and the measure reported (docs/sharding.md)."""
  base = gemma_model.tiny(num_heads=8, num_kv_heads=8)
  ids = _ids()
  outs = []
  for data in (1, 2):
    model = sharding.shard_model(base, sharding.make_mesh(data, 1))
    cache = model.init_cache(batch_size=2, capacity=CAPACITY)
    _, cache = model.prefill(ids[:PREFIX], cache=cache, chunk_size=CHUNK, logits='none')
    steps = []
    for t in range(PREFIX, len(ids)):
      out, cache = model.forward(np.full((2, 1), ids[t]), np.full((2, 1), t), cache)
      steps.append(np.asarray(out))
    outs.append(np.concatenate(steps, axis=1))
  np.testing.assert_allclose(outs[1], outs[0], atol=1e-4, rtol=0)
  with capsys.disabled():
    print(
      f'\nbatch over 2 data devices: {int(np.sum(outs[0] != outs[1]))} of {outs[0].size}'
      f' decode logits differ from one device, max |Δ| {np.abs(outs[0] - outs[1]).max():.3g}'
    )
