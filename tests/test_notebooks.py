"""Notebooks execute top to bottom in a fresh kernel; their own asserts are the checks.

The kernel is ipykernel's 'python3'; jupyter_client starts a spec whose
command is `python` with this interpreter, so the notebook sees the same
environment (and the editable graftjax install) as the test.
"""

import pathlib
import re

import nbclient
import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / 'notebooks'


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


@pytest.mark.parametrize('name', ['position_sensitivity.ipynb', 'flywheel.ipynb'])
def test_committed_notebook_has_no_outputs(name):
  nb = nbformat.read(NOTEBOOKS / name, as_version=4)
  for c in nb.cells:
    if c.cell_type == 'code':
      assert not c.outputs and c.execution_count is None, c.source[:60]


def test_position_sensitivity_notebook_runs_and_relative_schemes_are_exact():
  nb = _run(NOTEBOOKS / 'position_sensitivity.ipynb')
  out = _stdout(nb)
  assert 'own position exact everywhere; relocation exact for rope_relative, alibi, nope' in out
  images = [o for c in nb.cells for o in c.get('outputs', []) if 'image/png' in o.get('data', {})]
  assert len(images) == 1


def test_flywheel_notebook_runs_and_grafted_equals_prompted():
  nb = _run(NOTEBOOKS / 'flywheel.ipynb')
  out = _stdout(nb)
  assert re.search(r'decode tokens per answer: base [\d.]+, recurrence [\d.]+ \(\d+ items\)', out)
  assert re.search(r'grafted == prompted: ([1-9]\d*)/\1 byte-equal', out), out
  images = [o for c in nb.cells for o in c.get('outputs', []) if 'image/png' in o.get('data', {})]
  committed = list((NOTEBOOKS.parent / 'experiments' / 'results' / 'flywheel').glob('*.json'))
  assert len(images) == 1 + len(committed)
