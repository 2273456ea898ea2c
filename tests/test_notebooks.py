"""Notebooks execute top to bottom in a fresh kernel; their own asserts are the checks.

The kernel is ipykernel's 'python3'; jupyter_client starts a spec whose
command is `python` with this interpreter, so the notebook sees the same
environment (and the editable graftjax install) as the test.

The position notebook is committed with its outputs, so a reader browsing
the repository sees its figures; the flywheel notebook without.
"""

import pathlib
import re

import nbclient
import nbformat
import pytest

from graftjax.studies.position import position_sweep

REPO = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / 'notebooks'
POSITION_NOTEBOOK_BYTES = 300_000  # outputs are committed: keep the figures small


def _run(path: pathlib.Path) -> nbformat.NotebookNode:
  nb = nbformat.read(path, as_version=4)
  nbclient.NotebookClient(
    nb, kernel_name='python3', timeout=300, resources={'metadata': {'path': str(path.parent)}}
  ).execute()
  return nb


def _stdout(nb: nbformat.NotebookNode) -> str:
  return ''.join(
    o.get('text', '')
    for c in nb.cells
    if c.cell_type == 'code'
    for o in c.get('outputs', [])
    if o.get('name') == 'stdout'
  )


def _images(nb: nbformat.NotebookNode) -> list:
  return [o for c in nb.cells for o in c.get('outputs', []) if 'image/png' in o.get('data', {})]


def test_committed_flywheel_notebook_has_no_outputs():
  nb = nbformat.read(NOTEBOOKS / 'flywheel.ipynb', as_version=4)
  for c in nb.cells:
    if c.cell_type == 'code':
      assert not c.outputs and c.execution_count is None, c.source[:60]


def test_committed_position_notebook_shows_its_figures():
  """Committed executed top to bottom, with both figures, no errors, and small."""
  path = NOTEBOOKS / 'position_sensitivity.ipynb'
  assert path.stat().st_size < POSITION_NOTEBOOK_BYTES
  nb = nbformat.read(path, as_version=4)
  code = [c for c in nb.cells if c.cell_type == 'code']
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
  assert not [o for c in code for o in c.outputs if o.output_type == 'error']
  assert len(_images(nb)) == 2
  assert 'agree with the registry' in _stdout(nb)


@pytest.mark.slow
def test_position_sensitivity_notebook_runs_and_agrees_with_the_registry():
  sweeps = position_sweep.committed(REPO)
  if not sweeps:
    pytest.skip('no committed relocation sweeps (experiments/results/relocation_*.json) here')
  nb = _run(NOTEBOOKS / 'position_sensitivity.ipynb')
  out = _stdout(nb)
  assert f'loaded {len(sweeps)} committed sweeps: {", ".join(p.stem for p in sweeps)}' in out
  assert re.search(
    rf'{len(sweeps)} committed sweeps and the live run agree with the registry: own position exact'
    r' everywhere; relocation exact for rope_relative, alibi, nope',
    out,
  ), out
  assert len(_images(nb)) == 2


@pytest.mark.slow
def test_flywheel_notebook_runs_and_grafted_equals_prompted():
  nb = _run(NOTEBOOKS / 'flywheel.ipynb')
  out = _stdout(nb)
  assert re.search(r'decode tokens per answer: base [\d.]+, recurrence [\d.]+ \(\d+ items\)', out)
  assert re.search(r'grafted == prompted: ([1-9]\d*)/\1 byte-equal', out), out
  images = [o for c in nb.cells for o in c.get('outputs', []) if 'image/png' in o.get('data', {})]
  committed = list((NOTEBOOKS.parent / 'experiments' / 'results' / 'flywheel').glob('*.json'))
  assert len(images) == 1 + len(committed)
