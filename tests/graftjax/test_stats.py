"""Wilson score intervals against known values."""

import json

import pytest

from graftjax import stats


@pytest.mark.parametrize(
  'successes, trials, low, high',
  [
    (7, 7, 0.6457, 1.0),  # the paper's held-out transfer
    (50, 50, 0.9287, 1.0),
    (4, 200, 0.0078, 0.0503),  # GSM8K base rate measured on the H200
    (0, 10, 0.0, 0.2775),
    (68, 200, 0.2779, 0.4081),
  ],
)
def test_wilson_known_values(successes, trials, low, high):
  got_low, got_high = stats.wilson(successes, trials)
  assert got_low == pytest.approx(low, abs=1e-4)
  assert got_high == pytest.approx(high, abs=1e-4)


def test_wilson_ends_are_exact():
  assert stats.wilson(0, 5)[0] == 0.0
  assert stats.wilson(5, 5)[1] == 1.0


def test_wilson_widens_with_confidence():
  low90, high90 = stats.wilson(10, 40, confidence=0.90)
  low99, high99 = stats.wilson(10, 40, confidence=0.99)
  assert low99 < low90 < 0.25 < high90 < high99


@pytest.mark.parametrize('successes, trials', [(0, 0), (1, 0), (-1, 5), (6, 5)])
def test_wilson_refuses_impossible_counts(successes, trials):
  with pytest.raises(ValueError):
    stats.wilson(successes, trials)


def test_rate_to_json():
  rate = stats.rate(4, 200)
  body = json.loads(json.dumps(rate.to_json()))
  assert body['successes'] == 4 and body['trials'] == 200
  assert body['rate'] == 0.02 and body['confidence'] == 0.95
  assert (body['low'], body['high']) == stats.wilson(4, 200)


@pytest.mark.parametrize(
  'max_rate, confidence', [(0.05, 0.95), (0.1, 0.95), (0.05, 0.9), (0.01, 0.99)]
)
def test_trials_to_bound_is_the_fewest_that_can_bound_the_rate(max_rate, confidence):
  n = stats.trials_to_bound(max_rate, confidence=confidence)
  assert stats.wilson(0, n, confidence=confidence)[1] <= max_rate
  assert stats.wilson(0, n - 1, confidence=confidence)[1] > max_rate
  assert stats.trials_to_bound(0.05) == 73
  with pytest.raises(ValueError, match='must lie in'):
    stats.trials_to_bound(0.0)
