"""experiments/kernel_determinism.py: runs digest every kernel; merge finds differences."""

import pytest
import json
import pathlib
import subprocess
import sys

from graftjax import ledger

SCRIPT = pathlib.Path(__file__).parents[4] / 'experiments' / 'kernel_determinism.py'


def _run(*flags):
  proc = subprocess.run(
    [sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, check=False
  )
  return proc


@pytest.mark.slow
def test_two_processes_agree_and_a_changed_digest_is_found(tmp_path, run_together):
  paths = [tmp_path / f'{label}.json' for label in ('a', 'b')]
  flags = ['--model=tiny', '--quick', '--samples=1', '--prefix_tokens=16']
  for proc in run_together(
    *[
      [sys.executable, str(SCRIPT), *flags, f'--label={label}', f'--out={path}']
      for label, path in zip('ab', paths)
    ]
  ):
    assert proc.returncode == 0, proc.stderr[-3000:]
  merged = tmp_path / 'merged.json'
  proc = _run(f'--merge={paths[0]},{paths[1]}', f'--out={merged}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = ledger.verify_result(merged)
  assert result['identical'] and result['outputs'] == 17 and not result['errors']
  assert {run['label'] for run in result['runs']} == {'a', 'b'}
  assert result['runs'][0]['process']['pid'] != result['runs'][1]['process']['pid']

  # A run whose output bits differ is reported, not hidden.
  run_b = json.loads(paths[1].read_text())
  del run_b['result_sha256']
  run_b['digests']['matmul_float32'] = '0' * 64
  ledger.write_result(paths[1], run_b)
  proc = _run(f'--merge={paths[0]},{paths[1]}', f'--out={merged}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = ledger.verify_result(merged)
  assert not result['identical'] and result['differing'] == ['matmul_float32']
