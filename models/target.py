"""`GraftTarget`: what a model tells the method about the state it computes.

The model hands it out (`Gemma.graft_target`); `capture`, `graft`,
`check_compatible` and `restore` take it in place of a fingerprint and a
position scheme passed one by one.
"""

from __future__ import annotations

import dataclasses


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
  """

  fingerprint: str
  position_scheme: str
  dtype: str
  kernels: tuple[tuple[str, str], ...]
  chunk_invariant: bool

  def __post_init__(self):
    for name in ('fingerprint', 'position_scheme', 'dtype'):
      if not isinstance(getattr(self, name), str):
        raise TypeError(f'{name} must be a str, got {getattr(self, name)!r}')
    object.__setattr__(self, 'kernels', tuple((str(op), str(i)) for op, i in self.kernels))
    object.__setattr__(self, 'chunk_invariant', bool(self.chunk_invariant))
