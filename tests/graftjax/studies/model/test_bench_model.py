"""experiments/bench_model.py on the tiny architecture: every row and ratio is written."""

import pytest
import pathlib
import subprocess
import sys

from graftjax import ledger
from graftjax.models.gemma import config as config_lib

SCRIPT = pathlib.Path(__file__).parents[4] / 'experiments' / 'bench_model.py'


@pytest.mark.slow
def test_bench_model_per_op_smoke(tmp_path):
  out = tmp_path / 'bench.json'
  proc = subprocess.run(
    [
      sys.executable,
      str(SCRIPT),
      '--weights=random',
      '--model=tiny',
      '--impl=xla',
      '--impl=pallas',
      '--per_op',
      '--dtype=float32',
      '--prompt_tokens=8',
      '--decode_tokens=2',
      '--chunk_size=8',
      f'--out={out}',
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = ledger.verify_result(out)
  assert set(result['rows']) == {'graftjax_float32_xla', 'graftjax_float32_pallas'} | {
    f'graftjax_float32_xla+{op}=pallas' for op in config_lib.OPS
  }
  assert set(result['per_op_cost']['float32']) == set(config_lib.OPS)
  xla, pallas = result['rows']['graftjax_float32_xla'], result['rows']['graftjax_float32_pallas']
  assert result['invariance_cost']['float32']['decode_tokens_per_s'] == (
    xla['decode_tokens_per_s'] / pallas['decode_tokens_per_s'] - 1
  )
  assert result['inputs']['config'] == 'tiny'


def test_bench_model_per_op_needs_the_xla_row(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      str(SCRIPT),
      '--weights=random',
      '--model=tiny',
      '--impl=pallas',
      '--per_op',
      f'--out={tmp_path / "x.json"}',
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode != 0 and '--impl=xla' in proc.stderr
