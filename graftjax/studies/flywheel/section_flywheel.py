"""The results page on the `flywheel` study:

Does a library of verified solutions make the frozen model better and cheaper?
"""

from __future__ import annotations

import statistics
from typing import Any

from graftjax.studies.common import results_page as page


def rate(r: dict[str, Any] | None) -> str:
  """A Wilson-interval rate record as 's/n = x% [low, high]'; '-' when absent."""
  if not r:
    return '-'
  return f'{r["successes"]}/{r["trials"]} = {page.pct(r["rate"])} [{page.pct(r["low"])}, {page.pct(r["high"])}]'


def _compare(base: dict[str, Any] | None, other: dict[str, Any] | None) -> str:
  """Which of two rates is higher by non-overlapping intervals, else that they overlap."""
  if not base or not other:
    return '-'
  if other['low'] > base['high']:
    return 'flywheel higher'
  if base['low'] > other['high']:
    return '**base higher**'
  return 'intervals overlap'


def phase_tokens(s: dict[str, Any]) -> str:
  return page.num(s['decode_tokens_per_answer']) if s.get('items') else '-'


def _transfer_sets(d: dict[str, Any]) -> list[tuple[str, str, str]]:
  """(held-out set, base phase, flywheel phase) of each transfer comparison in `d`.

  Phases are `transfer_base` / `transfer_flywheel`, optionally suffixed `/<set>`; without a
  suffix the set is named by the first segment of its items' ids (e.g. `mgs`).
  """
  out = []
  for phase in sorted(d['summary']):
    if not phase.startswith('transfer_base'):
      continue
    suffix = phase[len('transfer_base') :]
    other = 'transfer_flywheel' + suffix
    if other not in d['summary']:
      continue
    label = suffix.lstrip('/')
    if not label:
      ids = {a['item_id'] for a in d.get('attempts', []) if a.get('phase') == phase}
      label = ', '.join(sorted({i.split('/')[0] for i in ids})) or '?'
    out.append((label, phase, other))
  return out


def _rescored(results: list[page.Result]) -> list[str]:
  """What `graftjax.flywheel.rescore` says of each file, run as the page is made."""
  from graftjax.flywheel import rescore

  out = ['Re-scored now:', '']
  for r in results:
    if r.data.get('verifier', {}).get('name') == 'code':  # its verdicts re-run code: not here
      out.append(f'- {page.cite(r)}: {_CODE_RESCORE}')
      continue
    found = rescore.check(r.data)  # the file's own digest was verified when it was loaded
    verdict = (
      'every digest, verdict and figure agrees'
      if not found.problems
      else (f'{len(found.problems)} discrepancies: ' + '; '.join(found.problems))
    )
    out.append(f'- {page.cite(r)}: {verdict}')
  return out


_CODE_RESCORE = (
  'not re-run as the page is made (each verdict runs code in the sandbox): `python -m'
  ' graftjax.flywheel.rescore --verifiers=graftjax.flywheel.code_verifier <file>`; its output'
  ' is committed in logs/'
)


def _code_task(results: list[page.Result]) -> list[str]:
  """The code task: base pass@1, the seeded library, recurrence, grafted == prompted, routing."""
  if not results:
    return []
  rows = []
  for r in results:
    d, s = r.data, r.data['summary']
    sources = [x.get('source') for x in d.get('deposits', []) if x.get('key')]
    g = d.get('grafted_vs_prompted', {}).get('summary') or {}
    rows.append(
      [
        page.cite(r),
        s['base'].get('items', 0),
        rate(s['base'].get('accuracy')),
        f'{sources.count("self")} own + {sources.count("reference")} canonical',
        rate(s['recurrence'].get('accuracy')),
        f'{g.get("logits_byte_equal", 0)}/{g.get("items", 0)}',
      ]
    )
  out = [
    '',
    (
      '**A code task** (HumanEval, the `code` verifier running each answer against its tests in'
      ' the bubblewrap sandbox; every answer zero-shot in code mode). A problem the model did not'
      ' solve is deposited with its canonical solution once that passes its tests: recurrence is'
      ' measured on a *seeded library*, not on solutions the model found.'
    ),
    '',
    *page.table(
      (
        'file',
        'problems',
        'base model pass@1 (greedy)',
        'deposits: seeded library',
        'recurrence pass@1 (unsolved problems, grafted block)',
        'grafted == prompted (first logits)',
      ),
      rows,
    ),
    '',
    (
      'Routing of the code task (top-1; thresholds fitted on one half of the queries, reported'
      ' on the other: a deposited prompt to its block, the prose of its docstring to its block,'
      ' and problems never deposited, where a hit is false):'
    ),
    '',
  ]
  rows = []
  for r in results:
    for router, e in sorted(r.data.get('routing', {}).items()):
      c = e.get('calibration') or {}
      report = c.get('report', {})
      rows.append(
        [
          page.cite(r),
          router,
          c['threshold'] if isinstance(c.get('threshold'), str) else page.num(c.get('threshold')),
          rate(report.get('deposited')),
          rate(report.get('reworded')),
          rate(report.get('false_hit')),
        ]
      )
  return out + page.table(
    ('file', 'router', 'fitted threshold', 'deposited prompt', 'docstring prose', 'false hits'),
    rows,
  )


def render(results: list[page.Result]) -> list[str]:
  """The flywheel runs, then the answer bench and the router calibrations (by experiment)."""
  of = lambda name: [r for r in results if r.data.get('experiment') == name]
  others = {'bench_answer', 'route_calibration'}
  runs = [r for r in results if r.data.get('experiment') not in others]
  return (
    (_runs(runs) if runs else [])
    + _bench_answer(of('bench_answer'))
    + _calibration(of('route_calibration'))
  )


def _runs(results: list[page.Result]) -> list[str]:
  models = sorted({r.data.get('model', '?') for r in results})
  out = [
    'The base model attempts each item (few-shot prefix, stated budget); a verified solution of'
    " each (its own, else the dataset's reference when it verifies: its worked solution, or its"
    ' answer where it has none) is deposited as a block. *Recurrence*: the items it did not'
    ' solve are asked again, routed by exact question text to their block, grafted, answered.'
    ' *Transfer*: held-out items, never deposited, are answered by the base model and through'
    ' the nearest block. Intervals are Wilson 95%.'
    f' Every figure is for the model named ({", ".join(f"`{m}`" for m in models)}) only.'
    ' Re-check a file without a model: `python -m graftjax.flywheel.rescore <file>`.',
    '',
    *_rescored(results),
    '',
    '**Recurrence** (items the base model did not solve within its budget):',
    '',
  ]
  rows = []
  for r in results:
    d, s = r.data, r.data['summary']
    b, rec = d.get('budget', {}), s['recurrence']
    spent, used = s['recurrence_base_decode_tokens'], rec.get('decode_tokens')
    rows.append(
      [
        page.cite(r),
        d.get('model', '?'),
        r.device.split(',')[0],
        d.get('dtype', '?'),
        f'{b.get("samples", "?")} x {b.get("max_new_tokens", "?")} / {b.get("recall_tokens", "?")}',
        rate(s['base'].get('accuracy')),
        s['recurrence_items'],
        rate(rec.get('accuracy')),
        phase_tokens(rec),
        f'{used:,}' if used is not None else '-',
        f'{spent:,}',
        f'{used / spent:.3g}' if used is not None and spent else '-',
        page.num(rec.get('seconds_per_answer')),
      ]
    )
  out += page.table(
    (
      'file',
      'model',
      'device',
      'dtype',
      'budget: samples x base tokens / recall tokens',
      'base model on deposited items (greedy attempt)',
      'recurrence items',
      'recurrence accuracy',
      'decode tokens / answer',
      'decode tokens: flywheel',
      'decode tokens: base model spent on them',
      'flywheel / base',
      's / answer',
    ),
    rows,
  )
  rows = []
  for r in results:
    s = r.data['summary']
    for label, base, fly in _transfer_sets(r.data):
      if not s[fly].get('items'):  # no held-out items (a task run for recurrence only)
        continue
      rows.append(
        [
          page.cite(r),
          label,
          s[fly].get('items', 0),
          rate(s[base].get('accuracy')),
          rate(s[fly].get('accuracy')),
          _compare(s[base].get('accuracy'), s[fly].get('accuracy')),
          phase_tokens(s[base]),
          phase_tokens(s[fly]),
          sum(
            a.get('answered_by') == 'flywheel'
            for a in r.data.get('attempts', [])
            if a.get('phase') == fly
          ),
        ]
      )
  out += [
    '',
    '**Transfer** (held-out items disjoint from every deposited one; negative results kept):',
    '',
  ]
  out += page.table(
    (
      'file',
      'held-out set',
      'items',
      'base accuracy',
      'flywheel accuracy',
      'by the intervals',
      'decode tokens / answer: base',
      'flywheel',
      'answered through a block',
    ),
    rows,
  )
  rows = []
  for r in results:
    for router, e in sorted(r.data.get('routing', {}).items()):
      if 'threshold' not in e:  # fitted without held-out items: the code task's table
        continue
      rows.append(
        [
          page.cite(r),
          router,
          e['threshold'] if isinstance(e['threshold'], str) else page.num(e['threshold']),
          rate(e.get('accuracy')),
          rate(e.get('false_hit')),
          rate(e.get('abstain')),
        ]
      )
  out += [
    '',
    '**Routing** of the held-out items (top-1, to the block of the deposited item the held-out'
    " item's template was made from, or that it is paired with (qa_wikidata: the same subject);"
    ' below the threshold the router abstains):',
    '',
  ]
  out += page.table(
    ('file', 'router', 'threshold', 'accuracy', 'false hits (of all queries)', 'abstains'), rows
  )
  rows = []
  for r in results:
    g = r.data.get('grafted_vs_prompted', {}).get('summary') or {}
    graft, prompted = g.get('graft_seconds_median'), g.get('prompted_seconds_median')
    rows.append(
      [
        page.cite(r),
        f'{g.get("logits_byte_equal", 0)}/{g.get("items", 0)}',
        f'{g.get("tokens_equal", 0)}/{g.get("items", 0)}',
        page.num(graft),
        page.num(prompted),
        f'{graft / prompted:.2f}' if graft and prompted else '-',
      ]
    )
  out += [
    '',
    '**Grafted vs prompted**: each recurrence answer again with the same library text given as'
    ' a plain prompt (prefilled, no graft); first-answer logits compared by their bytes.',
    '',
  ]
  out += page.table(
    (
      'file',
      'first logits byte-equal',
      'answer tokens equal',
      'graft + answer s (median)',
      'prompted s (median)',
      'graft / prompted',
    ),
    rows,
  )
  out += _code_task([r for r in results if r.data.get('verifier', {}).get('name') == 'code'])
  metered = [r for r in results if r.data.get('energy')]
  out += ['', '**Energy** (joules per answer above the idle baseline):', '']
  if not metered:
    return out + ['No file here was measured (`--energy`, NVML, on a GPU).']
  rows = []
  for r in metered:
    e = r.data['energy']
    phases = e.get('phases', {})
    joules = lambda p, phases=phases: (
      page.num(phases[p].get('joules_per_answer')) if p in phases else '-'
    )
    rows.append(
      [
        page.cite(r),
        e.get('device', '?'),
        page.num(e.get('idle_watts')),
        joules('base'),
        joules('recurrence'),
        joules('transfer_base'),
        joules('transfer_flywheel'),
        e.get('scope', '?'),
      ]
    )
  return out + page.table(
    (
      'file',
      'device',
      'idle W',
      'J / answer: base',
      'recurrence',
      'transfer: base',
      'transfer: flywheel',
      'scope',
    ),
    rows,
  )


def _bench_answer(results: list[page.Result]) -> list[str]:
  """Answer latency at a repeated length against unseen ones (experiments/bench_answer.py)."""
  if not results:
    return []
  out = [
    '',
    (
      '**Answer latency at new lengths** (one wall time per answer: restore + query + decode;'
      ' medians; the CPU is shared, so only ratios within a file are read). *bucketed*: the'
      " flywheel's answer, the query padded to the library's chunk bucket; *unbucketed*: the"
      ' query prefilled unpadded, one compiled program per query length. Goal: an unseen length'
      ' in a bucket within 1.5x of a repeated one.'
    ),
    '',
  ]
  rows = []
  for r in results:
    for name, arm in r.data['arms'].items():
      across = arm.get('unseen_across_over_repeated')
      rows.append(
        [
          page.cite(r),
          r.data.get('model', '?'),
          name,
          page.num(arm['first']['seconds']),
          page.num(arm['repeated_median_s']),
          page.num(arm['unseen_in_bucket_median_s']),
          f'{arm["unseen_in_bucket_over_repeated"]:.2f}x',
          page.num(arm.get('unseen_across_median_s')),
          f'{across:.2f}x' if across is not None else '-',
        ]
      )
  out += page.table(
    (
      'file',
      'model',
      'arm',
      'first answer s',
      'repeated s',
      'unseen in bucket s',
      'unseen / repeated',
      'unseen across buckets s',
      'across / repeated',
    ),
    rows,
  )
  out += ['', 'Deposits of the bench items (padded last chunk: one program for every length):', '']
  for r in results:
    first, *later = [d['seconds'] for d in r.data.get('deposits', [])]
    if later:
      out.append(
        f'- {page.cite(r)}: the first {page.num(first)} s (it compiles), the {len(later)} later'
        f' ones {page.num(statistics.median(later))} s (median)'
      )
  return out


def _calibration(results: list[page.Result]) -> list[str]:
  """Router thresholds fitted on a calibration split (experiments/route_calibration.py)."""
  if not results:
    return []
  out = [
    '',
    (
      '**Calibrated routing**: each router indexes the deposited questions; deposited, reworded'
      ' (held-out, labelled with their deposited item) and unrelated questions are each halved'
      ' by a seeded shuffle; the threshold is fitted on one half under the false-hit bound on'
      ' unrelated questions (in a run that records `conservative`, on its Wilson 95% upper'
      ' limit) and reported on the other half (top-1 hits to the right block; false hits: any'
      ' hit on an unrelated question, "bounded" when their Wilson upper limit on this half is'
      ' at most the bound; "none": no threshold could be fitted on the data).'
    ),
    '',
  ]
  rows = []
  for r in results:
    for name, s in sorted(r.data['summary'].items()):
      bound = f'{page.pct(r.data["max_false_hit"])} (seed {r.data["seed"]})'
      if 'refused' in s:  # the data could not bound this router's false hits
        rows.append([page.cite(r), r.data.get('task', '?'), name, 'none', bound, '-', '-', '-'])
        continue
      held_out = s.get('held_out')  # results before held-out bounds have none
      said = '' if held_out is None else (' (bounded)' if held_out['met'] else ' (not bounded)')
      rows.append(
        [
          page.cite(r),
          r.data.get('task', '?'),
          name,
          page.num(s['threshold']) if not isinstance(s['threshold'], str) else s['threshold'],
          bound,
          rate(s['deposited']),
          rate(s['reworded']),
          rate(s['false_hit']) + said,
        ]
      )
  return out + page.table(
    (
      'file',
      'task',
      'router',
      'fitted threshold',
      'bound in the fit (split seed)',
      'deposited: hits (report half)',
      'reworded: hits',
      'unrelated: false hits',
    ),
    rows,
  )
