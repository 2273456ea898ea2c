"""Issue 14 probe on the H200: a restore's read stage with verified layers copied in groups.

    python experiments/device/restore_groups.py OUT.json

For synthetic float32 blocks of gemma-3-270m's shape (18 layers, 1 kv head of 256) of 1k to
32k tokens (warm in the page cache): `restore.read` into one pinned `Staging` until every
copy landed, with `restore.COPY_BYTES` (bytes of verified layers per copy) of 1, 4 and 16 MiB
and whole arrays (one copy of k, one of v, as before). The variants take turns, 15 rounds
after a warm-up; medians, beside the block's floors (`restore_floor.measure`).
Results: experiments/results/logs/restore_groups_h200.txt.
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
from graftjax.studies import restore_floor

COPY_BYTES = {'whole': 1 << 40, '1MiB': 1 << 20, '4MiB': 4 << 20, '16MiB': 16 << 20}


def main():
  rows = []
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    for n in (1024, 2048, 4096, 32768):
      key = synthetic_block.put(store, n, rng)
      staging = restore.Staging()

      def read(copy_bytes):
        restore.COPY_BYTES = copy_bytes
        t0 = time.perf_counter()
        staged = restore.read(store, key, staging, capacity=n + 1024)
        jax.block_until_ready(staged.copies)
        return time.perf_counter() - t0, len(staged.copies['v'])

      times = {name: [] for name in COPY_BYTES}
      copies = {name: read(b)[1] for name, b in COPY_BYTES.items()}  # warm-up
      for _ in range(15):
        for name, copy_bytes in COPY_BYTES.items():
          times[name].append(read(copy_bytes)[0])
      floor = restore_floor.measure(pathlib.Path(store.root) / key, repeats=7)
      row = {
        'tokens': n,
        'staging': staging.memory,
        'read_and_copies_ms': {name: float(np.median(t)) * 1e3 for name, t in times.items()},
        'copies_of_v': copies,
        'over_floor': {name: float(np.median(t)) / floor['floor_s'] for name, t in times.items()},
        'floor': floor,
      }
      rows.append(row)
      print(json.dumps({k: row[k] for k in row if k != 'floor'}), flush=True)
  pathlib.Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
  main()
