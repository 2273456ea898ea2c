"""experiments/bench_graft.py on the tiny model: runs, and its graft reproduces the recompute bits."""

import pytest
import pathlib
import subprocess
import sys

from graftjax import ledger

SCRIPT = pathlib.Path(__file__).parents[4] / 'experiments' / 'bench_graft.py'


@pytest.mark.slow
@pytest.mark.parametrize('local_cache', ['full', 'ring'])
def test_bench_graft_smoke(tmp_path, local_cache):
  out = tmp_path / 'bench.json'
  proc = subprocess.run(
    [
      sys.executable,
      str(SCRIPT),
      '--model=tiny',
      '--prefix_tokens=40,96',
      '--chunk_size=32',
      '--repeats=1',
      f'--local_cache={local_cache}',
      f'--out={out}',
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = ledger.verify_result(out)
  assert [row['prefix_tokens'] for row in result['rows']] == [40, 96]
  assert result['local_cache'] == local_cache
  for row in result['rows']:
    assert row['graft_logits_equal_recompute']
    stages = row['graft_stages_median_s']
    assert row['restore_s'] == stages['read_s'] + stages['install_s']
    assert row['restore_over_floor'] > 0 and row['speedup'] > 0
    assert row['restore_first_read_over_floor'] > 0
