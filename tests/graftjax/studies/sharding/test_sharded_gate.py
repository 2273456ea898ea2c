"""experiments/sharded_gate.py at tiny size on 2 and 4 forced host devices (CPU).

The tiny Gemma 4 31B structure with 4 kv heads (head size 16) on its sliding layers and 2
(head size 32) on its global one. Blocks are compact: the global layer whole in k, v, the
sliding layers' last W - 1 rows in k_tail, v_tail, each array split by its own kv heads. On
2 devices every array splits (the gate with a ring local cache that wraps, the bench with
a ring); on 4 the global cache and a block's k, v are replicated over 'model' while the
sliding layers and k_tail, v_tail split (a fresh-process restore, full-size local cache).
These runs check the script's plumbing; their bits are CPU bits, not GPU results, and
nothing of them is committed.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from graftjax import ledger
from graftjax.models.gemma import config as config_lib

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

REPO = pathlib.Path(__file__).parents[4]
TINY = [
  '--model=tiny-gemma4-31b',
  '--num_kv_heads=4',
  '--num_global_kv_heads=2',
  '--samples=1',
  '--prefix_tokens=24',
  '--continuation_tokens=8',
  '--rollout_tokens=2',
  '--chunk_size=8',
]


def _run(tmp_path, devices: int, mode: str, *flags: str) -> dict:
  out = tmp_path / f'{mode}_{devices}.json'
  env = dict(
    os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}', JAX_PLATFORMS='cpu'
  )
  proc = subprocess.run(
    [
      sys.executable,
      'experiments/sharded_gate.py',
      f'--mode={mode}',
      *TINY,
      *flags,
      f'--out={out}',
    ],
    capture_output=True,
    text=True,
    check=False,
    env=env,
    cwd=REPO,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return ledger.verify_result(out)


def test_gate_on_two_devices_is_byte_equal_through_the_sharded_store(tmp_path):
  # A ring that takes chunks of 8: W - 1 + 8 = 15 slots, which the 24-token prefix wraps.
  result = _run(tmp_path, 2, 'gate', '--local_cache=ring', '--bench_chunk=8')
  assert result['mesh']['model'] == 2 and result['mesh']['visible_devices'] == 2
  assert result['settings']['local_cache'] == 'ring'
  summary = result['summary']
  assert summary['fresh_vs_grafted']['byte_equal'] == summary['fresh_vs_grafted']['samples'] == 1
  assert summary['rollout_fresh_vs_grafted']['logits_byte_equal'] == 1
  logits = result['samples'][0]['fresh_vs_grafted']['logits']
  assert logits['sha256_reference'] == logits['sha256_candidate']
  assert result['determinism']['device_count'] == 2
  # the sharded fingerprint folds the mesh in; the one-device one is recorded beside it
  assert result['inputs']['model_fingerprint'] != result['inputs']['unsharded_fingerprint']


def test_a_fresh_process_on_four_devices_restores_byte_equal(tmp_path):
  result = _run(tmp_path, 4, 'restore')
  assert result['mesh']['model'] == 4
  assert result['summary']['fresh_vs_restored_other_process']['byte_equal'] == 1
  (sample,) = result['samples']
  assert sample['restore_bytes_read'] > 0
  assert result['other_process_determinism']['device_count'] == 4


def _compact_bytes(config, n: int, itemsize: int) -> int:
  """k, v of the global layers' n rows and of the sliding layers' last W - 1, and positions."""
  rows = lambda i: n if config.window(i) is None else min(n, config.window(i) - 1)
  row = lambda i: config.kv_heads_of(i) * config.head_dim_of(i) * itemsize
  return sum(2 * rows(i) * row(i) for i in config.cached_layers) + 4 * n


def test_kernels_and_bench_on_two_devices(tmp_path):
  kernels = _run(tmp_path, 2, 'kernels', '--chunk_sizes=8')  # Pallas in interpret mode: slow
  assert kernels['impl'] == 'pallas' and [c['chunk_size'] for c in kernels['cells']] == [8]
  assert all(c['samples_byte_equal'] == c['samples'] == 1 for c in kernels['cells'])
  bench = _run(
    tmp_path, 2, 'bench', '--prefixes=40', '--repeats=1', '--bench_chunk=16', '--local_cache=ring'
  )
  (row,) = bench['rows']
  assert row['prefix_tokens'] == 40 and row['first_token_byte_equal']
  # A compact block (the sliding layers' last W - 1 rows), each device holding half its heads.
  config = config_lib.get_config('tiny-gemma4-31b', num_kv_heads=4, num_global_kv_heads=2)
  assert row['block_bytes'] == _compact_bytes(config, 40, itemsize=2)  # bfloat16
  assert row['restore_bytes_per_device'] == [(row['block_bytes'] - 4 * 40) // 2] * 2
  assert json.dumps(bench['settings'])  # the configuration is recorded
