"""The results page on the `sharding` study: tensor parallel on one host's GPUs, still exact?

Each file is one mode of experiments/sharded_gate.py on a 1 x N mesh (gate, kernels,
restore, bench) or a comparison of a sharded file's per-sample digests with a one-device
run's (compare).
"""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def _mesh(r: page.Result) -> str:
  m = r.data['mesh']
  return f'1 x {m["model"]} of {m["visible_devices"]}'


def _mode(results: list[page.Result], mode: str) -> list[page.Result]:
  return [r for r in results if r.data.get('mode') == mode]


def finding(results: list[page.Result]) -> str:
  """Byte-equal samples of each gate and restore file, cells of each kernels file."""
  out = []
  for r in _mode(results, 'gate'):
    g = r.data['summary']['fresh_vs_grafted']
    out.append(f'gate {g["byte_equal"]}/{g["samples"]} on {_mesh(r)} ({r.kind})')
  for r in _mode(results, 'restore'):
    g = r.data['summary']['fresh_vs_restored_other_process']
    out.append(f'restored in a fresh process {g["byte_equal"]}/{g["samples"]} on {_mesh(r)}')
  for r in _mode(results, 'kernels'):
    equal = sum(c['samples_byte_equal'] == c['samples'] for c in r.data['cells'])
    out.append(f'grafted == single pass in {equal}/{len(r.data["cells"])} cells on {_mesh(r)}')
  return '; '.join(out) or 'no run on GPUs yet'


def render(results: list[page.Result]) -> list[str]:
  out = [
    'Gemma with seeded random weights (seed 0) tensor-parallel over a 1 x N mesh of one'
    " host's devices (models/gemma/sharding.py); compact blocks go through ShardedStore, each"
    ' array split by its own kv heads.',
    '',
  ]
  rows = []
  for r in _mode(results, 'gate') + _mode(results, 'restore'):
    for arm, s in r.data['summary'].items():
      if 'byte_equal' in s:
        rows.append(
          [
            page.cite(r),
            r.device,
            _mesh(r),
            arm,
            f'{s["byte_equal"]}/{s["samples"]}',
            page.num(s['kl_max']),
          ]
        )
  if rows:
    header = ('file', 'device', 'mesh', 'arm', 'byte-equal samples', 'KL max')
    out += ['**gate and restore**', '', *page.table(header, rows), '']
  rows = [
    [
      page.cite(r),
      _mesh(r),
      c['chunk_size'],
      f'{c["samples_byte_equal"]}/{c["samples"]}',
      page.num(c['rows_kl_max']),
    ]
    for r in _mode(results, 'kernels')
    for c in r.data['cells']
  ]
  if rows:
    header = ('file', 'mesh', 'chunk', 'grafted == single pass (samples)', 'KL max')
    out += ['**kernels (Pallas)**', '', *page.table(header, rows), '']
  rows = [
    [
      page.cite(r),
      _mesh(r),
      row['prefix_tokens'],
      f'{row["recompute_median_s"]:.3f}',
      f'{row["graft_median_s"]:.3f}',
      f'{row["speedup"]:.1f}x',
      page.yes(row['first_token_byte_equal']),
      f'{row["block_bytes"]:,}',
      f'{max(row["restore_bytes_per_device"]):,}',
    ]
    for r in _mode(results, 'bench')
    for row in r.data['rows']
  ]
  if rows:
    header = (
      'file',
      'mesh',
      'prefix',
      'recompute s',
      'graft s',
      'speed-up',
      'first token equal',
      'block bytes (compact)',
      'restore bytes per device (max)',
    )
    out += ['**first token after a graft vs recompute**', '', *page.table(header, rows), '']
  rows = [
    [
      page.cite(r),
      r.data['compared'],
      f'{r.data["samples_equal"]}/{r.data["samples_matched"]}',
      page.yes(r.data['reduction_order_same']),
      (r.data['first_differing'] or {}).get('source', '-'),
      r.data['reason'] or '-',
    ]
    for r in _mode(results, 'compare')
  ]
  if rows:
    header = (
      'file',
      'digests of',
      'equal to one device',
      'same reduction order',
      'first differing',
      'why',
    )
    out += ['**against one device**', '', *page.table(header, rows), '']
  if len(out) == 2:
    out.append('No run yet: no multi-GPU machine has been lent (docs/sharding.md).')
  return out
