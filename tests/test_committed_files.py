"""No weights or data arrays are committed: fixtures keep headers and seeds, tests rebuild.

Model weights come from the GGUF package or are rebuilt from a seed (see
scripts/reference/seeded_weights.py); data sets are read from their installed packages.
"""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
WEIGHT_SUFFIXES = (
  '.safetensors',
  '.bin',
  '.pt',
  '.pth',
  '.ckpt',
  '.gguf',
  '.npz',
  '.msgpack',
  '.h5',
  '.pkl',
  '.pickle',
  '.arrow',
  '.jsonl.gz',
)


def _tracked() -> list[str]:
  if shutil.which('git') is None or not (ROOT / '.git').exists():
    pytest.skip('not a git checkout: no tracked files to read')
  out = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, check=True)
  return [name for name in out.stdout.decode().split('\0') if name]


def test_no_weight_or_data_files_are_committed():
  committed = [name for name in _tracked() if name.endswith(WEIGHT_SUFFIXES)]
  assert not committed, f'weights or data arrays committed: {committed}'
