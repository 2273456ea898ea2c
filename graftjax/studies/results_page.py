"""The results page, `experiments/results/README.md`, generated from the committed result JSON.

Every figure is read from a result file, each checked against its own `result_sha256`
(`ledger.verify_result`) first; the page names the file and the first 12 hex digits of that
digest. A family of results is one function registered with `@family(title, *patterns)`; a
top-level file that no family claims is still listed with its command. Same files, same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import fnmatch
import os
import pathlib
import statistics
from typing import Any

from graftjax import ledger

COMMAND = 'python experiments/results_page.py'
PAGE_NAME = 'README.md'
# Written by `make demo` into the results folder; never committed, never on the page.
NOT_RESULTS = ('*_demo.json',)


@dataclasses.dataclass(frozen=True)
class Result:
  """One verified result file; `name` is its path under the results folder (posix)."""

  name: str
  data: dict[str, Any]

  @property
  def digest(self) -> str:
    return self.data['result_sha256'][:12]

  @property
  def determinism(self) -> dict[str, Any]:
    """The determinism record, wherever the experiment put it."""
    data = self.data
    if isinstance(data.get('determinism'), dict):
      return data['determinism']
    if isinstance(data.get('config'), dict) and 'jax_version' in data['config']:
      return data['config']
    runs = data.get('runs')
    if isinstance(runs, list) and runs and isinstance(runs[0], dict):
      return runs[0].get('determinism') or {}
    return {}

  @property
  def device(self) -> str:
    det = self.determinism
    kind = det.get('device_kind', '?')
    if kind == 'cpu':
      kind = f'CPU ({det.get("cpu_model", "?")})'
    return f'{kind}, jax {det.get("jax_version", "?")}'


@dataclasses.dataclass(frozen=True)
class Family:
  title: str
  patterns: tuple[str, ...]
  render: Callable[[list[Result]], list[str]]


FAMILIES: list[Family] = []


def family(title: str, *patterns: str):
  """Registers `render(results) -> markdown lines` for the top-level files matching `patterns`.

  Families claim files in registration order; a file goes to the first family that matches.
  """

  def register(render):
    FAMILIES.append(Family(title, patterns, render))
    return render

  return register


# ---------------------------------------------------------------------------- formatting


def num(x: float | None) -> str:
  """'0' for an exact zero (never a rounded value), else 3 significant digits."""
  if x is None:
    return '-'
  return '0' if x == 0 else f'{x:.3g}'


def pct(x: float) -> str:
  return f'{100 * x:.1f}%'


def more_time(x: float) -> str:
  """A relative cost `x` (time ratio - 1) as '+52%' or, from 2x on, '4.4x'."""
  return f'{1 + x:.1f}x' if x >= 1 else f'+{100 * x:.0f}%'


def yes(flag: bool) -> str:
  return 'yes' if flag else '**no**'


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  cell = lambda c: str(c).replace('|', '\\|')
  lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
  return lines + ['| ' + ' | '.join(cell(c) for c in row) + ' |' for row in rows]


def _name(result: Result) -> str:
  return f'`{result.name}` ({result.digest})'


def _sources(results: Sequence[Result]) -> list[str]:
  lines = ['Files (`result_sha256` prefix; device; command):', '']
  for r in results:
    lines.append(f'- `{r.name}` `{r.digest}`; {r.device}; `{r.data.get("command", "?")}`')
  return lines


# ---------------------------------------------------------------------------- families


@family('Is own-position graft byte-exact? (CPU and H200)', 'exactness_*.json')
def _exactness(results: list[Result]) -> list[str]:
  rows = []
  for r in results:
    for run in r.data['runs']:
      s = run['summary']
      graft = s['fresh_vs_grafted']
      other = s.get('fresh_vs_grafted_other_process')
      roll = s.get('rollout_fresh_vs_grafted', {})
      floor = s['fresh_vs_fresh']
      rows.append(
        [
          _name(r),
          r.device,
          run['dtype'],
          f'{graft["byte_equal"]}/{graft["samples"]}',
          num(graft['kl_max']),
          pct(graft['argmax_agreement']),
          num(graft['max_abs_diff']),
          f'{other["byte_equal"]}/{other["samples"]}' if other else '-',
          f'{roll.get("tokens_equal", "-")} / {roll.get("logits_byte_equal", "-")}'
          f' of {roll.get("samples", "-")} ({run["schedule"]["rollout_tokens"]} tokens)',
          f'{floor["byte_equal"]}/{floor["samples"]}',
        ]
      )
  header = (
    'file',
    'device',
    'dtype',
    'fresh vs grafted: byte-equal samples',
    'KL max',
    'argmax',
    'max abs Δ',
    'grafted in another process: byte-equal',
    'greedy rollouts: tokens / logit bytes equal',
    'fresh vs fresh floor',
  )
  first = results[0].data['runs'][0]['schedule']
  intro = (
    f'A {first["prefix_tokens"]}-token prefix is captured, stored, read back and grafted into'
    f' a fresh cache of {first["capacity"]} slots; the next {first["continuation_tokens"]}'
    f' tokens (chunks of {first["chunk_size"]}) are compared with a fresh prefill of the whole'
    ' text (SHA-256 of the logit bytes, KL in float64 nats, argmax).'
  )
  return [intro, ''] + table(header, rows)


@family('Does the model agree with independent references?', 'reference_agreement*.json')
def _reference(results: list[Result]) -> list[str]:
  out = []
  for r in results:
    hf, lc = r.data['overall']['hf'], r.data['overall']['llamacpp']
    out += [f'{_name(r)}, {r.data["dtype"]}:', '']
    out += table(
      ('reference', 'prompts', 'positions', 'figure', 'value', 'bound'),
      [
        [
          'HF transformers (float32)',
          hf['prompts'],
          hf['tokens'],
          'max abs Δlogit over its top-20',
          num(hf['topk_max_abs_diff']),
          f'{num(hf["tolerance"])} ({hf["within_tolerance"]}/{hf["prompts"]} prompts within)',
        ],
        ['', '', '', 'max abs Δ log-sum-exp', num(hf['lse_max_abs_diff']), num(hf['tolerance'])],
        ['', '', '', 'argmax agreement', pct(hf['argmax_agreement']), ''],
        ['', '', '', 'greedy continuations equal', f'{hf["greedy_ok"]}/{hf["prompts"]}', ''],
        [
          'llama.cpp (Q4_K_M weights, f32 KV)',
          lc['prompts'],
          lc['tokens'],
          'top-1 agreement',
          pct(lc['top1_agreement']),
          f'at least {pct(lc["top1_min_required"])}',
        ],
        ['', '', '', 'abs Δlogit over its top-20: mean', num(lc['topk_mean_abs_diff']), ''],
        [
          '',
          '',
          '',
          '... p99 / max',
          f'{num(lc["topk_p99_abs_diff"])} / {num(lc["topk_max_abs_diff"])}',
          '',
        ],
      ],
    )
    out.append('')
  return out + [
    'The tokenizer agrees with llama.cpp id for id on its fixture'
    ' (`tests/fixtures/tokenizer_llamacpp.json`, checked by the tests, not a result file).'
  ]


@family(
  'Does a grafted continuation equal a single-pass prefill? (invariance)', 'invariance_*.json'
)
def _invariance(results: list[Result]) -> list[str]:
  rows = []
  for r in results:
    d = r.data
    cells = d['cells']
    settings = d['settings']
    seconds = [s['seconds'] for s in d['samples'] if 'seconds' in s]
    rows.append(
      [
        _name(r),
        d['dtype'],
        d['impl'],
        d['capacity'],
        f'{settings["prefix_tokens"]} + {settings["continuation_tokens"]}',
        ', '.join(map(str, settings['chunk_sizes'])),
        ', '.join(map(str, settings['batch_sizes'])),
        f'{min(c["samples_byte_equal"] for c in cells)}/{d["samples_run"]}',
        f'{sum(c["samples_byte_equal"] == c["samples"] for c in cells)}/{len(cells)}',
        num(max(c['rows_kl_max'] for c in cells)),
        pct(min(c['rows_argmax_agreement'] for c in cells)),
        f'{len(d.get("shards", []))}',
        f'{statistics.median(seconds):.0f}' if seconds else '-',
      ]
    )
  header = (
    'file',
    'dtype',
    'impl',
    'cache slots',
    'prefix + continuation tokens',
    'chunk sizes',
    'batch sizes',
    'byte-equal samples (worst cell)',
    'cells all byte-equal',
    'KL max',
    'argmax (worst)',
    'shards',
    's / sample (median)',
  )
  intro = (
    'Grafted continuation, processed in every chunk size and batch size of the grid, against one'
    ' prefill of prefix + continuation in a single pass. Shards are in `runs/`;'
    ' `tests/test_results.py` re-derives every merged table from them.'
  )
  return [intro, ''] + table(header, rows)


@family(
  'Do the Pallas kernels give the same bits run to run? (kernel determinism)',
  'kernel_determinism_*.json',
)
def _kernel_determinism(results: list[Result]) -> list[str]:
  rows = [
    [
      _name(r),
      r.data['outputs'],
      len(r.data['runs']),
      ', '.join(run.get('label', '?') for run in r.data['runs']),
      yes(r.data['identical']),
      ', '.join(r.data['differing']) or 'none',
      len(r.data['errors']),
    ]
    for r in results
  ]
  header = ('file', 'outputs', 'runs', 'run labels', 'all digests identical', 'differing', 'errors')
  intro = (
    'Each run computes every output (kernels in both dtypes, real-model logits) in its own'
    ' process and records its SHA-256; the runs merged here span processes and device calls.'
  )
  return [intro, ''] + table(header, rows)


INVARIANCE_COST_GOAL = 0.25  # README: at most +25% time for the chunk-invariant kernels
FLOOR_GOAL = 2.0  # README: attention decode within 2x of the bandwidth floor


def _per_token_ms(rate: float) -> float:
  return 1000.0 / rate


@family(
  'What does invariance cost on the H200?',
  'bench_model_h200*.json',
  'bench_model_per_op_*.json',
  'bench_kernels_*.json',
  'bench_attention_tiles_*.json',
  'bench_matmul_tiles_*.json',
)
def _invariance_cost(results: list[Result]) -> list[str]:
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
          _name(r),
          dtype,
          d.get('weights', 'real'),
          d.get('repeats', 1),
          f'{d["prompt_tokens"]} / {d["chunk_size"]} / {d["decode_tokens"]}',
          f'{xla["prefill_tokens_per_s"]:,.0f}',
          f'{pallas["prefill_tokens_per_s"]:,.0f}',
          more_time(cost['prefill_tokens_per_s']),
          f'{xla["decode_tokens_per_s"]:,.0f}',
          f'{pallas["decode_tokens_per_s"]:,.0f}',
          more_time(cost['decode_tokens_per_s']),
          yes(max(cost.values()) <= INVARIANCE_COST_GOAL),
        ]
      )
  out += table(
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
            _name(r),
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
    out += table(
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


@family('Where does the time go on the H200?', 'profile_model_*.json')
def _profile(results: list[Result]) -> list[str]:
  out = [
    'Device kernels of one prefill and one decode from a jax trace, summed by name (the'
    " profiler's own overhead is in the wall time). Top kernels by total time.",
  ]
  for r in results:
    d = r.data
    out += [
      '',
      f'**{_name(r)}**: {d["dtype"]}, {d["prompt_tokens"]} prompt tokens in chunks of'
      f' {d["chunk_size"]}, {d["decode_tokens"]} decoded.',
      '',
    ]
    rows = []
    for phase, s in d['phases'].items():
      top = ', '.join(
        f'{k["name"][:40]} {k["calls"]}x {k["mean_us"]:.1f} us' for k in s['kernels'][:4]
      )
      rows.append(
        [
          phase,
          f'{s["wall_us"] / 1e3:,.1f}',
          f'{s["device_busy_us"] / 1e3:,.1f}',
          f'{s["kernel_calls"]:,}',
          top,
        ]
      )
    out += table(('kernels / phase', 'wall ms', 'device busy ms', 'kernels', 'largest'), rows)
  return out


def _kernel_time(case: dict[str, Any]) -> float:
  for key in ('kernel_s', 'device_s', 'min_s'):
    if case.get(key) is not None:
      return case[key]
  raise KeyError(f'no time in kernel case {case}')


def _kernel_cases(r: Result) -> list[str]:
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
        num(1e6 * net),
        num(1e6 * xla_net) if xla_net else '-',
        f'{net / xla_net:.2f}' if xla_net else '-',
        f'{1 / c["hbm_fraction"]:.1f}' if c.get('hbm_fraction') else '-',
        pct(c['bf16_peak_fraction']) if c.get('bf16_peak_fraction') is not None else '-',
      ]
    )
  peaks = r.data.get('peaks', {})
  timing = (
    'device time of one call (a jitted loop, less the loop alone)'
    if 'kernel_s' in r.data['cases'][0]
    else f'fastest of {r.data["cases"][0]["repeats"]} timed calls (wall clock, loop not netted out)'
  )
  intro = (
    f'**Kernels**, {_name(r)}: {timing}.'
    f' x floor = time over bytes / {num(peaks.get("hbm_bytes_per_s"))} B/s; the goal for'
    f' attention decode is at most {FLOOR_GOAL:.0f}x. Compute fraction against'
    f' {num(peaks.get("bf16_dense_flops"))} FLOP/s (dense bfloat16, also for float32).'
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
  return [intro, ''] + table(header, rows)


def _tiles(r: Result) -> list[str]:
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
      num(1e6 * row['device_s']),
      f'{row["net_over_floor"]:.1f}',
      f'{row["vs_xla"]:.2f}',
    ]
    for (phase, dtype, s, t), row in sorted(best.items())
  ]
  header = ('phase', 'dtype', 'S', 'T', 'fastest tiles', 'us', 'x floor (net)', 'vs xla')
  return [f'**Attention tile sweep**, {_name(r)}: the fastest candidate per shape.', ''] + table(
    header, rows
  )


def _matmul_tiles(r: Result) -> list[str]:
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
        num(1e6 * case['xla']),
        num(1e6 * base) if base else '-',
        best['candidate'],
        num(1e6 * best['device_s']),
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
    f'**Matmul tile sweep**, {_name(r)}: block_m,block_n,block_k,warps,stages per'
    ' gemma-3-270m projection (device time per call in a jitted loop, loop included);'
    " the last column counts the candidates whose output has the default tiles' bytes."
  )
  return [intro, ''] + table(header, rows)


def _range(values: Sequence[float]) -> str:
  if not values:
    return '-'
  low, high = num(min(values)), num(max(values))
  return low if low == high else f'{low} to {high}'


@family(
  'Can a block be moved to another position exactly? (relocation)',
  'relocation_*.json',
  'trained_*_model.json',
  'scheme_agreement_*.json',
)
def _relocation(results: list[Result]) -> list[str]:
  rows = []
  for r in results:
    d = r.data
    if d.get('experiment') != 'relocation':
      continue
    for scheme in d['schemes']:
      for dtype in d['dtypes']:
        cells = [c for c in d['cells'] if c['scheme'] == scheme and c['dtype'] == dtype]
        moved = [c for c in cells if c['offset'] != 0]
        comp = [c for c in d['composition'] if c['scheme'] == scheme and c['dtype'] == dtype]
        rows.append(
          [
            _name(r),
            d['model'],
            scheme,
            dtype,
            f'{sum(c["own_position"]["byte_equal"] == c["own_position"]["samples"] for c in cells)}'
            f'/{len(cells)}',
            f'{sum(c["relocated"]["byte_equal"] == c["relocated"]["samples"] for c in moved)}'
            f'/{len(moved)}',
            _range([c['relocated']['kl_mean'] for c in moved]),
            _range([c['control']['kl_mean'] for c in moved]),
            f'{sum(c["byte_equal"] == c["samples"] for c in comp)}/{len(comp)}' if comp else '-',
          ]
        )
  first = next(r.data for r in results if r.data.get('experiment') == 'relocation')
  out = [
    'A block computed at position 0 is moved to offset M (keys re-rotated where the scheme'
    ' needs it) and grafted; its continuation is compared with a fresh computation at M.'
    f' Offsets {", ".join(map(str, first["offsets"]))}. The graft-free control is fresh(0) vs'
    " fresh(M), the model's own position sensitivity. Counts are cells (offsets) in which every"
    ' sample was byte-equal. Written findings: `position_findings.md`.',
    '',
  ]
  out += table(
    (
      'file',
      'model',
      'scheme',
      'dtype',
      'own position byte-equal',
      'relocated byte-equal (M > 0)',
      'relocated KL mean',
      'control KL mean',
      'two half-blocks composed byte-equal',
    ),
    rows,
  )
  trained = [r for r in results if r.data.get('experiment') == 'train_small']
  if trained:
    out += ['', 'Small byte-level models trained for this study:', '']
    out += table(
      ('file', 'scheme', 'size', 'params', 'steps', 'held-out loss (nats/byte)', 'device'),
      [
        [
          _name(r),
          r.data['config']['position_scheme'],
          r.data.get('size', '?'),
          f'{r.data["parameter_count"]:,}',
          r.data['settings']['steps'],
          f'{r.data["held_out_loss"]:.3f}',
          r.device,
        ]
        for r in trained
      ],
    )
  agreement = [r for r in results if r.data.get('experiment') == 'scheme_agreement']
  for r in agreement:
    out += ['', f'Other schemes of the same weights against `rope`, {_name(r)}:', '']
    out += table(
      ('scheme', 'byte-equal samples', 'KL max', 'max abs Δ', 'argmax'),
      [
        [
          scheme,
          f'{s["byte_equal"]}/{len(s.get("per_sample", []))}',
          num(s['kl_max']),
          num(s['max_abs_diff']),
          pct(s['argmax_agreement']),
        ]
        for scheme, s in r.data['vs_rope'].items()
      ],
    )
  return out


@family('How fast is the model on CPU?', 'bench_model_cpu*.json')
def _cpu_speed(results: list[Result]) -> list[str]:
  out = []
  for r in results:
    d = r.data
    out += [
      f'{_name(r)}: {d["prompt_tokens"]}-token prompt in chunks of {d["chunk_size"]}, then'
      f' {d["decode_tokens"]} decoded tokens, {d["cpu_count"]} cores, {r.device}.',
      '',
    ]
    out += table(
      ('engine', 'prefill tok/s', 'decode tok/s'),
      [
        [
          name,
          f'{row["prefill_tokens_per_s"]:,.1f}',
          f'{row["decode_tokens_per_s"]:,.1f}',
        ]
        for name, row in d['rows'].items()
      ],
    )
    out.append('')
  return out


RESTORE_GOALS = (2.0, 1.5)  # restore within 2x of its floor (issue 13), 1.5x pinned (issue 14)


@family('Is grafting faster than recomputing the prefix?', 'bench_graft_*.json')
def _graft_vs_recompute(results: list[Result]) -> list[str]:
  rows = []
  for r in results:
    for row in r.data['rows']:
      recompute = row.get('recompute_first_token_s')
      lc = row.get('llamacpp_restore_first_token_s')
      rows.append(
        [
          _name(r),
          r.device.split(',')[0],
          f'{row["prefix_tokens"]:,}',
          f'{row["graft_first_token_s"]:.3f}',
          f'{recompute:.3f}' if recompute is not None else 'not run',
          f'{row["speedup"]:.2f}' if row.get('speedup') is not None else '-',
          yes(row['graft_logits_equal_recompute'])
          if row.get('graft_logits_equal_recompute') is not None
          else '-',
          f'{row["restore_s"]:.3f}',
          f'{row["restore_over_floor"]:.2f}',
          *(yes(row['restore_over_floor'] <= goal) for goal in RESTORE_GOALS),
          f'{row["restore_over_verified_floor"]:.2f}' if 'floor' in row else '-',
          f'{row["restore_first_read_over_floor"]:.2f}'
          if 'restore_first_read_over_floor' in row
          else '-',
          f'{lc:.3f}' if lc is not None else '-',
        ]
      )
  header = (
    'file',
    'device',
    'prefix tokens',
    'graft: first token s',
    'recompute: first token s',
    'speedup',
    'logits byte-equal',
    'restore s',
    'restore / floor',
    *(f'within {goal:g}x' for goal in RESTORE_GOALS),
    'restore / verified floor',
    'first read / floor',
    'llama.cpp restore + first token s',
  )
  intro = (
    'Time to the first token after reading a block (every byte checked against its digest:'
    ' SHA-256 in store format 2, BLAKE3 in formats 3 and 4) and grafting it, against a prefill'
    " of the same prefix; float32. The restore floor: the block's files read into touched host memory"
    ' (the fastest of one and of all threads, in pieces or one read per file) plus the copy into'
    ' the device (from pinned host memory on a GPU, a memcpy on CPU); the verified floor also'
    " hashes every byte with its format's hash, as a restore must (docs/store_format.md,"
    ' "Restoring into a cache"). Files without a verified floor used the old one: a one-thread'
    ' read plus a pageable host-to-device copy. Rows before format 3 (all but the'
    ' `bench_graft_h200*.json` files) were read with SHA-256; `bench_graft_h200.json` is format 4'
    ' (one folder per array), `bench_graft_h200_run1.json` format 3. Each timed restore reads a'
    ' manifest the process parsed before (when the block was stored); "first read" is one more'
    " restore after `store_manifest.forget_parsed()`, as a block's first read in a process"
    ' (rows without it: the parse took about 0.7 ms at 1k tokens and 14 ms at 32k on the H200,'
    ' logs/restore_timeline_h200.txt).'
  )
  return [intro, ''] + table(header, rows)


def _rate(r: dict[str, Any] | None) -> str:
  """A Wilson-interval rate record as 's/n = x% [low, high]'; '-' when absent."""
  if not r:
    return '-'
  return f'{r["successes"]}/{r["trials"]} = {pct(r["rate"])} [{pct(r["low"])}, {pct(r["high"])}]'


def _compare(base: dict[str, Any] | None, other: dict[str, Any] | None) -> str:
  """Which of two rates is higher by non-overlapping intervals, else that they overlap."""
  if not base or not other:
    return '-'
  if other['low'] > base['high']:
    return 'flywheel higher'
  if base['low'] > other['high']:
    return '**base higher**'
  return 'intervals overlap'


def _phase_tokens(s: dict[str, Any]) -> str:
  return num(s['decode_tokens_per_answer']) if s.get('items') else '-'


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


def _rescored(results: list[Result]) -> list[str]:
  """What `graftjax.flywheel.rescore` says of each file, run as the page is made."""
  from graftjax.flywheel import rescore  # pylint: disable=g-import-not-at-top

  out = ['Re-scored now:', '']
  for r in results:
    found = rescore.check(r.data)  # the file's own digest was verified when it was loaded
    verdict = (
      'every digest, verdict and figure agrees'
      if not found.problems
      else (f'{len(found.problems)} discrepancies: ' + '; '.join(found.problems))
    )
    out.append(f'- {_name(r)}: {verdict}')
  return out


@family(
  'Composing the top-k routed blocks side by side: exact, and what it buys (flywheel)',
  'flywheel_compose_*.json',
)
def _flywheel_compose(results: list[Result]) -> list[str]:
  """Registered before `_flywheel`, whose pattern also matches these files."""
  out = [
    'Deposited blocks composed side by side (`graftjax.flywheel.compose`: rope_relative, one'
    ' attention segment per block, pages of whole Pallas splits); each deposited item asked'
    ' again after its own block and k - 1 BM25-routed distractors (`k<k>`: own block last, next'
    ' to the query; `_own_first`: furthest from it), held-out instances of the templates (never'
    ' deposited) after the top-1 and top-3 routed blocks'
    " (best last). Exactness: the query's logits (SHA-256 of their bytes) and the cache against"
    ' a fresh block-attention prefill of the same layout, packed from slot 0 and shifted by one'
    ' page. Intervals are Wilson 95%; method: docs/composition.md.',
    '',
  ]
  for r in results:
    d = r.data
    sources = [x['source'] if x.get('key') else 'refused' for x in d['deposits']]
    counts = ', '.join(f'{sources.count(s)} {s}' for s in sorted(set(sources)))
    not_asked = d.get('not_asked', {})
    base = (
      f'after one greedy base attempt of {d["base_tokens"]} tokens per item'
      if d['base_tokens']
      else "no base attempts: each deposit is the dataset's reference solution"
    )
    out += [
      f'{_name(r)}: `{d["model"]}` {d["dtype"]} on {r.device.split(",")[0]}; deposits: {counts}'
      f' ({base}); not asked before the deadline: {not_asked.get("recall", 0)} recurring,'
      f' {not_asked.get("held_out", 0)} held-out. XLA refused: "'
      f'{d["refusals"]["xla"].split(". ")[0]}."',
      '',
    ]
    rows = [
      [
        name,
        f'{e["logits_byte_equal"]}/{e["total"]}',
        f'{e["cache_byte_equal"]}/{e["total"]}',
        num(e['max_abs_logit_diff']),
      ]
      for name, e in d['summary']['exactness'].items()
    ]
    out += table(
      ('k / layout', 'query logits byte-equal', 'cache byte-equal', 'max abs logit diff'), rows
    )
    s = d['summary']
    rows = []
    for group, label in (('recall', 'recurring (recall)'), ('held_out', 'held-out (solve)')):
      for arm, a in s[group].items():
        rows.append(
          [label, arm, a['items'], _rate(a.get('accuracy')), _phase_tokens(a)]
          if a['items']
          else [label, arm, 0, '-', '-']
        )
    out += [''] + table(
      ('questions', 'blocks', 'items', 'accuracy', 'decode tokens / answer'), rows
    )
    paired = [
      [pair, p['items'], p['only_first'], p['only_second']] for pair, p in s['paired'].items()
    ]
    top1 = s.get('held_out_top1_is_template')
    out += [
      '',
      'Paired over the same items: answered right by the first arm only, by the second only;'
      f' held-out top-1 routed to its own template: {_rate(top1)}.',
      '',
      *table(('arms', 'items', 'only first right', 'only second right'), paired),
      '',
    ]
  return out


@family(
  'Does a library of verified solutions make the frozen model better and cheaper? (flywheel)',
  'flywheel_*.json',
)
def _flywheel(results: list[Result]) -> list[str]:
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
        _name(r),
        d.get('model', '?'),
        r.device.split(',')[0],
        d.get('dtype', '?'),
        f'{b.get("samples", "?")} x {b.get("max_new_tokens", "?")} / {b.get("recall_tokens", "?")}',
        _rate(s['base'].get('accuracy')),
        s['recurrence_items'],
        _rate(rec.get('accuracy')),
        _phase_tokens(rec),
        f'{used:,}' if used is not None else '-',
        f'{spent:,}',
        f'{used / spent:.3g}' if used is not None and spent else '-',
        num(rec.get('seconds_per_answer')),
      ]
    )
  out += table(
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
      rows.append(
        [
          _name(r),
          label,
          s[fly].get('items', 0),
          _rate(s[base].get('accuracy')),
          _rate(s[fly].get('accuracy')),
          _compare(s[base].get('accuracy'), s[fly].get('accuracy')),
          _phase_tokens(s[base]),
          _phase_tokens(s[fly]),
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
  out += table(
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
      rows.append(
        [
          _name(r),
          router,
          e['threshold'] if isinstance(e['threshold'], str) else num(e['threshold']),
          _rate(e.get('accuracy')),
          _rate(e.get('false_hit')),
          _rate(e.get('abstain')),
        ]
      )
  out += [
    '',
    '**Routing** of the held-out items (top-1, to the block of the deposited item the held-out'
    " item's template was made from, or that it is paired with (qa_wikidata: the same subject);"
    ' below the threshold the router abstains):',
    '',
  ]
  out += table(
    ('file', 'router', 'threshold', 'accuracy', 'false hits (of all queries)', 'abstains'), rows
  )
  rows = []
  for r in results:
    g = r.data.get('grafted_vs_prompted', {}).get('summary') or {}
    graft, prompted = g.get('graft_seconds_median'), g.get('prompted_seconds_median')
    rows.append(
      [
        _name(r),
        f'{g.get("logits_byte_equal", 0)}/{g.get("items", 0)}',
        f'{g.get("tokens_equal", 0)}/{g.get("items", 0)}',
        num(graft),
        num(prompted),
        f'{graft / prompted:.2f}' if graft and prompted else '-',
      ]
    )
  out += [
    '',
    '**Grafted vs prompted**: each recurrence answer again with the same library text given as'
    ' a plain prompt (prefilled, no graft); first-answer logits compared by their bytes.',
    '',
  ]
  out += table(
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
  metered = [r for r in results if r.data.get('energy')]
  out += ['', '**Energy** (joules per answer above the idle baseline):', '']
  if not metered:
    return out + ['No file here was measured (`--energy`, NVML, on a GPU).']
  rows = []
  for r in metered:
    e = r.data['energy']
    phases = e.get('phases', {})
    joules = lambda p, phases=phases: (
      num(phases[p].get('joules_per_answer')) if p in phases else '-'
    )
    rows.append(
      [
        _name(r),
        e.get('device', '?'),
        num(e.get('idle_watts')),
        joules('base'),
        joules('recurrence'),
        joules('transfer_base'),
        joules('transfer_flywheel'),
        e.get('scope', '?'),
      ]
    )
  return out + table(
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


LATENCY_SPREAD_GOAL = 0.20  # issue 13: access latency within +-20% from 10 to >= 10,000 blocks


def _by_count(mapping: dict[str, Any]) -> list[tuple[int, float]]:
  """Sorted (count, value) of a {count: value} record, other keys ignored."""
  return sorted((int(k), v) for k, v in mapping.items() if str(k).isdigit())


def _spread(values: Sequence[float]) -> float:
  """Largest relative deviation from the first value."""
  return max(abs(v / values[0] - 1) for v in values)


def _us(seconds: float) -> str:
  us = 1e6 * seconds
  return f'{us:,.0f}' if us >= 1000 else num(us)


def _paging_route(r: Result) -> list[str]:
  d = r.data
  rows = [
    [
      row['router'],
      f'{row["entries"]:,}',
      _us(row['lookup_median_s']),
      _us(row['lookup_p90_s']),
      _us(row['route_median_s']),
      _us(row['sqlite_get_median_s']),
      num(row['index_build_s']),
      f'{row["catalog_bytes"]:,}',
      pct(row['top1_own_piece']),
    ]
    for row in sorted(d['rows'], key=lambda x: (x['router'], x['entries']))
  ]
  ratios = ', '.join(
    f'{router} {v["largest_over_smallest"]:.2f}x'
    for router, v in sorted(d['summary']['lookup_median_s'].items())
  )
  out = [
    f'**Catalog lookup** (route, k=1, plus the sqlite fetch), {_name(r)}:'
    f' {d["rows"][0]["queries"]} queries per size; lookup at the largest size over the'
    f' smallest: {ratios}. Timing: {d.get("timing", "?")}.',
    '',
  ]
  return out + table(
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


def _paging_pagein(r: Result) -> list[str]:
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
      yes(row['query_logits_byte_equal']),
      f'{row["page_bytes_per_token"]:,.0f}',
      f'{row["block_bytes_per_token"]:,.0f}',
      f'{row["block_bytes_per_token"] / row["page_bytes_per_token"]:.1f}x',
    ]
    for row in sorted(d['rows'], key=lambda x: x['tokens'])
  ]
  out = [
    f'**Page-in vs re-prefill**, {_name(r)}, {d.get("model", "?")} {d.get("dtype", "?")}, chunks'
    f' of {d.get("chunk_size", "?")}: read + verify + install a page and run the next token,'
    f' against prefilling the block again; both paths asserted byte-equal. Crossover: {where}.'
    f' Timing: {_timing(d)}.',
    '',
  ]
  out += table(
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
    out += table(
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
  (bench_paging_pagein wrote the CPU wording on every device until it was fixed)."""
  timing = d.get('timing', '?')
  device = d.get('determinism', {})
  if 'CPU' in timing and device.get('backend') not in (None, 'cpu'):
    return f'medians of wall times on the {device.get("device_kind", device["backend"])}'
  return timing


def _paging_scale(r: Result) -> list[str]:
  s = r.data['summary']
  latency = _by_count(s['access_latency_s'])
  values = [v for _, v in latency]
  spread = _spread(values) if values else None
  out = [
    f'**Scale**, {_name(r)}: {s["stored_tokens"]:,} tokens stored behind a window of'
    f' {s["window_slots"]:,} slots ({s["stored_tokens"] / s["window_slots"]:.1f}x the window).'
    ' Access is route + read + verify + install; the goal is latency within'
    f' ±{100 * LATENCY_SPREAD_GOAL:.0f}% across store sizes',
  ]
  if spread is not None:
    out[-1] += (
      f' (largest deviation from the smallest store: {pct(spread)};'
      f' {"met" if spread <= LATENCY_SPREAD_GOAL else "**not met**"}).'
    )
  else:
    out[-1] += '.'
  if 'setup' in s:
    out[-1] += f' Setup: {s["setup"]}.'
  if s.get('install_byte_exact') is False:
    out[-1] += ' The installs of this run were **not** byte-exact (see `install_byte_exact`).'
  out += ['']
  out += table(('blocks stored', 'access s (median)'), [[f'{n:,}', num(v)] for n, v in latency])
  skip = ('stored_tokens', 'window_slots', 'access_latency_s', 'setup')
  return out + _scalars(s, skip=skip)


def _flatten(record: dict[str, Any], prefix: str = '') -> list[tuple[str, Any]]:
  out = []
  for k, v in sorted(record.items(), key=lambda kv: str(kv[0])):
    if isinstance(v, dict):
      out += _flatten(v, f'{prefix}{k}.')
    elif not isinstance(v, list):
      out.append((f'{prefix}{k}', v))
  return out


def _scalars(record: dict[str, Any], *, skip: Sequence[str] = ()) -> list[str]:
  """Every other scalar of a summary, by its dotted name (lists left out)."""
  rows = [
    [f'`{k}`', f'{v:,}' if isinstance(v, int) and not isinstance(v, bool) else num(v)]
    if isinstance(v, (int, float)) and not isinstance(v, bool)
    else [f'`{k}`', v]
    for k, v in _flatten({k: v for k, v in record.items() if k not in skip})
  ]
  return ['', *table(('summary field', 'value'), rows)] if rows else []


def _paging_needle(r: Result) -> list[str]:
  s, rates = r.data['summary'], r.data['rates']

  def rate(arm: str) -> str:
    x = rates[arm]
    return f'{x["successes"]}/{x["trials"]} [{pct(x["low"])}, {pct(x["high"])}]'

  where = r.data.get('routed_over', 'the needle pages only')
  exact = s.get('paged_first_logits_equal_fresh_prefill')
  return [
    f'**Needles**, {_name(r)}: {s["needles"]} facts planted in real text, each question'
    f' routed over {s["stored_pages"]:,} pages ({s["stored_tokens"]:,} tokens; {where}) and'
    f' answered from the one page paged in: **{rate("paged")}**; the base model given the'
    f' {s["base_window_tokens"]:,}-token window that holds the fact: **{rate("base")}**'
    f' (Wilson 95%). Routing top-1 {rate("routing")}; page access'
    f' {num(s["page_access_median_s"])} s (median); the first paged logits equal a fresh'
    f' prefill of the page: {exact}.',
    *_scalars(s),
  ]


def _paging_kind(r: Result) -> int:
  """Order within the paging section: scale, page-in, catalog lookup, needles, others."""
  experiment, summary = r.data.get('experiment'), r.data.get('summary', {})
  if {'stored_tokens', 'window_slots', 'access_latency_s'} <= set(summary):
    return 0
  return {'bench_paging_pagein': 1, 'bench_paging_route': 2, 'needle': 3}.get(experiment, 4)


@family('Paged context: how small, how exact, how fast? (paging)', 'paging_*.json')
def _paging(results: list[Result]) -> list[str]:
  render = (_paging_scale, _paging_pagein, _paging_route, _paging_needle, _paging_other)
  out = []
  for r in sorted(results, key=lambda r: (_paging_kind(r), r.name)):
    out += [*render[_paging_kind(r)](r), '']
  return out[:-1]


def _paging_other(r: Result) -> list[str]:
  return [
    f'**{r.data.get("experiment", "?")}**, {_name(r)}: every scalar of its summary.',
    *_scalars(r.data.get('summary', {})),
  ]


# ---------------------------------------------------------------------------- the page


def load(results_dir: str | os.PathLike[str]) -> list[Result]:
  """Every result file under `results_dir` (top level and sub-folders), verified, sorted."""
  root = pathlib.Path(results_dir)
  found = []
  for path in sorted(root.rglob('*.json')):
    name = path.relative_to(root).as_posix()
    if any(fnmatch.fnmatch(path.name, p) for p in NOT_RESULTS):
      continue
    found.append(Result(name, ledger.verify_result(path)))
  return found


def render(results: Sequence[Result]) -> str:
  """The markdown page for `results` (sorted by name; the same input gives the same bytes)."""
  results = sorted(results, key=lambda r: r.name)
  top = [r for r in results if '/' not in r.name]
  nested = [r for r in results if '/' in r.name]
  out = [
    '# Results',
    '',
    f'<!-- Generated by `{COMMAND}` from the JSON files in this folder. Do not edit. -->',
    '',
    'Every figure below is read from the committed result file named beside it, after checking'
    ' the file against its own `result_sha256` (shown by its first 12 hex digits). Each file'
    ' also carries the command that made it, the pinned configuration (device, jax version,'
    ' XLA flags, matmul precision) and the SHA-256 of its inputs and outputs. Bits are never'
    ' compared across devices or jax versions. Re-check a file without running a model:'
    ' `python -c "from graftjax import ledger; ledger.verify_result(\'<file>\')"`;'
    f' regenerate this page: `{COMMAND}`.',
  ]
  claimed: set[str] = set()
  for fam in FAMILIES:
    mine = [
      r
      for r in top
      if r.name not in claimed and any(fnmatch.fnmatch(r.name, p) for p in fam.patterns)
    ]
    if not mine:
      continue
    claimed |= {r.name for r in mine}
    out += ['', f'## {fam.title}', '', *fam.render(mine), '', *_sources(mine)]
  others = [r for r in top if r.name not in claimed]
  if others:
    out += ['', '## Other result files', '', 'No section reads these yet.', '', *_sources(others)]
  if nested:
    out += [
      '',
      '## Shards and single runs',
      '',
      'Inputs of the merged files above, each referenced there by its `result_sha256`.',
      '',
      *_sources(nested),
    ]
  return '\n'.join(line.rstrip() for line in out) + '\n'


def page(results_dir: str | os.PathLike[str]) -> str:
  return render(load(results_dir))


def write(results_dir: str | os.PathLike[str]) -> pathlib.Path:
  """Writes the page to `results_dir`/README.md; returns its path."""
  path = pathlib.Path(results_dir) / PAGE_NAME
  path.write_text(page(results_dir))
  return path
