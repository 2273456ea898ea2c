"""The kernel benchmarks stay runnable: --quick runs of bench_kernels and the tile sweep.

In a subprocess, because the script pins XLA flags before jax starts.
"""

import pytest
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[4]


@pytest.mark.slow
def test_quick_run_writes_json(tmp_path):
  out = tmp_path / 'bench.json'
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false')
  subprocess.run(
    [
      sys.executable,
      str(REPO / 'experiments' / 'bench_kernels.py'),
      '--quick',
      '--kernels=rms_norm',
      '--dtype=float32',
      f'--out={out}',
    ],
    check=True,
    cwd=REPO,
    env=env,
    timeout=300,
  )
  result = json.loads(out.read_text())
  assert result['quick'] is True
  assert result['determinism']['jax_version']
  assert result['determinism']['device_kind']
  cases = result['cases']
  assert {c['impl'] for c in cases} == {'pallas', 'xla'}
  for case in cases:
    assert 'error' not in case, case
    assert case['median_s'] > 0 and case['bytes'] > 0 and case['flops'] > 0
    assert case['max_abs_diff_pallas_vs_xla'] < 1e-4


@pytest.mark.slow
def test_attention_tile_sweep_quick_run_writes_json(tmp_path):
  out = tmp_path / 'tiles.json'
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false')
  subprocess.run(
    [
      sys.executable,
      str(REPO / 'experiments' / 'bench_attention_tiles.py'),
      '--quick',
      f'--out={out}',
    ],
    check=True,
    cwd=REPO,
    env=env,
    timeout=300,
  )
  result = json.loads(out.read_text())
  rows = result['rows']
  assert {r['dtype'] for r in rows} == {'float32', 'bfloat16'}
  assert {r['phase'] for r in rows} == {'decode', 'prefill'}
  for row in rows:
    assert 'error' not in row, row
    assert row['device_s'] > 0 and row['floor_s'] > 0
    if row['impl'] == 'pallas':
      assert row['max_abs_diff_vs_reference'] < 2e-2
