"""Page-in or recompute: the store's choice for a block of n tokens, from measured costs.

Both paths give byte-equal logits (the bench asserts it), so the choice is
only about time. `Policy` holds measured (tokens, page-in seconds,
recompute seconds) points; between two measured sizes each cost is
interpolated linearly in n; above the largest it is extrapolated from the
last two, below the smallest it is held at the smallest's (no measurement
says how a shorter block costs). The crossover is the size where the two
cost lines meet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

Choice = Literal['page_in', 'recompute']


@dataclasses.dataclass(frozen=True)
class Policy:
  """Measured costs of both paths by block size.

  Attributes:
    tokens: measured block sizes, increasing.
    page_in_s: seconds to read + verify + install + first query, per size.
    recompute_s: seconds to re-prefill + first query, per size.
  """

  tokens: tuple[int, ...]
  page_in_s: tuple[float, ...]
  recompute_s: tuple[float, ...]

  def __post_init__(self):
    if not len(self.tokens) == len(self.page_in_s) == len(self.recompute_s) >= 1:
      raise ValueError('tokens, page_in_s and recompute_s must be equally long and not empty')
    if list(self.tokens) != sorted(set(self.tokens)):
      raise ValueError(f'tokens must increase, got {self.tokens}')

  @classmethod
  def from_rows(cls, rows: Iterable[dict[str, Any]]) -> Policy:
    """From bench rows with 'tokens', 'page_in_s', 'recompute_s'."""
    rows = sorted(rows, key=lambda r: r['tokens'])
    return cls(
      tokens=tuple(int(r['tokens']) for r in rows),
      page_in_s=tuple(float(r['page_in_s']) for r in rows),
      recompute_s=tuple(float(r['recompute_s']) for r in rows),
    )

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> Policy:
    """From `to_json`'s output, e.g. a committed bench_paging_pagein result's 'policy'."""
    return cls(
      tokens=tuple(int(n) for n in data['tokens']),
      page_in_s=tuple(float(s) for s in data['page_in_s']),
      recompute_s=tuple(float(s) for s in data['recompute_s']),
    )

  def cost(self, n_tokens: int) -> dict[str, float]:
    """Estimated seconds of each path for a block of n_tokens."""
    return {
      'page_in': _linear(self.tokens, self.page_in_s, n_tokens),
      'recompute': _linear(self.tokens, self.recompute_s, n_tokens),
    }

  def choose(self, n_tokens: int) -> Choice:
    """'page_in' or 'recompute', whichever is estimated faster (page-in on a tie)."""
    if n_tokens <= 0:
      raise ValueError(f'n_tokens must be positive, got {n_tokens}')
    cost = self.cost(n_tokens)
    return 'recompute' if cost['recompute'] < cost['page_in'] else 'page_in'

  @property
  def crossover_tokens(self) -> float | None:
    """Smallest size from which page-in is faster (the cost lines' crossing).

    The smallest measured size if page-in is already faster there (the
    crossover lies at or below it: not measured); None if page-in is never
    estimated faster up to 1e7 tokens.
    """
    grid = sorted({*self.tokens, 10_000_000})
    gap = lambda n: (
      _linear(self.tokens, self.recompute_s, n) - _linear(self.tokens, self.page_in_s, n)
    )
    if gap(grid[0]) >= 0:
      return float(grid[0])
    for lo, hi in zip(grid, grid[1:]):
      if gap(hi) >= 0 > gap(lo):  # linear between grid points: solve for the crossing
        return lo + (hi - lo) * (-gap(lo)) / (gap(hi) - gap(lo))
    return None

  def to_json(self) -> dict[str, Any]:
    return {
      'tokens': list(self.tokens),
      'page_in_s': list(self.page_in_s),
      'recompute_s': list(self.recompute_s),
      'crossover_tokens': self.crossover_tokens,
    }


def _linear(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
  """Piecewise-linear through (xs, ys): held below xs[0], extrapolated above xs[-1]."""
  if x <= xs[0]:
    return float(ys[0])
  if len(xs) == 1:
    return float(ys[0]) * x / xs[0]  # one point: proportional to size above it
  xs, ys = np.asarray(xs, float), np.asarray(ys, float)
  i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
  slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
  return float(ys[i] + slope * (x - xs[i]))
