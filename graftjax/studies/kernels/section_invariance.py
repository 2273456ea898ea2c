"""The results page on the `invariance` study:

Does a grafted continuation equal a single-pass prefill?
"""

from __future__ import annotations

import statistics

from graftjax.studies.common import results_page as page


def finding(results: list[page.Result]) -> str:
  """Per attention implementation, the cells whose every sample was byte-equal."""
  by_impl: dict[str, list[int]] = {}
  for r in results:
    counts = by_impl.setdefault(r.data['impl'], [0, 0])
    counts[0] += sum(c['samples_byte_equal'] == c['samples'] for c in r.data['cells'])
    counts[1] += len(r.data['cells'])
  cells = ', '.join(f'{impl} {equal}/{total}' for impl, (equal, total) in sorted(by_impl.items()))
  return f'cells with every grafted sample == single pass: {cells}'


def render(results: list[page.Result]) -> list[str]:
  rows = []
  for r in results:
    d = r.data
    cells = d['cells']
    settings = d['settings']
    seconds = [s['seconds'] for s in d['samples'] if 'seconds' in s]
    rows.append(
      [
        page.cite(r),
        d['dtype'],
        d['impl'],
        d['capacity'],
        f'{settings["prefix_tokens"]} + {settings["continuation_tokens"]}',
        ', '.join(map(str, settings['chunk_sizes'])),
        ', '.join(map(str, settings['batch_sizes'])),
        f'{min(c["samples_byte_equal"] for c in cells)}/{d["samples_run"]}',
        f'{sum(c["samples_byte_equal"] == c["samples"] for c in cells)}/{len(cells)}',
        page.num(max(c['rows_kl_max'] for c in cells)),
        page.pct(min(c['rows_argmax_agreement'] for c in cells)),
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
  return [intro, ''] + page.table(header, rows)
