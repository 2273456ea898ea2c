"""Markdown tables of relocation and training results, numbers only from the files (experiments/position_findings.py).

Every file is checked against its own `result_sha256` before a number is read.
"""

from __future__ import annotations

from collections.abc import Sequence


from graftjax import ledger
from graftjax.studies.common import results as results_lib


_ARMS = (
  ('relocated', 'Relocated graft (computed at 0, moved to M) vs fresh(M)'),
  ('control', 'Graft-free control: fresh(0) vs fresh(M)'),
  ('own_position', 'Own-position graft (computed at M, grafted at M) vs fresh(M)'),
)


def number(x: float) -> str:
  """'0' for an exact zero (so it cannot be mistaken for a rounded value), else 3 digits."""
  return '0' if x == 0 else f'{x:.3g}'


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
  lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
  return lines + ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]


def _figures(s: dict) -> list[str]:
  return [
    f'{s["byte_equal"]}/{s["samples"]}',
    number(s['kl_mean']),
    number(s['kl_max']),
    number(s['max_abs_diff']),
    f'{s["argmax_flips"]}/{s["rows"]}',
  ]


_FIGURE_HEADER = ('byte-equal', 'KL mean', 'KL max', 'max abs Δlogit', 'argmax flips / rows')


def relocation_section(path: str, result: dict) -> list[str]:
  """The markdown of one relocation result."""
  det = result['determinism']
  out = [
    f'## {result["model"]} on {result["device"]}: `{path}`',
    '',
    f'result_sha256 `{result["result_sha256"]}`; jax {det["jax_version"]},'
    f' backend {det["backend"]}, matmul precision {det["jax_default_matmul_precision"]}.',
    f'{len(result["samples"])} samples of {result["block_tokens"]} block +'
    f' {result["continuation_tokens"]} continuation tokens; capacity'
    f' {result["layout"]["capacity"]}, chunk {result["layout"]["chunk_size"]}.',
    f'Command: `{results_lib.shown_command(result["command"], path)}`',
    '',
  ]
  for arm, title in _ARMS:
    rows = [[c['scheme'], c['dtype'], c['offset'], *_figures(c[arm])] for c in result['cells']]
    out += [f'### {title}', ''] + _table(('scheme', 'dtype', 'M') + _FIGURE_HEADER, rows) + ['']
  if result['composition']:
    rows = [
      [c['scheme'], c['dtype'], f'{c["offsets"][0]}:{c["offsets"][1]}', *_figures(c)]
      for c in result['composition']
    ]
    out += ['### Composition: two half-blocks grafted side by side vs fresh block attention', '']
    out += _table(('scheme', 'dtype', 'A:B') + _FIGURE_HEADER, rows) + ['']
  trained = result['inputs'].get('training')
  if trained:
    out += [
      f'Trained model: {trained["scheme"]}, {trained["parameter_count"]:,} params,'
      f' {trained["steps"]} steps, held-out loss {trained["held_out_loss"]:.4f}'
      f' nats/byte ({trained["held_out_bits_per_byte"]:.4f} bits/byte);'
      f' model.json result_sha256 `{trained["result_sha256"]}`.',
      '',
    ]
  return out


def training_section(records: list[tuple[str, dict]]) -> list[str]:
  """One table row per trained model.json."""
  rows = [
    [
      r['config']['position_scheme'],
      r.get('size', '?'),
      f'{r["parameter_count"]:,}',
      r['settings']['steps'],
      f'{r["held_out_loss"]:.4f}',
      f'{r["held_out_bits_per_byte"]:.4f}',
      f'`{path}`',
      f'`{r["result_sha256"]}`',
    ]
    for path, r in records
  ]
  header = (
    'scheme',
    'size',
    'params',
    'steps',
    'held-out loss (nats/byte)',
    'bits/byte',
    'file',
    'result_sha256',
  )
  return ['## Trained small models: held-out loss', ''] + _table(header, rows) + ['']


def findings(*, relocation_paths: Sequence[str], training_paths: Sequence[str]) -> str:
  """The markdown summary of the given result files.

  Raises:
    ValueError: if a file's body no longer matches its result_sha256.
  """
  out = ['# Position sensitivity: tables from the committed results', '']
  for path in relocation_paths:
    out += relocation_section(path, ledger.verify_result(path))
  if training_paths:
    out += training_section([(p, ledger.verify_result(p)) for p in training_paths])
  return '\n'.join(out)
