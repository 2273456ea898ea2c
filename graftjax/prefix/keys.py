"""Chained span keys: what a stored span is, bound to the numerics that computed it.

A prompt is cut into spans of S tokens from position 0; span j holds tokens
[jS, jS + S) (the last one may be shorter). Its key is a SHA-256 over the
domain (model fingerprint, cache dtype, kernels, and, where the kernels are not
chunk-invariant, the cache capacity and the prefill chunk size), the previous
span's key (`ROOT` for span 0) and the span's own token ids, as vLLM keys its
blocks by their parent's hash: a key names a whole prefix, not one span.

A key is a name for lookup only. Before a span is grafted its block's own metadata
(token ids, positions, fingerprint) is checked against the prompt (`spans.check`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

VERSION = 'graftjax.prefix/1'
ROOT = '0' * 64  # the parent of span 0


@dataclasses.dataclass(frozen=True)
class Domain:
  """The numerics a span's rows depend on.

  Attributes:
    fingerprint: the model's (config, weights, tokenizer, sliding-layer cache layout).
    dtype: the cache dtype ('float32', 'bfloat16').
    kernels: (op, impl) pairs.
    chunk_invariant: whether the kernels give a row the same bits whatever the chunk,
      batch and capacity around it (then `capacity` and `chunk_size` are None).
    capacity: cache slots the rows were computed in (kernels not chunk-invariant).
    chunk_size: prefill tokens per call (kernels not chunk-invariant).
  """

  fingerprint: str
  dtype: str
  kernels: tuple[tuple[str, str], ...]
  chunk_invariant: bool
  capacity: int | None = None
  chunk_size: int | None = None

  @property
  def digest(self) -> str:
    """SHA-256 of the domain's JSON form (sorted keys)."""
    blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def domain_of(target, *, capacity: int, chunk_size: int) -> Domain:
  """The domain of a model's `graft_target` prefilled in a cache of `capacity` slots with
  chunks of `chunk_size` (both bound only where the kernels are not chunk-invariant)."""
  invariant = bool(target.chunk_invariant)
  return Domain(
    fingerprint=target.fingerprint,
    dtype=target.dtype,
    kernels=tuple(target.kernels),
    chunk_invariant=invariant,
    capacity=None if invariant else int(capacity),
    chunk_size=None if invariant else int(chunk_size),
  )


def span_key(domain_digest: str, parent: str, token_ids) -> str:
  """Key [64 hex] of the span holding `token_ids` after the prefix named `parent`."""
  tokens = np.asarray(token_ids, dtype='<i4').reshape(-1)
  h = hashlib.sha256()
  h.update(f'{VERSION}\n{domain_digest}\n{parent}\n{tokens.size}\n'.encode())
  h.update(tokens.tobytes())
  return h.hexdigest()
