"""Issue 14 probe on the H200: where a small restore's fixed time goes, without the model.

    python experiments/device/restore_profile.py OUT.txt

A synthetic float32 block of gemma-3-270m's shape (18 layers, 1 kv head of 256) of 1,024
tokens in a BlockStore, read by `restore.read` into one pinned `Staging` 20 times after a
warm-up; the median, and cProfile's cumulative times of the calling thread over those 20
reads. Results: experiments/results/logs/restore_profile_h200.txt.
"""

import cProfile
import io
import pathlib
import pstats
import sys
import tempfile
import time

import jax
import numpy as np

import synthetic_block
from graftjax import restore
from graftjax import store as store_lib


def main():
  n = 1024
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    key = synthetic_block.put(store, n, rng)
    staging = restore.Staging()
    read = lambda: jax.block_until_ready(
      list(restore.read(store, key, staging, capacity=n + 1024).copies.values())
    )
    read()
    times = []
    for _ in range(20):
      t0 = time.perf_counter()
      read()
      times.append(time.perf_counter() - t0)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
      read()
    profile.disable()
  out = io.StringIO()
  out.write(
    f'{jax.devices()[0].device_kind}: read + copies, median of 20: {np.median(times) * 1e3:.2f} ms\n'
  )
  pstats.Stats(profile, stream=out).sort_stats('cumulative').print_stats(40)
  text = out.getvalue()
  pathlib.Path(sys.argv[1]).write_text(text)
  print(text)


if __name__ == '__main__':
  main()
