"""Routers that abstain: thresholds fitted on a calibration split, reported on a disjoint one.

The library of experiments/route_calibration.py. A flywheel task's deposited questions are
indexed by each router (BM25, and the model's own embeddings), keyed by their item; three
groups of labelled queries are each halved by a seeded shuffle (`route.split`): the deposited
questions themselves, the task's held-out questions labelled with the deposited item they
belong to (reworded: a GSM-Symbolic instance of the item's template, or for qa_wikidata
another fact of the same subject), and the task's unrelated questions (no deposit answers
them: the router should abstain). `route.calibrate` fits each router's threshold on the
calibration half under a bound on false hits among unrelated queries (with `conservative`,
on their Wilson upper limit), then reports hit rates on deposited and reworded queries and
the false-hit rate on unrelated ones on the other half, each with its Wilson interval, and
whether that held-out rate's upper limit meets the bound (`route.Bound`); a router the data
cannot bound is recorded with the reason. Routing reads question text only: no block is
computed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from graftjax.flywheel import tasks
from graftjax.routing import route as route_lib


def queries(task: tasks.Task) -> route_lib.Queries:
  """The task's labelled routing queries; keys are deposited item ids.

  A held-out item is labelled with its target (`task.targets`) or else its template (the
  deposited item it was made from); one whose label is no deposited item is left out.
  """
  items = list(task.items())
  ids = {item.id for item in items}
  reworded = []
  for it in task.held_out_items():
    key = task.targets.get(it.id) if task.targets is not None else it.template
    if key in ids:
      reworded.append((it.question, key))
  return route_lib.Queries(
    deposited=[(item.question, item.id) for item in items],
    reworded=reworded,
    unrelated=list(task.unrelated()) if task.unrelated else [],
  )


def routers(model) -> list[route_lib.Router]:
  """The routers calibrated: BM25, and the model's embeddings (both without a threshold)."""
  return [route_lib.BM25Router(), route_lib.EmbeddingRouter(model)]


def experiment(
  task: tasks.Task,
  routers_to_fit: Sequence[route_lib.Router],
  *,
  seed: int,
  max_false_hit: float,
  header: dict[str, Any],
  conservative: bool = True,
) -> dict[str, Any]:
  """Every router calibrated on `task`'s queries; the result (after `header`).

  A router no threshold fits (too few unrelated queries to bound conservatively, or none
  meets the bound) is recorded as {'refused': why}.

  Raises:
    ValueError: too few queries to split (`route.calibrate`).
  """
  labelled = queries(task)
  deposited = list(task.items())
  fitted = {}
  for router in routers_to_fit:
    router.add_many((item.id, item.question) for item in deposited)
    try:
      fit = route_lib.calibrate(
        router, labelled, seed=seed, max_false_hit=max_false_hit, conservative=conservative
      )
    except route_lib.FitError as e:  # too few queries to bound, or none meets the bound
      fitted[type(router).__name__] = {'refused': str(e)}
      continue
    fitted[type(router).__name__] = fit.to_json()
  texts = '\0'.join(q for q, _ in labelled.labelled()).encode()
  return {
    **header,
    'inputs': {**header.get('inputs', {}), 'queries_sha256': hashlib.sha256(texts).hexdigest()},
    'task': task.name,
    'queries': labelled.counts(),
    'seed': seed,
    'max_false_hit': max_false_hit,
    'conservative': conservative,
    'routers': fitted,
    'summary': {name: summary(c) for name, c in fitted.items()},
  }


def summary(calibration: dict[str, Any]) -> dict[str, Any]:
  """The report split's rates at the fitted threshold, and whether held-out false hits are
  bounded (their Wilson upper limit at most the bound, `route.Bound`); or why no threshold
  was fitted."""
  if 'refused' in calibration:
    return {'refused': calibration['refused']}
  report = calibration['report']
  return {
    'threshold': calibration['threshold'],
    'deposited': report['deposited'],
    'reworded': report['reworded'],
    'false_hit': report['false_hit'],
    'held_out': calibration['held_out'],
  }


def format_rows(result: dict[str, Any]) -> str:
  """One line per router: threshold, the report split's three rates, and the held-out bound."""
  count = lambda r: f'{r["successes"]}/{r["trials"]}' if r else '-'
  lines = []
  for name, s in result['summary'].items():
    if 'refused' in s:
      lines.append(f'{name:>16} no threshold: {s["refused"]}')
      continue
    bound = s['held_out']
    said = (
      f'Wilson upper limit {bound["upper"]:.1%} <= {bound["max_false_hit"]:.1%}'
      if bound['met']
      else f'not bounded: {bound["why"]}'
    )
    lines.append(
      f'{name:>16} threshold {s["threshold"]}  deposited {count(s["deposited"])}'
      f'  reworded {count(s["reworded"])}  false hits {count(s["false_hit"])} ({said})'
    )
  return '\n'.join(lines)


def template_ids(spec: str) -> list[int]:
  """'0-99' or '0,1,5' -> template ids; '' -> none."""
  out = []
  for part in filter(None, (p.strip() for p in spec.split(','))):
    first, _, last = part.partition('-')
    out += range(int(first), int(last) + 1) if last else [int(first)]
  return out
