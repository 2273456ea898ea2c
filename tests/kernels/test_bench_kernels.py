"""experiments/bench_kernels.py stays runnable: a --quick run of one kernel.

In a subprocess, because the script pins XLA flags before jax starts.
"""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_quick_run_writes_json(tmp_path):
  out = tmp_path / 'bench.json'
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false')
  subprocess.run(
      [sys.executable, str(REPO / 'experiments' / 'bench_kernels.py'),
       '--quick', '--kernels=rms_norm', '--dtypes=float32', f'--out={out}'],
      check=True, cwd=REPO, env=env, timeout=300,
  )
  result = json.loads(out.read_text())
  assert result['quick'] is True
  assert result['config']['jax_version']
  assert result['config']['device_kind']
  cases = result['cases']
  assert {c['impl'] for c in cases} == {'pallas', 'xla'}
  for case in cases:
    assert 'error' not in case, case
    assert case['median_s'] > 0 and case['bytes'] > 0 and case['flops'] > 0
    assert case['max_abs_diff_pallas_vs_xla'] < 1e-4
