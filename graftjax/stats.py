"""Binomial rates with Wilson score intervals.

    rate(4, 200)  # Rate(4, 200, low=0.0078..., high=0.0503..., confidence=0.95)

The Wilson interval (Wilson 1927) keeps its coverage near the nominal level
at small n and at rates near 0 or 1, where the normal (Wald) interval
collapses: 7/7 gives [0.646, 1.0], not [1.0, 1.0].
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any


def wilson(successes: int, trials: int, *, confidence: float = 0.95) -> tuple[float, float]:
  """The Wilson score interval (low, high) for successes out of trials.

  z is the exact normal quantile for `confidence` (1.959964 for 95%); the
  bounds are exactly 0 at no successes and 1 at all, and clamped to [0, 1].

  Raises:
    ValueError: if trials is not positive, successes lies outside
      [0, trials], or confidence outside (0, 1).
  """
  if trials <= 0:
    raise ValueError(f'a rate needs at least one trial, got {successes}/{trials}')
  if not 0 <= successes <= trials:
    raise ValueError(f'successes must lie in [0, {trials}], got {successes}')
  if not 0 < confidence < 1:
    raise ValueError(f'confidence must lie in (0, 1), got {confidence}')
  z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
  p, z2 = successes / trials, z * z
  denominator = 1 + z2 / trials
  center = (p + z2 / (2 * trials)) / denominator
  half = z / denominator * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
  low = 0.0 if successes == 0 else max(0.0, center - half)
  high = 1.0 if successes == trials else min(1.0, center + half)
  return low, high


def trials_to_bound(max_rate: float, *, confidence: float = 0.95) -> int:
  """The fewest trials at which 0 successes has a Wilson upper limit of at most max_rate.

  Fewer trials cannot bound a rate at max_rate, whatever they show: 73 for 5% at 95%
  (the upper limit at 0 of n is z^2 / (n + z^2)).

  Raises:
    ValueError: if max_rate lies outside (0, 1), or confidence outside (0, 1).
  """
  if not 0 < max_rate < 1 or not 0 < confidence < 1:
    raise ValueError(f'max_rate and confidence must lie in (0, 1), got {max_rate}, {confidence}')
  z2 = statistics.NormalDist().inv_cdf(0.5 + confidence / 2) ** 2
  n = max(1, math.floor(z2 * (1 - max_rate) / max_rate))  # at or just below the bound
  while wilson(0, n, confidence=confidence)[1] > max_rate:
    n += 1
  return n


@dataclasses.dataclass(frozen=True)
class Rate:
  """successes/trials with its Wilson interval [low, high] at `confidence`."""

  successes: int
  trials: int
  low: float
  high: float
  confidence: float = 0.95

  @property
  def value(self) -> float:
    return self.successes / self.trials

  def to_json(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), 'rate': self.value}


def rate(successes: int, trials: int, *, confidence: float = 0.95) -> Rate:
  """A `Rate` with its Wilson interval (raises as `wilson` does)."""
  low, high = wilson(successes, trials, confidence=confidence)
  return Rate(successes, trials, low, high, confidence)
