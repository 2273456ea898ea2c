"""The exactness gate: are two logit arrays the same, and if not, how far apart?

`compare(reference, candidate)` reports the SHA-256 of each array's bytes,
whether they are byte-equal, KL(reference || candidate) in float64, argmax
agreement and the largest absolute difference. Byte equality is the claim;
the other figures say how large a failure is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from graftjax import ledger


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Reference vs candidate logits [..., V].

  Attributes:
    sha256_reference, sha256_candidate: digests of the raw logit bytes.
    byte_equal: the digests (and bytes) are equal.
    kl_mean, kl_max: KL(reference || candidate) over rows, float64 nats.
    argmax_agreement: fraction of rows with the same argmax.
    max_abs_diff: largest |reference - candidate|.
    rows: number of logit rows compared.
  """

  sha256_reference: str
  sha256_candidate: str
  byte_equal: bool
  kl_mean: float
  kl_max: float
  argmax_agreement: float
  max_abs_diff: float
  rows: int

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def log_softmax64(logits: np.ndarray) -> np.ndarray:
  """float64 log-softmax over the last axis."""
  x = np.asarray(logits, np.float64)
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
  """KL(p || q) per row in float64, p = softmax(reference), q = softmax(candidate).

  Exactly 0.0 when the rows are equal (the same float64 ops on the same bits).
  """
  log_p = log_softmax64(reference)
  return _kl_from(log_p, np.exp(log_p), candidate)


def _kl_from(log_p: np.ndarray, p: np.ndarray, candidate: np.ndarray) -> np.ndarray:
  return np.sum(p * (log_p - log_softmax64(candidate)), axis=-1)


class ReferenceLogits:
  """A reference logit array prepared once for many comparisons.

  Its digest, float64 log-probabilities, probabilities and argmax are
  computed here, so comparing n candidates against one reference (the
  invariance experiment compares up to 8 batch rows per cell) costs one
  float64 log-softmax per candidate instead of three passes of exp. The
  figures are those of `compare`, bit for bit: the same operations on the
  same values.
  """

  def __init__(self, logits):
    self.logits = np.asarray(logits)
    if self.logits.size == 0:
      raise ValueError('nothing to compare: empty logits')
    self._rows = self.logits.reshape(-1, self.logits.shape[-1])
    self._rows64 = self._rows.astype(np.float64)
    self.sha256 = ledger.sha256_array(self.logits)
    self._log_p = log_softmax64(self._rows)
    self._p = np.exp(self._log_p)
    self._argmax = self._rows.argmax(-1)

  def compare(self, candidate) -> Comparison:
    """This reference vs `candidate` (same shape and dtype)."""
    cand = np.asarray(candidate)
    ref = self.logits
    if ref.shape != cand.shape or ref.dtype != cand.dtype:
      raise ValueError(
        f'cannot compare {ref.dtype}{list(ref.shape)} with {cand.dtype}{list(cand.shape)}'
      )
    rows_cand = cand.reshape(-1, cand.shape[-1])
    kl = _kl_from(self._log_p, self._p, rows_cand)
    sha_cand = ledger.sha256_array(cand)
    return Comparison(
      sha256_reference=self.sha256,
      sha256_candidate=sha_cand,
      byte_equal=self.sha256 == sha_cand and ref.tobytes() == cand.tobytes(),
      kl_mean=float(kl.mean()),
      kl_max=float(kl.max()),
      argmax_agreement=float(np.mean(self._argmax == rows_cand.argmax(-1))),
      max_abs_diff=float(np.max(np.abs(self._rows64 - rows_cand.astype(np.float64)))),
      rows=int(self._rows.shape[0]),
    )


def compare(reference, candidate) -> Comparison:
  """Compares two logit arrays of the same shape and dtype.

  Raises:
    ValueError: if shapes or dtypes differ (bytes cannot then be compared),
      or the arrays are empty.
  """
  return ReferenceLogits(reference).compare(candidate)


def summarize(comparisons: list[Comparison]) -> dict[str, Any]:
  """Totals over samples: byte-equal count, worst KL, mean argmax agreement."""
  if not comparisons:
    raise ValueError('no comparisons to summarize')
  return {
    'samples': len(comparisons),
    'byte_equal': sum(c.byte_equal for c in comparisons),
    'kl_max': max(c.kl_max for c in comparisons),
    'kl_mean': float(np.mean([c.kl_mean for c in comparisons])),
    'argmax_agreement': float(np.mean([c.argmax_agreement for c in comparisons])),
    'max_abs_diff': max(c.max_abs_diff for c in comparisons),
  }
