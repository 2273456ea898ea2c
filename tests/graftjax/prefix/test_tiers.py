"""Tiers and eviction: budgets hold, spans in use stay, an evicted span lives on in a slower
tier, and reuse stays byte-exact after eviction and from every tier."""

import numpy as np
import prefix_cases as cases
import pytest

from graftjax import blocks
from graftjax.prefix import spans
from graftjax.prefix import tiers as tiers_lib


def _block(start: int, n: int = 4) -> blocks.KVBlock:
  meta = blocks.BlockMeta(
    model_fingerprint='f' * 64,
    token_ids=tuple(range(3, 3 + n)),
    start=start,
    dtype='float32',
    position_scheme='rope',
    capacity=64,
    first_position=start,
    chunk_size=4,
  )
  k = np.ones((2, n, 1, 4), np.float32)
  return blocks.KVBlock(k=k, v=k, positions=np.arange(start, start + n, dtype=np.int32), meta=meta)


SIZE = 2 * 2 * 4 * 4 * 4 + 4 * 4  # k and v [2, 4, 1, 4] float32, positions [4] int32


def test_lru_eviction_moves_spans_to_the_slower_tier_and_spares_pinned_ones():
  fast = tiers_lib.MemoryTier('device', 2 * SIZE, device=True)
  slow = tiers_lib.MemoryTier('host', None, device=False)
  tiers = tiers_lib.Tiers([fast, slow])
  with tiers.pinned(['a']):
    for key, start in zip('abcd', (0, 4, 8, 12)):
      assert tiers.put(key, _block(start))
    assert 'a' in fast  # the least recently used, but in use
    assert fast.used <= 2 * SIZE or fast.keys() == ['a', 'd']
  assert fast.used <= 2 * SIZE  # unpinned: back within budget
  assert set(slow.keys()) == set('abcd')  # nothing evicted from the fast tier is lost
  block, tier = tiers.get('b')
  assert tier == 'host' and 'b' in fast  # promoted back
  assert tiers.evicted['device'] >= 2


def test_a_zero_budget_tier_keeps_nothing_and_a_zero_budget_store_stores_nothing():
  tiers = tiers_lib.Tiers(
    [tiers_lib.MemoryTier('device', 0, device=True), tiers_lib.MemoryTier('host', 0, device=False)]
  )
  assert not tiers.put('a', _block(0))
  assert tiers.get('a') == (None, None)


def test_reuse_is_exact_after_eviction_and_from_every_tier(tmp_path):
  m = cases.model('tiny')
  span_bytes = 2 * 8 * cases.CAPACITY  # well under one span's bytes: the fast tiers hold one
  engine = cases.engine(
    m,
    device_bytes=span_bytes * 4,
    host_bytes=span_bytes * 4,
    disk=str(tmp_path / 'disk'),
    disk_bytes=None,
  )
  engine.prefill(cases.IDS)
  device, host, disk, store = engine.tiers.tiers
  assert device.used <= device.budget and host.used <= host.budget
  assert len(store.keys()) == 3  # spans [0, 8), [8, 16), [16, 20)
  assert set(disk.keys()) | set(device.keys()) | set(host.keys()) >= set(store.keys()) - {None}
  reference = cases.cold(m)
  for _ in range(2):
    out = engine.prefill(cases.IDS, deposit=False)
    assert out.hit == cases.N - 1
    assert out.logits.tobytes() == reference.tobytes()
    assert sum(out.read_bytes[t] for t in ('host', 'disk', 'store')) > 0


def test_a_span_evicted_from_the_store_is_gone_for_every_engine_and_reuse_stays_exact():
  m = cases.model('tiny')
  store = cases.memory_store()
  first = cases.engine(m, store, device_bytes=0, host_bytes=0, store_bytes=None)
  first.prefill(cases.IDS)
  names = first.tiers.tiers[-1].keys()
  first.tiers.tiers[-1].budget = 0
  with first.tiers.pinned([]):  # unpinning refits every tier: the store tier evicts all
    pass
  held = spans.SpanStore(store)
  assert all(held.list(name.split('/')[0]) == [] for name in names)
  second = cases.engine(m, store)
  second.sync()
  assert len(second.index) == 0 and len(names) == 3
  out = second.prefill(cases.IDS, deposit=False)
  assert out.hit == 0 and out.logits.tobytes() == cases.cold(m).tobytes()


@pytest.mark.parametrize('budget', [0])
def test_a_zero_budget_engine_prefills_cold_with_the_reason(budget):
  m = cases.model('tiny')
  engine = cases.engine(m, device_bytes=budget, host_bytes=budget, store_bytes=budget)
  first = engine.prefill(cases.IDS)
  assert first.deposited == 0 and any('budget' in r for r in first.reasons)
  out = engine.prefill(cases.IDS)
  assert out.hit == 0 and out.logits.tobytes() == cases.cold(m).tobytes()
