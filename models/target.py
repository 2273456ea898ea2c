"""`GraftTarget`: what a model tells the method about the state it computes.

The model hands it out (`Gemma.graft_target`); `capture`, `graft`,
`check_compatible` and `restore` take it in place of a fingerprint and a
position scheme passed one by one.

A target may carry what its fingerprint is made of (`identity`: the config's fields, the
weights' and the tokenizer's digests, the cache layout). Every target built with one is
remembered by fingerprint for the life of the process, so a refusal of a block from another
model can say what differs (`describe_other_model`, `describe_difference`), not only that
two hashes do.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping
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
    identity: what the fingerprint hashes, or None: {'config': the config's fields (its
      canonical JSON form), 'weights': digest, 'tokenizer': digest or 'none',
      'local_cache': the sliding-window layers' cache layout}. Not compared (the
      fingerprint says it); remembered by fingerprint for `describe_other_model`.
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
  identity: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
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
    if self.identity is not None:
      _remember(self)


# What targets with an identity seen in this process said, by fingerprint (the most recent
# kept): their compared fields and identity, not the target (its `first_values` holds the
# model's weights).
_KNOWN: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
_KNOWN_LIMIT = 256
_MAX_NAMED = 8  # config fields named in one description


def _remember(target: GraftTarget) -> None:
  fields = dataclasses.fields(GraftTarget)
  _KNOWN[target.fingerprint] = {
    f.name: getattr(target, f.name) for f in fields if f.name != 'first_values'
  }
  _KNOWN.move_to_end(target.fingerprint)
  while len(_KNOWN) > _KNOWN_LIMIT:
    _KNOWN.popitem(last=False)


def known(fingerprint: str) -> GraftTarget | None:
  """The target of `fingerprint` built with an identity in this process (without its
  `first_values`), or None."""
  record = _KNOWN.get(fingerprint)
  return None if record is None else GraftTarget(**record)


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + '...'


def _digest(value: Any) -> str:
  return repr(value[:16] + '…') if isinstance(value, str) and len(value) == 64 else repr(value)


def describe_difference(a: GraftTarget, b: GraftTarget) -> str:
  """What differs between the models of targets `a` and `b`, as 'name: a-value != b-value'
  items joined by '; ': config fields (window, heads, ...; at most 8 named, then a count),
  the cache layout, the weights' and the tokenizer's digests, the position scheme, dtype
  and kernels. Where either lacks an identity, says so; '' where nothing differs."""
  items = []
  for name in ('position_scheme', 'dtype', 'kernels'):
    if getattr(a, name) != getattr(b, name):
      items.append(f'{name}: {_short(getattr(a, name))} != {_short(getattr(b, name))}')
  if a.identity is None or b.identity is None:
    missing = ' and '.join(n for n, t in (('first', a), ('second', b)) if t.identity is None)
    return '; '.join(items + [f'the {missing} model does not say what its fingerprint hashes'])
  config_a, config_b = a.identity.get('config', {}), b.identity.get('config', {})
  fields = [
    f'config {name}: {_short(config_a.get(name, "unset"))} != {_short(config_b.get(name, "unset"))}'
    for name in sorted(set(config_a) | set(config_b))
    if config_a.get(name, 'unset') != config_b.get(name, 'unset')
  ]
  if len(fields) > _MAX_NAMED:
    fields = fields[:_MAX_NAMED] + [f'and {len(fields) - _MAX_NAMED} more config fields']
  items += fields
  for name, label in (('local_cache', 'cache layout'), ('weights', 'weights digest')):
    if a.identity.get(name) != b.identity.get(name):
      items.append(f'{label}: {_digest(a.identity.get(name))} != {_digest(b.identity.get(name))}')
  if a.identity.get('tokenizer') != b.identity.get('tokenizer'):
    items.append(
      f'tokenizer digest: {_digest(a.identity.get("tokenizer"))} !='
      f' {_digest(b.identity.get("tokenizer"))}'
    )
  return '; '.join(items)


def describe_other_model(fingerprint: str, target: GraftTarget) -> str:
  """Why a block of the model `fingerprint` is not for `target`: both fingerprints, then what
  differs (`describe_difference`) where that model was seen in this process, else what
  `target`'s fingerprint hashes, to compare with the block's maker by hand."""
  head = f'block was captured from another model: fingerprint {fingerprint[:16]}… != {target.fingerprint[:16]}…'
  other = known(fingerprint)
  if other is not None:
    diff = describe_difference(other, target)
    return f"{head} (block's model != this model: {diff})" if diff else head
  if target.identity is None:
    return f'{head} (neither model says what its fingerprint hashes)'
  mine = target.identity
  config = mine.get('config', {})
  return (
    f"{head} (the block's model was not loaded in this process; this model: window"
    f' {config.get("sliding_window")}, {config.get("num_layers", len(config.get("attention_types", [])))}'
    f' layers, cache layout {mine.get("local_cache")!r}, weights digest'
    f' {str(mine.get("weights"))[:16]}…, tokenizer digest {str(mine.get("tokenizer"))[:16]}…)'
  )
