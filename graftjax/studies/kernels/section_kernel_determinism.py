"""The results page on the `kernel_determinism` study:

Do the Pallas kernels give the same bits run to run?
"""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def finding(results: list[page.Result]) -> str:
  """How many merged files found every output's digest identical across their runs."""
  same = sum(bool(r.data['identical']) for r in results)
  runs = sum(len(r.data['runs']) for r in results)
  return f'every digest identical across runs in {same}/{len(results)} files ({runs} runs)'


def render(results: list[page.Result]) -> list[str]:
  rows = [
    [
      page.cite(r),
      r.data['outputs'],
      len(r.data['runs']),
      ', '.join(run.get('label', '?') for run in r.data['runs']),
      page.yes(r.data['identical']),
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
  return [intro, ''] + page.table(header, rows)
