"""The figures of a flywheel result, from its attempts alone.

`graftjax.flywheel.loop` writes these summaries and `rescore` recomputes
them from the recorded attempts, with the same code, so floats compare
exactly. Pure arithmetic on JSON records: no model, no jax.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from graftjax import stats

PHASES = ('base', 'recurrence', 'transfer_base', 'transfer_flywheel')


def summarize(base, recurrence, transfer, unsolved_ids: Iterable[str]) -> dict[str, Any]:
  """Accuracy (Wilson 95%) and decode tokens per phase; recomputable from the attempts.

  Args:
    base: the base model's attempt records (every sample).
    recurrence: the recurrence phase's attempt records.
    transfer: the transfer phases' attempt records (base and flywheel).
    unsolved_ids: ids of the items asked again in recurrence.
  """
  ids = set(unsolved_ids)
  spent = sum(r['decode_tokens'] for r in base if r['item_id'] in ids)
  out = {'recurrence_base_decode_tokens': spent, 'recurrence_items': len(ids)}
  for phase, records in (
    ('base', [r for r in base if r['sample'] == 0]),
    ('recurrence', recurrence),
    ('transfer_base', [r for r in transfer if r['phase'] == 'transfer_base']),
    ('transfer_flywheel', [r for r in transfer if r['phase'] == 'transfer_flywheel']),
  ):
    out[phase] = phase_summary(records)
  return out


def phase_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Items, accuracy with its Wilson interval, decode tokens and seconds of one phase."""
  if not records:
    return {'items': 0}
  correct = sum(bool(r['verdict']['verdict']) for r in records)
  tokens = [r['decode_tokens'] for r in records]
  return {
    'items': len(records),
    'accuracy': stats.rate(correct, len(records)).to_json(),
    'decode_tokens': int(sum(tokens)),
    'decode_tokens_per_answer': float(np.mean(tokens)),
    'seconds_per_answer': float(np.mean([r['seconds'] for r in records])),
  }


def grafted_vs_prompted(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Counts of byte-equal logits and equal tokens, median seconds, over the items."""
  return {
    'items': len(items),
    'logits_byte_equal': sum(e['logits_byte_equal'] for e in items),
    'tokens_equal': sum(e['tokens_equal'] for e in items),
    'graft_seconds_median': float(np.median([e['graft_seconds'] for e in items]))
    if items
    else None,
    'prompted_seconds_median': float(np.median([e['prompted_seconds'] for e in items]))
    if items
    else None,
  }
