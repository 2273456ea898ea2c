"""One formatter and linter for the whole tree: ruff, configured in pyproject.toml."""

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


def test_tree_passes_the_linter(tmp_path):
  ruff = shutil.which('ruff', path=str(pathlib.Path(sys.executable).parent))
  if ruff is None:
    pytest.skip('ruff is not installed (it comes with the test extras: pip install -e .[test])')
  lint = lambda *paths: subprocess.run(
    [ruff, 'check', '--no-cache', *paths], cwd=ROOT, capture_output=True, text=True
  )
  proc = lint('.')
  assert proc.returncode == 0, f'ruff check:\n{proc.stdout}{proc.stderr}'
  bad = tmp_path / 'bad.py'
  bad.write_text('import os\n\nprint(undefined_name)\n')
  proc = lint(str(bad))  # the linter finds what it is there for
  assert proc.returncode != 0 and 'F401' in proc.stdout and 'F821' in proc.stdout


def test_a_misspelt_marker_is_an_error(tmp_path):
  """--strict-markers (setup.cfg): `@pytest.mark.slwo` stops collection instead of running."""
  test = tmp_path / 'test_marked.py'
  test.write_text('import pytest\n\n\n@pytest.mark.slwo\ndef test_x():\n  pass\n')
  config = ['-c', str(ROOT / 'setup.cfg'), '--rootdir', str(tmp_path), '-p', 'no:cacheprovider']
  run = lambda *extra: subprocess.run(
    [sys.executable, '-m', 'pytest', '-q', *config, *extra, str(test)],
    capture_output=True,
    text=True,
  )
  strict = run()
  assert strict.returncode != 0 and "'slwo' not found in `markers`" in strict.stdout
  assert run('-o', 'addopts=').returncode == 0  # without the option it would run
