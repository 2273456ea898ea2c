"""The results page on the `invariance_cost` study: What does invariance cost on the H200?"""

from __future__ import annotations

from typing import Any

from graftjax.studies.common import results_page as page

INVARIANCE_COST_GOAL = 0.25  # README: at most +25% time for the chunk-invariant kernels
FLOOR_GOAL = 2.0  # README: attention decode within 2x of the bandwidth floor


def _per_token_ms(rate: float) -> float:
  return 1000.0 / rate


def render(results: list[page.Result]) -> list[str]:
  out = [
    f'**End to end** (goal: at most +{100 * INVARIANCE_COST_GOAL:.0f}% time with'
    " `impl=pallas`). 'extra' is the time ratio pallas / xla.",
    '',
  ]
  rows = []
  for r in results:
    d = r.data
    if d.get('experiment') != 'bench_model':
      continue
    for dtype, cost in d['invariance_cost'].items():
      xla, pallas = d['rows'][f'graftjax_{dtype}_xla'], d['rows'][f'graftjax_{dtype}_pallas']
      rows.append(
        [
          page.cite(r),
          dtype,
          d.get('weights', 'real'),
          d.get('repeats', 1),
          f'{d["prompt_tokens"]} / {d["chunk_size"]} / {d["decode_tokens"]}',
          f'{xla["prefill_tokens_per_s"]:,.0f}',
          f'{pallas["prefill_tokens_per_s"]:,.0f}',
          page.more_time(cost['prefill_tokens_per_s']),
          f'{xla["decode_tokens_per_s"]:,.0f}',
          f'{pallas["decode_tokens_per_s"]:,.0f}',
          page.more_time(cost['decode_tokens_per_s']),
          page.yes(max(cost.values()) <= INVARIANCE_COST_GOAL),
        ]
      )
  out += page.table(
    (
      'file',
      'dtype',
      'weights',
      'runs (fastest kept)',
      'prompt / chunk / decoded tokens',
      'prefill tok/s xla',
      'pallas',
      'extra',
      'decode tok/s xla',
      'pallas',
      'extra',
      'goal met',
    ),
    rows,
  )
  rows = []
  for r in results:
    d = r.data
    for dtype, ops in sorted(d.get('per_op_cost', {}).items()):
      base = d['rows'][f'graftjax_{dtype}_xla']
      for op, cost in ops.items():
        one = d['rows'][f'graftjax_{dtype}_xla+{op}=pallas']
        extra_ms = _per_token_ms(one['decode_tokens_per_s']) - _per_token_ms(
          base['decode_tokens_per_s']
        )
        rows.append(
          [
            page.cite(r),
            dtype,
            op,
            f'{100 * cost["prefill_tokens_per_s"]:+.0f}%',
            f'{100 * cost["decode_tokens_per_s"]:+.0f}%',
            f'{extra_ms:+.2f}',
          ]
        )
  if rows:
    out += [
      '',
      '**Per op**: the XLA model with one op on its Pallas kernel, against all-XLA.',
      '',
    ]
    out += page.table(
      ('file', 'dtype', 'op', 'prefill extra time', 'decode extra time', 'decode ms / token'),
      rows,
    )
  for r in results:
    if 'cases' in r.data:
      out += ['', *_kernel_cases(r)]
  for r in results:
    if r.data.get('experiment') == 'bench_matmul_tiles':
      out += ['', *_matmul_tiles(r)]
    elif 'candidates' in r.data.get('settings', {}):
      out += ['', *_tiles(r)]
  return out


def _kernel_time(case: dict[str, Any]) -> float:
  for key in ('kernel_s', 'device_s', 'min_s'):
    if case.get(key) is not None:
      return case[key]
  raise KeyError(f'no time in kernel case {case}')


def _kernel_cases(r: page.Result) -> list[str]:
  cases = {}
  for c in r.data['cases']:
    shape = c['shape']
    length = shape.get('S', shape.get('T', shape.get('M')))
    cases[(c['kernel'], c.get('phase', ''), c['dtype'], str(length), c['impl'])] = c
  rows = []
  for (kernel, phase, dtype, length, impl), c in cases.items():
    if impl != 'pallas':
      continue
    xla = cases.get((kernel, phase, dtype, length, 'xla'))
    net = _kernel_time(c)
    xla_net = _kernel_time(xla) if xla else None
    rows.append(
      [
        kernel,
        phase,
        dtype,
        length,
        page.num(1e6 * net),
        page.num(1e6 * xla_net) if xla_net else '-',
        f'{net / xla_net:.2f}' if xla_net else '-',
        f'{1 / c["hbm_fraction"]:.1f}' if c.get('hbm_fraction') else '-',
        page.pct(c['bf16_peak_fraction']) if c.get('bf16_peak_fraction') is not None else '-',
      ]
    )
  peaks = r.data.get('peaks', {})
  timing = (
    'device time of one call (a jitted loop, less the loop alone)'
    if 'kernel_s' in r.data['cases'][0]
    else f'fastest of {r.data["cases"][0]["repeats"]} timed calls (wall clock, loop not netted out)'
  )
  intro = (
    f'**Kernels**, {page.cite(r)}: {timing}.'
    f' x floor = time over bytes / {page.num(peaks.get("hbm_bytes_per_s"))} B/s; the goal for'
    f' attention decode is at most {FLOOR_GOAL:.0f}x. Compute fraction against'
    f' {page.num(peaks.get("bf16_dense_flops"))} FLOP/s (dense bfloat16, also for float32).'
  )
  header = (
    'kernel',
    'phase',
    'dtype',
    'length',
    'pallas us',
    'xla us',
    'pallas / xla',
    'x floor',
    'of bf16 peak',
  )
  return [intro, ''] + page.table(header, rows)


def _tiles(r: page.Result) -> list[str]:
  best = {}
  for row in r.data['rows']:
    if row['impl'] != 'pallas':
      continue
    key = (row['phase'], row['dtype'], row['S'], row['T'])
    if key not in best or row['device_s'] < best[key]['device_s']:
      best[key] = row
  rows = [
    [
      phase,
      dtype,
      s,
      t,
      row['candidate'],
      page.num(1e6 * row['device_s']),
      f'{row["net_over_floor"]:.1f}',
      f'{row["vs_xla"]:.2f}',
    ]
    for (phase, dtype, s, t), row in sorted(best.items())
  ]
  header = ('phase', 'dtype', 'S', 'T', 'fastest tiles', 'us', 'x floor (net)', 'vs xla')
  return [
    f'**Attention tile sweep**, {page.cite(r)}: the fastest candidate per shape.',
    '',
  ] + page.table(header, rows)


def _matmul_tiles(r: page.Result) -> list[str]:
  cases: dict[tuple, dict[str, Any]] = {}
  for row in r.data['rows']:
    case = cases.setdefault((row['dtype'], row['M'], row['shape']), {'timed': []})
    if row['impl'] == 'xla':
      case['xla'] = row['device_s']
    elif 'device_s' in row:
      case['timed'].append(row)
  default = r.data['settings']['default']
  rows = []
  for (dtype, m, shape), case in cases.items():
    timed = case['timed']
    if not timed:
      continue
    best = min(timed, key=lambda row: row['device_s'])
    base = next((row['device_s'] for row in timed if row['candidate'] == default), None)
    rows.append(
      [
        dtype,
        m,
        shape,
        page.num(1e6 * case['xla']),
        page.num(1e6 * base) if base else '-',
        best['candidate'],
        page.num(1e6 * best['device_s']),
        f'{best["device_s"] / case["xla"]:.2f}',
        f'{sum(row["bits_equal_default"] for row in timed)} / {len(timed)}',
      ]
    )
  header = (
    'dtype',
    'rows M',
    'projection',
    'xla us',
    f'default {default} us',
    'fastest tiles',
    'us',
    'vs xla',
    'byte-equal to default',
  )
  intro = (
    f'**Matmul tile sweep**, {page.cite(r)}: block_m,block_n,block_k,warps,stages per'
    ' gemma-3-270m projection (device time per call in a jitted loop, loop included);'
    " the last column counts the candidates whose output has the default tiles' bytes."
  )
  return [intro, ''] + page.table(header, rows)
