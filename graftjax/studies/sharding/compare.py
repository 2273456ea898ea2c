"""Per-sample digests of a sharded run against a one-device run of the same inputs.

    report = compare(sharded_result, single_result)

A sharded gate (`sharded_gate`) is compared with a one-device exactness gate
(experiments/exactness.py) on the fresh continuation logits' SHA-256; a sharded
`sharded_kernels` run with an invariance run (experiments/invariance.py) on the
single-pass logits' SHA-256. Samples are matched by source file and token-id
digests. The digests are expected equal only where the reduction order is the same
(one device along 'model'); otherwise the report names the contractions that
become all-reduces and the first sample whose digest differs.
"""

from __future__ import annotations

from typing import Any

from graftjax import ledger
from graftjax.errors import GraftjaxError
from graftjax.models.gemma import config as config_lib
from graftjax.studies.common import results


class CompareError(GraftjaxError, ValueError):
  """Two results that this comparison does not pair (names which and why)."""


def _sample_key(record: dict[str, Any]) -> tuple[str, str, str]:
  return (record['source'], record['sha256_prefix_ids'], record['sha256_continuation_ids'])


def _gate_digests(samples: list[dict[str, Any]]) -> dict[tuple, str]:
  return {_sample_key(s): s['fresh_vs_grafted']['logits']['sha256_reference'] for s in samples}


def _single_pass_digests(samples: list[dict[str, Any]]) -> dict[tuple, str]:
  return {_sample_key(s): s['sha256_single_pass'] for s in samples}


def split_reductions(sharded: dict[str, Any]) -> list[str]:
  """The contractions a 1 x N mesh turns into all-reduces of N partial sums, for the
  sharded result's model (its config and overrides) and mesh."""
  settings = sharded['settings']
  config = config_lib.get_config(settings['model'])
  n = sharded['mesh']['model']
  out = []
  if n > 1 and config.num_heads % n == 0:
    out.append(f'o-projection (the sum over {config.num_heads} heads x head dim, {n} partial sums)')
  if n > 1 and config.hidden_dim % n == 0:
    out.append(
      f'down-projection (the sum over the MLP hidden {config.hidden_dim}, {n} partial sums)'
    )
  return out


def _single(result: dict[str, Any], experiment: str) -> dict[str, Any]:
  """The one run of a one-device result (an exactness file holds one per dtype)."""
  if experiment == 'exactness':
    runs = [r for r in result.get('runs', []) if r.get('dtype') == 'bfloat16'] or result.get(
      'runs', []
    )
    if not runs:
      raise CompareError('the one-device exactness file holds no run')
    return runs[0]
  return result


def compare(sharded: dict[str, Any], single: dict[str, Any]) -> dict[str, Any]:
  """The per-sample digest comparison (see the module docstring); JSON-ready."""
  mode = sharded.get('mode')
  if mode == 'gate':
    run = _single(single, 'exactness')
    ours, theirs = _gate_digests(sharded['samples']), _gate_digests(run['samples'])
    what = 'fresh continuation logits'
    schedule_same = all(
      sharded['schedule'].get(k) == run['schedule'].get(k)
      for k in ('chunk_size', 'capacity', 'rollout_tokens')
    )
  elif mode == 'kernels':
    run = _single(single, 'invariance')
    if run.get('impl') != 'pallas':
      raise CompareError(f"the one-device invariance run is impl={run.get('impl')!r}, not 'pallas'")
    ours, theirs = _single_pass_digests(sharded['samples']), _single_pass_digests(run['samples'])
    what = 'single-pass logits under Pallas'
    schedule_same = sharded.get('capacity') == run.get('capacity')
  else:
    raise CompareError(f"a sharded result of mode {mode!r}: only 'gate' and 'kernels' compare")
  if sharded['settings']['dtype'] != run.get('dtype', sharded['settings']['dtype']):
    raise CompareError(f'dtypes differ: {sharded["settings"]["dtype"]} vs {run.get("dtype")}')
  reductions = split_reductions(sharded)
  matched = [k for k in ours if k in theirs]
  differing = [k for k in matched if ours[k] != theirs[k]]
  first = None
  if differing:
    k = differing[0]
    first = {'source': k[0], 'sha256_sharded': ours[k], 'sha256_single_device': theirs[k]}
  if not reductions:
    reason = 'one device along model: the same reduction order'
  else:
    reason = (
      'another summation order: on the 1 x {n} mesh the {r} end in all-reduces; each device'
      ' also runs its matmuls on a slice of columns (q, k, v, gate, up), whose kernel XLA'
      ' picks by shape'.format(n=sharded['mesh']['model'], r=' and the '.join(reductions))
    )
  return {
    'compared': what,
    'reduction_order_same': not reductions,
    'split_reductions': reductions,
    'schedule_same': schedule_same,
    'samples_sharded': len(ours),
    'samples_single_device': len(theirs),
    'samples_matched': len(matched),
    'samples_equal': len(matched) - len(differing),
    'first_differing': first,
    'reason': reason if differing else None,
    'expected_equal': not reductions and schedule_same,
    # None where no sample of one run is in the other: nothing was compared.
    'as_expected': (not differing) == (not reductions and schedule_same) if matched else None,
  }


def experiment(sharded_path: str, single_path: str, *, command: str) -> dict[str, Any]:
  """`compare` of two verified result files, with the header and both files' digests."""
  sharded, single = (ledger.verify_result(p) for p in (sharded_path, single_path))
  return {
    **results.header('sharded_compare', command=command),
    'mode': 'compare',
    'sharded': {'path': sharded_path, 'result_sha256': sharded['result_sha256']},
    'single_device': {'path': single_path, 'result_sha256': single['result_sha256']},
    'mesh': sharded['mesh'],
    **compare(sharded, single),
  }
