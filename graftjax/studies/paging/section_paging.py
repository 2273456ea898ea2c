"""The results page on the `paging` study: Paged context: how small, how exact, how fast?"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

from graftjax.studies.common import results_page as page

LATENCY_SPREAD_GOAL = 0.20  # access latency within +-20% from 10 to >= 10,000 blocks


def _by_count(mapping: dict[str, Any]) -> list[tuple[int, float]]:
  """Sorted (count, value) of a {count: value} record, other keys ignored."""
  return sorted((int(k), v) for k, v in mapping.items() if str(k).isdigit())


def _spread(values: Sequence[float]) -> float:
  """Largest relative deviation from the first value."""
  return max(abs(v / values[0] - 1) for v in values)


def _us(seconds: float) -> str:
  us = 1e6 * seconds
  return f'{us:,.0f}' if us >= 1000 else page.num(us)


def _paging_route(r: page.Result) -> list[str]:
  d = r.data
  rows = [
    [
      row['router'],
      f'{row["entries"]:,}',
      _us(row['lookup_median_s']),
      _us(row['lookup_p90_s']),
      _us(row['route_median_s']),
      _us(row['sqlite_get_median_s']),
      page.num(row['index_build_s']),
      f'{row["catalog_bytes"]:,}',
      page.pct(row['top1_own_piece']),
    ]
    for row in sorted(d['rows'], key=lambda x: (x['router'], x['entries']))
  ]
  ratios = ', '.join(
    f'{router} {v["largest_over_smallest"]:.2f}x'
    for router, v in sorted(d['summary']['lookup_median_s'].items())
  )
  out = [
    f'**Catalog lookup** (route, k=1, plus the sqlite fetch), {page.cite(r)}:'
    f' {d["rows"][0]["queries"]} queries per size; lookup at the largest size over the'
    f' smallest: {ratios}. Timing: {d.get("timing", "?")}.',
    '',
  ]
  return out + page.table(
    (
      'router',
      'entries',
      'lookup us (median)',
      'p90',
      'route us',
      'sqlite get us',
      'index build s',
      'catalog bytes',
      'top-1 own piece',
    ),
    rows,
  )


def _paging_pagein(r: page.Result) -> list[str]:
  d, s = r.data, r.data['summary']
  crossover = s.get('crossover_tokens')
  smallest = min(row['tokens'] for row in d['rows'])
  if crossover is None:
    where = 'page-in is never estimated faster'
  elif crossover <= smallest:
    where = f'page-in is faster at every size measured, from {smallest:,} tokens'
  else:
    where = f'page-in is faster from {crossover:,.0f} tokens'
  rows = [
    [
      f'{row["tokens"]:,}',
      f'{row["page_in_s"]:.3f}',
      f'{row["recompute_s"]:.3f}',
      s['choice'].get(str(row['tokens']), '-'),
      page.yes(row['query_logits_byte_equal']),
      f'{row["page_bytes_per_token"]:,.0f}',
      f'{row["block_bytes_per_token"]:,.0f}',
      f'{row["block_bytes_per_token"] / row["page_bytes_per_token"]:.1f}x',
    ]
    for row in sorted(d['rows'], key=lambda x: x['tokens'])
  ]
  out = [
    f'**Page-in vs re-prefill**, {page.cite(r)}, {d.get("model", "?")} {d.get("dtype", "?")}, chunks'
    f' of {d.get("chunk_size", "?")}: read + verify + install a page and run the next token,'
    f' against prefilling the block again; both paths asserted byte-equal. Crossover: {where}.'
    f' Timing: {_timing(d)}.',
    '',
  ]
  out += page.table(
    (
      'block tokens',
      'page-in s',
      're-prefill s',
      'store picks',
      'logits byte-equal',
      'page B / token (disk)',
      'block B / token (disk)',
      'smaller by',
    ),
    rows,
  )
  llama = d.get('versus_llamacpp_state_file') or {}
  if llama:
    out += [
      '',
      "Against llama.cpp's state file of the same prefix (K/V bytes from the config):",
      '',
    ]
    out += page.table(
      ('tokens', 'llama.cpp bytes', 'block f32 / llama.cpp', 'page f32', 'page bf16'),
      [
        [
          f'{n:,}',
          f'{e["llamacpp_state_file_bytes"]:,}',
          f'{e["block_float32_over_llamacpp"]:.2f}',
          f'{e["page_float32_over_llamacpp"]:.2f}',
          f'{e["page_bfloat16_over_llamacpp"]:.2f}',
        ]
        for n, e in _by_count(llama)
      ],
    )
  return out


def _timing(d: dict[str, Any]) -> str:
  """The file's timing note; its device where the note names a CPU but the run was not on one
  (older bench_paging_pagein files carry the CPU wording on every device)."""
  timing = d.get('timing', '?')
  device = d.get('determinism', {})
  if 'CPU' in timing and device.get('backend') not in (None, 'cpu'):
    return f'medians of wall times on the {device.get("device_kind", device["backend"])}'
  return timing


def _paging_scale(r: page.Result) -> list[str]:
  s = r.data['summary']
  latency = _by_count(s['access_latency_s'])
  values = [v for _, v in latency]
  spread = _spread(values) if values else None
  out = [
    f'**Scale**, {page.cite(r)}: {s["stored_tokens"]:,} tokens stored behind a window of'
    f' {s["window_slots"]:,} slots ({s["stored_tokens"] / s["window_slots"]:.1f}x the window).'
    ' Access is route + read + verify + install; the goal is latency within'
    f' ±{100 * LATENCY_SPREAD_GOAL:.0f}% across store sizes',
  ]
  met = lambda x: 'met' if x <= LATENCY_SPREAD_GOAL else '**not met**'
  if spread is not None:
    out[-1] += f' (largest deviation from the smallest store: {page.pct(spread)}; {met(spread)}'
    fastest = s.get('access_p10_max_deviation_from_smallest')
    if fastest is not None:  # the p10: the cost when no other process holds the cores
      out[-1] += f'; of the p10 latency: {page.pct(fastest)}, {met(fastest)}'
    out[-1] += ').'
  else:
    out[-1] += '.'
  if 'setup' in s:
    out[-1] += f' Setup: {s["setup"]}.'
  if s.get('install_byte_exact') is False:
    out[-1] += ' The installs of this run were **not** byte-exact (see `install_byte_exact`).'
  out += ['']
  out += page.table(
    ('blocks stored', 'access s (median)'), [[f'{n:,}', page.num(v)] for n, v in latency]
  )
  skip = ('stored_tokens', 'window_slots', 'access_latency_s', 'setup')
  return out + page.scalars(s, skip=skip)


def _paging_needle(r: page.Result) -> list[str]:
  s, rates = r.data['summary'], r.data['rates']

  def rate(arm: str) -> str:
    x = rates[arm]
    return f'{x["successes"]}/{x["trials"]} [{page.pct(x["low"])}, {page.pct(x["high"])}]'

  where = r.data.get('routed_over', 'the needle pages only')
  head, at, store = where.rpartition(' at /')
  if at:  # the machine's folder: its last part only
    where = f'{head} at <path>/{pathlib.PurePosixPath(store).name}'
  exact = s.get('paged_first_logits_equal_fresh_prefill')
  return [
    f'**Needles**, {page.cite(r)}: {s["needles"]} facts planted in real text, each question'
    f' routed over {s["stored_pages"]:,} pages ({s["stored_tokens"]:,} tokens; {where}) and'
    f' answered from the one page paged in: **{rate("paged")}**; the base model given the'
    f' {s["base_window_tokens"]:,}-token window that holds the fact: **{rate("base")}**'
    f' (Wilson 95%). Routing top-1 {rate("routing")}; page access'
    f' {page.num(s["page_access_median_s"])} s (median); the first paged logits equal a fresh'
    f' prefill of the page: {exact}.',
    *_paging_needle_top_k(r),
    *page.scalars(s),
  ]


def _wilson(x: dict[str, Any] | None) -> str:
  if x is None:
    return 'n/a'
  return f'{x["successes"]}/{x["trials"]} [{page.pct(x["low"])}, {page.pct(x["high"])}]'


def _paging_recall(r: page.Result) -> list[str]:
  """Per router: top-1 / top-4 by wording, and the threshold fitted on half the questions with
  its rates on the other half; older files (no `calibrated`) show the first four columns, and
  a router run on one wording 'n/a' for the other; a rerank names its candidates and the
  weighting of its query tokens. Then, where the file has it, the first
  stage's recall by candidate count (`candidate_recall`)."""
  routing = r.data['routing']
  rows = []
  for name, x in routing['routers'].items():
    fit = x.get('calibrated')
    report = fit['report'] if fit else {}
    if 'rerank' in x:  # files from before the weighting reranked by the plain mean
      weighting = x.get('rerank_weighting', 'mean')
      name = f'{name} ({x["rerank"]} + {x.get("rerank_rare", 0)} rare, {weighting})'
    rows.append(
      [
        name,
        *(_wilson(x.get(w, {}).get(k)) for w in ('direct', 'reworded') for k in ('top1', 'top4')),
        page.num(float(fit['threshold'])) if fit else 'n/a',
        *(_wilson(report.get(k)) for k in ('deposited', 'reworded', 'false_hit')),
      ]
    )
  out = [
    f'**Routing, mixed page sizes**, {page.cite(r)}: {routing["long_pages"]} long pages (one'
    f' fact each, {len(routing["templates"])} templates) among {routing["short_pages"]} short'
    f" ones that repeat the templates' words; {routing['absent_questions']} questions whose"
    ' fact is not stored. Wilson 95%. The threshold is fitted on half the questions (false'
    ' hits among absent ones <= 5%) and reported on the other half.',
    '',
  ]
  header = (
    'router',
    'direct top-1',
    'direct top-4',
    'reworded top-1',
    'reworded top-4',
    'threshold',
    'direct top-1 at it',
    'reworded top-1 at it',
    'false hits at it',
  )
  return out + page.table(header, rows) + _candidate_recall(routing.get('candidate_recall'))


def _candidate_recall(recall: dict[str, Any] | None) -> list[str]:
  """The questions whose page is among the first stage's top c, by wording and c, alone and
  with the top pages by the question's rare words; nothing for files from before it."""
  if recall is None:
    return []
  sizes = sorted(recall['direct'], key=int)  # JSON keys, sorted as text when written
  rows = [
    [f'{w}{extra}', *(_wilson(recall[f'{w}{key}'][c]) for c in sizes)]
    for w in ('direct', 'reworded')
    for key, extra in (('', ''), ('_plus_rare', f' + top {recall["rare"]} by rare words'))
  ]
  return [
    '',
    f"The page among `{recall['router']}`'s top c (the candidates a rerank of c can reach):",
    '',
    *page.table(('questions', *(f'top {c}' for c in sizes)), rows),
  ]


def _paging_needle_top_k(r: page.Result) -> list[str]:
  """Top-1 (one page, own position) and top-k (k pages composed side by side) answers side by
  side, with Wilson 95% intervals; nothing for a result without the top-k arm."""
  s, rates = r.data['summary'], r.data['rates']
  if 'topk' not in rates:
    return []
  k = s['topk_k']

  def exact(flag) -> str:
    return '-' if flag is None else page.yes(flag)

  rows = [
    ['top-1 page, own position', _wilson(rates['paged']), _wilson(rates['routing']),
     page.num(s['page_access_median_s']), exact(s['paged_first_logits_equal_fresh_prefill'])],
    [f'top-{k} pages composed', _wilson(rates['topk']), _wilson(rates['routing_topk']),
     page.num(s['topk_access_median_s']), exact(s['topk_first_logits_equal_fresh_prefill'])],
    ['base, whole window', _wilson(rates['base']), '-', '-', '-'],
  ]  # fmt: skip
  return [
    '',
    f'Top-1 and top-{k} side by side ({r.data.get("position_scheme", "rope")}, impl'
    f' {r.data.get("impl", "?")}); routing counts a question whose fact lies whole in the pages'
    ' answered from; exact: the first answer logits equal those after a fresh prefill:',
    '',
    *page.table(
      ('arm', 'answered right', 'routing holds the fact', 'access s (median)', 'exact vs fresh'),
      rows,
    ),
  ]


def _paging_kind(r: page.Result) -> int:
  """Order within the paging section: scale, page-in, catalog lookup, needles, recall, others."""
  experiment, summary = r.data.get('experiment'), r.data.get('summary', {})
  if {'stored_tokens', 'window_slots', 'access_latency_s'} <= set(summary):
    return 0
  kinds = {'bench_paging_pagein': 1, 'bench_paging_route': 2, 'needle': 3, 'bench_paging_recall': 4}
  return kinds.get(experiment, 5)


def render(results: list[page.Result]) -> list[str]:
  parts = (
    _paging_scale,
    _paging_pagein,
    _paging_route,
    _paging_needle,
    _paging_recall,
    _paging_other,
  )
  out = []
  for r in sorted(results, key=lambda r: (_paging_kind(r), r.name)):
    out += [*parts[_paging_kind(r)](r), '']
  return out[:-1]


def _paging_other(r: page.Result) -> list[str]:
  return [
    f'**{r.data.get("experiment", "?")}**, {page.cite(r)}: every scalar of its summary.',
    *page.scalars(r.data.get('summary', {})),
  ]


# ---------------------------------------------------------------------------- the page
