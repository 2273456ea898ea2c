"""The results page on the `relocation` study: Can a block be moved to another position exactly?"""

from __future__ import annotations

from collections.abc import Sequence

from graftjax.studies.common import results_page as page


def _range(values: Sequence[float]) -> str:
  if not values:
    return '-'
  low, high = page.num(min(values)), page.num(max(values))
  return low if low == high else f'{low} to {high}'


def render(results: list[page.Result]) -> list[str]:
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
            page.cite(r),
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
  out += page.table(
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
    out += page.table(
      ('file', 'scheme', 'size', 'params', 'steps', 'held-out loss (nats/byte)', 'device'),
      [
        [
          page.cite(r),
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
    out += ['', f'Other schemes of the same weights against `rope`, {page.cite(r)}:', '']
    out += page.table(
      ('scheme', 'byte-equal samples', 'KL max', 'max abs Δ', 'argmax'),
      [
        [
          scheme,
          f'{s["byte_equal"]}/{len(s.get("per_sample", []))}',
          page.num(s['kl_max']),
          page.num(s['max_abs_diff']),
          page.pct(s['argmax_agreement']),
        ]
        for scheme, s in r.data['vs_rope'].items()
      ],
    )
  return out
