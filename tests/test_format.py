"""One formatter for the whole tree: ruff, configured in pyproject.toml."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_tree_is_formatted():
  ruff = shutil.which('ruff', path=str(pathlib.Path(sys.executable).parent))
  if ruff is None:
    pytest.skip('ruff is not installed (it comes with the test extras: pip install -e .[test])')
  proc = subprocess.run([ruff, 'format', '--check', '.'], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode == 0, f'run `ruff format .`:\n{proc.stdout}{proc.stderr}'
