"""Issue 14 probe on the H200: a read's threads against its block's size, without the model.

    python experiments/device/restore_threads.py OUT.json

For synthetic float32 blocks of gemma-3-270m's shape (18 layers, 1 kv head of 256) of 1k to
32k tokens (warm in the page cache): `restore.read` into one pinned `Staging` with k and v
waited for on the device, the median of 15 after a warm-up, for several
`store_read.BYTES_PER_THREAD` (one thread per that many bytes of chunks, at most one per
CPU; 1 byte: always one per CPU), beside the block's floors (`restore_floor.measure`).
Results: experiments/results/logs/restore_threads_h200.txt.
"""

import json
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

import synthetic_block
from graftjax import restore
from graftjax import store as store_lib
from graftjax.store import read as store_read
from graftjax.studies import restore_floor


def main():
  rows = []
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    for n in (1024, 2048, 4096, 8192, 32768):
      key = synthetic_block.put(store, n, rng)
      staging = restore.Staging()
      row = {'tokens': n, 'staging': staging.memory, 'read_and_copies_s': {}}
      for per_thread in (1, 2 << 20, 4 << 20, 8 << 20, 16 << 20):
        store_read.BYTES_PER_THREAD = per_thread
        times = []
        for i in range(16):
          t0 = time.perf_counter()
          staged = restore.read(store, key, staging, capacity=n + 1024)
          jax.block_until_ready(list(staged.copies.values()))
          if i:
            times.append(time.perf_counter() - t0)
          staging.landed()
        row['read_and_copies_s'][str(per_thread)] = float(np.median(times))
      row['floor'] = restore_floor.measure(pathlib.Path(store.root) / key, repeats=7)
      rows.append(row)
      print(
        n,
        {b: round(t * 1e3, 2) for b, t in row['read_and_copies_s'].items()},
        'floor',
        round(row['floor']['floor_s'] * 1e3, 2),
        flush=True,
      )
  pathlib.Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
  main()
