"""Two processes on this machine form one mesh (jax.distributed, CPU collectives):
a compact block (its sliding layers' last W - 1 rows in k_tail, v_tail) deposited from the pair is restored into the pair byte-equal, each process
writing and reading only its own kv heads (the processes along 'model') or a batch row
held by one process (along 'data'); a process killed mid-deposit leaves no block."""

import json
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from graftjax.store import sharded as sharded_store
from graftjax import store as store_lib

# Every test here drives a pair of jax processes.
pytestmark = pytest.mark.subprocess

PAIR = pathlib.Path(__file__).with_name('sharded_pair.py')
REPO = pathlib.Path(__file__).parents[2]
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _start_pair(root, out, mode):
  port = _free_port()
  return [
    subprocess.Popen(
      [sys.executable, str(PAIR), str(i), str(port), str(root), str(out / f'p{i}.json'), mode],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      cwd=REPO,
    )
    for i in range(2)
  ]


def _stop(procs):
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
  return [proc.communicate()[0] for proc in procs]


def _run_pair(root, out, mode='roundtrip'):
  procs = _start_pair(root, out, mode)
  try:
    for proc in procs:
      proc.wait(timeout=TIMEOUT_S)
  finally:
    logs = _stop(procs)
  for proc, log in zip(procs, logs, strict=True):
    assert proc.returncode == 0, log[-4000:]
  return [json.loads((out / f'p{i}.json').read_text()) for i in range(2)]


def _kill_mid_deposit(root, out):
  """Process 1 kills itself after writing its first chunk; process 0 is then stopped."""
  procs = _start_pair(root, out, 'die')
  try:
    procs[1].wait(timeout=TIMEOUT_S)
    time.sleep(2)  # process 0 has nothing to finish: it waits for process 1's digests
    assert procs[0].poll() is None, 'process 0 finished a deposit without process 1'
  finally:
    logs = _stop(procs)
  assert procs[1].returncode == -9, logs[1][-4000:]
  return json.loads((out / 'p0.json').read_text())['key']


@pytest.fixture(scope='module')
def pair_runs(tmp_path_factory):
  """A killed deposit, then a whole one, into one store."""
  root = tmp_path_factory.mktemp('store')
  killed = _kill_mid_deposit(root, tmp_path_factory.mktemp('killed'))
  leftovers = sorted(p.relative_to(root) for p in (root / '.tmp').rglob('c.*'))
  store = sharded_store.ShardedStore(root)
  listed = store.list()
  try:
    store.read(killed, None)
    unreadable = False
  except store_lib.MissingBlockError:
    unreadable = True
  collected = store_lib.BlockStore(root).gc()
  results = _run_pair(root, tmp_path_factory.mktemp('whole'))
  return {
    'root': root,
    'killed': killed,
    'leftovers': leftovers,
    'listed': listed,
    'unreadable': unreadable,
    'collected': collected,
    'results': results,
  }


def test_a_process_killed_mid_deposit_leaves_no_block(pair_runs):
  key = pair_runs['killed']
  assert pair_runs['leftovers'], 'the killed deposit wrote no chunk before dying'
  assert pair_runs['listed'] == [] and pair_runs['unreadable']
  assert pair_runs['collected'] == 1  # BlockStore.gc clears the staged files
  # the store holds the block only from the later, whole deposit
  assert pair_runs['results'][0]['key'] == key


def test_deposit_from_the_pair_restores_into_the_pair_byte_equal(pair_runs):
  for result in pair_runs['results']:
    assert result['devices'] == 4
    assert result['listed'] == [result['key']]
    assert result['cache_equal'] and result['grafted_equals_fresh']
  store = sharded_store.ShardedStore(pair_runs['root'])
  assert store.list() == [pair_runs['results'][0]['key']]
  # BlockStore lists it too, and names the format it does not read
  assert store_lib.BlockStore(pair_runs['root']).list() == store.list()
  with pytest.raises(store_lib.UnsupportedFormatError, match=sharded_store.FORMAT):
    store_lib.BlockStore(pair_runs['root']).get(store.list()[0])


def test_each_process_writes_and_reads_only_its_kv_heads(pair_runs):
  p0, p1 = pair_runs['results']
  assert p0['tail_rows'] > 0  # a compact block: its tail arrays are split as k, v are
  assert {w.split('/')[0] for w in p0['written'] if '/c.' in w} >= {'k', 'v', 'k_tail', 'v_tail'}
  # 8 kv heads over 4 devices, 2 a device and 2 devices a process: chunks of 2 heads.
  assert p0['heads_held'] == [[0, 2], [2, 4]] and p1['heads_held'] == [[4, 6], [6, 8]]
  kv = lambda written: {w for w in written if w[0] in 'kv' and '/c.' in w}
  groups = lambda written: {int(w.split('.')[3]) for w in kv(written)}
  assert groups(p0['written']) == {0, 1} and groups(p1['written']) == {2, 3}
  assert not kv(p0['written']) & kv(p1['written'])
  assert 'manifest.json' in p0['written'] and 'manifest.json' not in p1['written']
  for result in (p0, p1):
    assert result['reads_bytes'] == result['block_kv_bytes'] // 2
    assert result['reads_chunks'] == len(kv(result['written']))
    # tensorstore's own count of bytes read from files: the half, the manifest, the positions
    expected = result['reads_bytes'] + result['manifest_bytes'] + result['positions_bytes']
    assert result['tensorstore_bytes_read'] == expected


def test_processes_along_the_data_axis_deposit_and_restore_a_row(tmp_path):
  """A batch of two rows, one a process (each row split over its process's two devices by
  kv heads): the row process 1 holds is captured and deposited, and restored into both rows,
  which continue byte-equal to the fresh ones."""
  p0, p1 = _run_pair(tmp_path / 'store', tmp_path, mode='data')
  assert p0['key'] == p1['key'] and p0['listed'] == [p0['key']]
  assert p0['rows_held'] == [[0, 1]] and p1['rows_held'] == [[1, 2]]
  for result in (p0, p1):
    assert result['heads_held'] == [[0, 4], [4, 8]]  # every head of its own row
    assert result['cache_equal'] and result['grafted_equals_fresh']
    assert result['reads_bytes'] == result['block_kv_bytes']  # its row holds every head
  # The block is replicated over 'data': its replica 0 (process 0's row) writes every chunk.
  assert p1['written'] == [] and 'manifest.json' in p0['written']
