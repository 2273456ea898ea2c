"""Issue 14 probe on the H200: a timeline of one restore's read stage, without the model.

    python experiments/device/restore_timeline.py OUT.json

For synthetic float32 blocks of gemma-3-270m's shape (18 layers, 1 kv head of 256) of 1k, 4k
and 32k tokens (warm in the page cache), `restore.read` into one pinned `Staging` 15 times
after a warm-up, with k and v waited for on the device; each step of the calling thread is
marked by wrapping the store's functions, and each chunk read's start and end on the pool's
threads. Medians of each mark (ms from the start), with 16 and with 4 pool threads.
Results: experiments/results/logs/restore_timeline_h200.txt (format 3) and
restore_timeline_format4_h200.txt.
"""

import concurrent.futures
import functools
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
from graftjax.store import chunks as store_chunks
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read

MARKS = {}
JOBS = []


def marked(module, name, label):
  fn = getattr(module, name)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    MARKS.setdefault(f'{label}_start', time.perf_counter())
    out = fn(*args, **kwargs)
    MARKS[f'{label}_end'] = time.perf_counter()
    return out

  setattr(module, name, wrapper)


def main():
  for module, name, label in (
    (store_read, '_listing', 'listing'),
    (store_manifest, 'parse_manifest', 'manifest'),
    (store_read, '_check_zarr_metadata', 'zarr'),
    (store_read, '_destinations', 'destinations'),
    (store_read, '_jobs', 'jobs'),
    (store_chunks, 'map_threads', 'pool'),
    (store_manifest, 'build_manifest', 'rebuild'),
    (store_manifest, 'differences', 'differences'),
  ):
    marked(module, name, label)
  read_file = store_read._read_file

  def timed_read(*args):
    t0 = time.perf_counter()
    out = read_file(*args)
    JOBS.append((t0, time.perf_counter()))
    return out

  store_read._read_file = timed_read
  to_device = restore.Staging.to_device

  def timed_to_device(self, name, rows, layers=slice(None)):
    MARKS.setdefault(f'copy_{name}_start', time.perf_counter())
    out = to_device(self, name, rows, layers)
    MARKS[f'copy_{name}_end'] = time.perf_counter()
    return out

  restore.Staging.to_device = timed_to_device
  rows = []
  rng = np.random.default_rng(0)
  pool16 = store_chunks._pool()
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    for n in (1024, 4096, 32768):
      key = synthetic_block.put(store, n, rng)
      staging = restore.Staging()
      for threads in (16, 4):
        pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix='graftjax-store')
        store_chunks._pool = (lambda pool=pool: pool) if threads != 16 else (lambda: pool16)
        runs = []
        for i in range(16):
          MARKS.clear()
          JOBS.clear()
          t0 = time.perf_counter()
          staged = restore.read(store, key, staging, capacity=n + 1024)
          t1 = time.perf_counter()
          jax.block_until_ready(list(staged.copies.values()))
          t2 = time.perf_counter()
          staging.landed()
          marks = {name: (t - t0) * 1e3 for name, t in MARKS.items()}
          marks.update(
            read_returned=(t1 - t0) * 1e3,
            copies_landed=(t2 - t0) * 1e3,
            first_chunk_start=(min(a for a, _ in JOBS) - t0) * 1e3,
            last_chunk_end=(max(b for _, b in JOBS) - t0) * 1e3,
            chunk_busy_sum=sum(b - a for a, b in JOBS) * 1e3,
          )
          if i:
            runs.append(marks)
        median = {name: float(np.median([r[name] for r in runs])) for name in runs[0]}
        median = dict(sorted(median.items(), key=lambda item: item[1]))
        rows.append({'tokens': n, 'threads': threads, 'staging': staging.memory, 'ms': median})
        print(n, threads, {k: round(v, 2) for k, v in median.items()}, flush=True)
        store_chunks._pool = lambda: pool16
  pathlib.Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
  main()
