"""Policy: page-in or recompute from measured costs, with the crossover."""

import pathlib

import pytest

from graftjax import ledger
from graftjax.paging import policy as policy_lib


def test_recompute_short_blocks_page_in_long_ones():
  # Recompute grows fast with n, page-in slowly: they cross between 256 and 1024.
  policy = policy_lib.Policy(
    tokens=(128, 256, 1024), page_in_s=(0.10, 0.11, 0.14), recompute_s=(0.05, 0.09, 0.40)
  )
  assert policy.choose(1) == 'recompute'  # held at the smallest measured size's costs
  assert policy.choose(128) == 'recompute'
  assert policy.choose(256) == 'recompute'
  assert policy.choose(1024) == 'page_in'
  assert policy.choose(8192) == 'page_in'  # extrapolated
  crossing = policy.crossover_tokens
  assert 256 < crossing < 1024
  cost = policy.cost(crossing)
  assert cost['page_in'] == pytest.approx(cost['recompute'])
  assert policy.choose(int(crossing) + 1) == 'page_in'
  assert policy.choose(int(crossing) - 1) == 'recompute'


def test_page_in_always_faster_and_round_trip():
  policy = policy_lib.Policy.from_rows(
    [
      {'tokens': 512, 'page_in_s': 0.2, 'recompute_s': 5.0},
      {'tokens': 128, 'page_in_s': 0.1, 'recompute_s': 1.0},
    ]
  )
  assert policy.tokens == (128, 512)
  assert policy.choose(1) == 'page_in' and policy.crossover_tokens == 128.0
  assert policy_lib.Policy.from_json(policy.to_json()) == policy
  with pytest.raises(ValueError, match='increase'):
    policy_lib.Policy(tokens=(2, 1), page_in_s=(1, 1), recompute_s=(1, 1))


def test_the_committed_page_in_result_picks_as_its_summary_says():
  path = (
    pathlib.Path(__file__).parents[3]
    / 'experiments'
    / 'results'
    / 'paging'
    / 'paging_pagein_cpu.json'
  )
  result = ledger.verify_result(path)
  policy = policy_lib.Policy.from_json(result['policy'])
  assert policy.crossover_tokens == result['summary']['crossover_tokens']
  assert {str(n): policy.choose(n) for n in policy.tokens} == result['summary']['choice']


def _local():
  # Page-in beats recompute from 256 tokens up on a local store.
  return policy_lib.Policy(
    tokens=(128, 256, 1024), page_in_s=(0.10, 0.11, 0.14), recompute_s=(0.05, 0.12, 0.40)
  )


def test_a_slow_tier_flips_to_recompute_what_a_fast_tier_pages_in():
  per_token = 18_432  # bytes of a token's k and v over 18 layers of 1 x 256 bfloat16
  fast = policy_lib.TierCost(bytes_per_s=1e9, request_s=0.001)
  slow = policy_lib.TierCost(bytes_per_s=20e6, request_s=0.05)

  assert _local().choose(1024) == 'page_in'
  assert _local().on_tier(fast, per_token).choose(1024) == 'page_in'
  assert _local().on_tier(slow, per_token).choose(1024) == 'recompute'
  cost = _local().on_tier(slow, per_token).cost(1024)
  assert cost['page_in'] == pytest.approx(0.14 + 2 * 0.05 + 1024 * per_token / 20e6)
  assert _local().on_tier(fast, per_token).crossover_tokens > _local().crossover_tokens


def test_without_a_tier_the_costs_are_as_measured():
  policy = _local()
  assert policy.tier is None
  assert policy.cost(1024) == {'page_in': 0.14, 'recompute': 0.40}
  assert 'tier' not in policy.to_json()


def test_a_tier_policy_round_trips_and_needs_bytes_per_token():
  tier = policy_lib.TierCost(bytes_per_s=5e8, request_s=0.002)
  policy = _local().on_tier(tier, 1000)
  assert policy_lib.Policy.from_json(policy.to_json()) == policy
  with pytest.raises(ValueError, match='bytes per token'):
    policy_lib.Policy(tokens=(1,), page_in_s=(1,), recompute_s=(1,), tier=tier)
  with pytest.raises(ValueError, match='bytes_per_s'):
    policy_lib.TierCost(bytes_per_s=0, request_s=0)


def test_tier_cost_fitted_to_bench_rows():
  # Rows of 100 MB/s with 10 ms round trips, as bench_store_tier writes them.
  rows = [
    {'bytes': b, 's3_restore': {'best_s': 0.02 + b / 1e8}, 'floor': {'best_s': b / 2e8}}
    for b in (1e6, 4e6, 16e6)
  ]
  tier = policy_lib.TierCost.from_bench({'rows': rows})
  assert tier.bytes_per_s == pytest.approx(1e8)
  assert tier.request_s == pytest.approx(0.01)
  floor = policy_lib.TierCost.from_bench({'rows': rows}, column='floor')
  assert floor.bytes_per_s == pytest.approx(2e8) and floor.request_s == pytest.approx(0, abs=1e-9)
  with pytest.raises(ValueError, match='2 or more'):
    policy_lib.TierCost.from_bench({'rows': rows[:1]})


def test_the_committed_tier_result_adds_its_fetch_to_page_in():
  results = pathlib.Path(__file__).parents[3] / 'experiments' / 'results'
  tier_path = results / 'store_tier' / 'store_tier_cpu.json'
  if not tier_path.is_file():
    pytest.skip(f'{tier_path} is not committed')
  bench = ledger.verify_result(tier_path)
  tier = policy_lib.TierCost.from_bench(bench)
  per_token = bench['rows'][0]['bytes'] / bench['rows'][0]['tokens']
  local = policy_lib.Policy.from_json(
    ledger.verify_result(results / 'paging' / 'paging_pagein_cpu.json')['policy']
  )
  on_s3 = local.on_tier(tier, per_token)

  assert tier.bytes_per_s > 0 and tier.request_s >= 0
  for n in local.tokens:
    assert on_s3.cost(n)['page_in'] == pytest.approx(
      local.cost(n)['page_in'] + tier.seconds(per_token * n)
    )
    assert on_s3.cost(n)['recompute'] == local.cost(n)['recompute']
