"""`GraftTarget`: what a model tells the method about the state it computes.

The model hands it out (`Gemma.graft_target`); `capture`, `graft`,
`check_compatible` and `restore` take it in place of a fingerprint and a
position scheme passed one by one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class GraftTarget:
  """The identity and numerics of the model a cache belongs to.

  Attributes:
    fingerprint: SHA-256 over the model's config, weights and tokenizer.
    position_scheme: how positions enter attention ('rope', 'alibi', ...).
    dtype: numpy name of the cache dtype ('float32', 'bfloat16').
    kernels: (op, impl) pairs, e.g. (('attention', 'xla'), ...): which
      implementation computes each numerics-relevant op.
    chunk_invariant: whether those kernels give the same bits for a row
      whatever the chunk, batch size and cache capacity around it (all ops
      on the Pallas kernels). Only then may a block enter a cache of another
      shape than the one it was computed in and stay byte-exact.
    split_invariant: whether a block computed alone keeps its bits when it
      moves by whole attention splits within a cache of the same shape:
      attention sums over the slots in splits anchored at absolute slots
      (the Pallas kernel, or the 'xla_split' attention). Composition needs
      it (docs/composition.md); without `chunk_invariant` the block and its
      reference must also share the capacity and the prefill's chunks.
    first_values: token ids [n] -> the first layer's values [n, K, H] of
      those tokens (a first-layer value depends on its token alone), or None
      where the model does not say; `capture` checks a block's token ids
      against its rows with it. Not compared: targets equal in the rest are
      the same model.
    windows: W of each layer that caches keys and values (the cache's layers, in
      order), None for a global layer; a query at position p of a layer of window
      W sees keys at positions p - W < q <= p, so a continuation right after a
      block sees its last W - 1 rows there. `capture` keeps only those rows; ()
      where the model does not say (then every row is kept).
  """

  fingerprint: str
  position_scheme: str
  dtype: str
  kernels: tuple[tuple[str, str], ...]
  chunk_invariant: bool
  split_invariant: bool = False
  first_values: Callable[[np.ndarray], Any] | None = dataclasses.field(
    default=None, compare=False, repr=False
  )
  windows: tuple[int | None, ...] = ()

  def __post_init__(self):
    for name in ('fingerprint', 'position_scheme', 'dtype'):
      if not isinstance(getattr(self, name), str):
        raise TypeError(f'{name} must be a str, got {getattr(self, name)!r}')
    object.__setattr__(self, 'kernels', tuple((str(op), str(i)) for op, i in self.kernels))
    object.__setattr__(self, 'chunk_invariant', bool(self.chunk_invariant))
    object.__setattr__(self, 'split_invariant', bool(self.split_invariant))
    object.__setattr__(self, 'windows', tuple(self.windows))
    if any(w is not None and (type(w) is not int or w <= 0) for w in self.windows):
      raise ValueError(f'windows must be positive ints or None, got {self.windows}')
