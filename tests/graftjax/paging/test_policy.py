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
