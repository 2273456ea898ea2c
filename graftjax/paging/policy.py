"""Page-in or recompute: the store's choice for a block of n tokens, from measured costs.

Both paths give byte-equal logits (the bench asserts it), so the choice is
only about time. `Policy` holds measured (tokens, page-in seconds,
recompute seconds) points; between two measured sizes each cost is
interpolated linearly in n; above the largest it is extrapolated from the
last two, below the smallest it is held at the smallest's (no measurement
says how a shorter block costs). The crossover is the size where the two
cost lines meet.

Page-in is measured from a local store. With a `TierCost` (a remote tier's
measured bytes/s and round-trip seconds, e.g. fitted to bench_store_tier's
result) and the block's bytes per token, a page-in also pays the fetch from
that tier: a slow tier moves the crossover up, and can flip a block to
recompute that a local store would page in.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

Choice = Literal['page_in', 'recompute']

# Round trips of a block's read from an object store: the listing with its small files, then
# its chunks (`graftjax.store.read`).
ROUND_TRIPS = 2


@dataclasses.dataclass(frozen=True)
class TierCost:
  """What fetching from a storage tier costs, measured.

  Attributes:
    bytes_per_s: the tier's sustained bytes per second, requests in flight at once.
    request_s: seconds of one round trip (the fixed cost of a request).
  """

  bytes_per_s: float
  request_s: float

  def __post_init__(self):
    if not self.bytes_per_s > 0 or not self.request_s >= 0:
      raise ValueError(
        f'bytes_per_s must be positive and request_s not negative, got {self.bytes_per_s},'
        f' {self.request_s}'
      )

  def seconds(self, n_bytes: float, round_trips: int = ROUND_TRIPS) -> float:
    """Seconds to fetch a block of n_bytes in `round_trips` round trips."""
    return round_trips * self.request_s + n_bytes / self.bytes_per_s

  @classmethod
  def from_bench(cls, result: dict[str, Any], *, column: str = 's3_restore') -> TierCost:
    """Fitted to a bench_store_tier result: its rows' best seconds of `column` ('s3_restore'
    or 'floor') against their bytes, a line (least squares) whose slope is 1 / bytes_per_s
    and whose intercept (held at 0 or more) is `ROUND_TRIPS` round trips."""
    rows = result['rows']
    if len(rows) < 2:
      raise ValueError(f'a tier cost is fitted to 2 or more block sizes, got {len(rows)}')
    nbytes = np.asarray([r['bytes'] for r in rows], float)
    seconds = np.asarray([r[column]['best_s'] for r in rows], float)
    slope, intercept = np.polyfit(nbytes, seconds, 1)
    if not slope > 0:
      raise ValueError(f'{column} does not grow with bytes: slope {slope}')
    return cls(bytes_per_s=float(1 / slope), request_s=max(float(intercept), 0.0) / ROUND_TRIPS)

  def to_json(self) -> dict[str, float]:
    return {'bytes_per_s': self.bytes_per_s, 'request_s': self.request_s}


@dataclasses.dataclass(frozen=True)
class Policy:
  """Measured costs of both paths by block size.

  Attributes:
    tokens: measured block sizes, increasing.
    page_in_s: seconds to read + verify + install + first query, per size.
    recompute_s: seconds to re-prefill + first query, per size.
    tier: the cost of fetching the block from the tier it is kept on, added to
      page-in; None: page-in as measured (a local store).
    bytes_per_token: the stored block's bytes per token, fetched from `tier`.
  """

  tokens: tuple[int, ...]
  page_in_s: tuple[float, ...]
  recompute_s: tuple[float, ...]
  tier: TierCost | None = None
  bytes_per_token: float = 0.0

  def __post_init__(self):
    if not len(self.tokens) == len(self.page_in_s) == len(self.recompute_s) >= 1:
      raise ValueError('tokens, page_in_s and recompute_s must be equally long and not empty')
    if list(self.tokens) != sorted(set(self.tokens)):
      raise ValueError(f'tokens must increase, got {self.tokens}')
    if self.tier is not None and not self.bytes_per_token > 0:
      raise ValueError(f'a tier needs the bytes per token, got {self.bytes_per_token}')

  def on_tier(self, tier: TierCost, bytes_per_token: float) -> Policy:
    """This policy with each page-in first fetching the block from `tier`."""
    return dataclasses.replace(self, tier=tier, bytes_per_token=float(bytes_per_token))

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
    tier = data.get('tier')
    return cls(
      tokens=tuple(int(n) for n in data['tokens']),
      page_in_s=tuple(float(s) for s in data['page_in_s']),
      recompute_s=tuple(float(s) for s in data['recompute_s']),
      tier=None if tier is None else TierCost(**tier),
      bytes_per_token=float(data.get('bytes_per_token', 0.0)),
    )

  def cost(self, n_tokens: float) -> dict[str, float]:
    """Estimated seconds of each path for a block of n_tokens."""
    page_in = _linear(self.tokens, self.page_in_s, n_tokens)
    if self.tier is not None:
      page_in += self.tier.seconds(self.bytes_per_token * n_tokens)
    return {'page_in': page_in, 'recompute': _linear(self.tokens, self.recompute_s, n_tokens)}

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
    gap = lambda n: self.cost(n)['recompute'] - self.cost(n)['page_in']
    if gap(grid[0]) >= 0:
      return float(grid[0])
    for lo, hi in itertools.pairwise(grid):
      if gap(hi) >= 0 > gap(lo):  # linear between grid points: solve for the crossing
        return lo + (hi - lo) * (-gap(lo)) / (gap(hi) - gap(lo))
    return None

  def to_json(self) -> dict[str, Any]:
    tier = {}
    if self.tier is not None:
      tier = {'tier': self.tier.to_json(), 'bytes_per_token': self.bytes_per_token}
    return {
      'tokens': list(self.tokens),
      'page_in_s': list(self.page_in_s),
      'recompute_s': list(self.recompute_s),
      **tier,
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
