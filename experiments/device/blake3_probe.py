"""Issue 14 probe on the H200 host: SHA-256 against BLAKE3, hashing and verified reads.

    python experiments/device/blake3_probe.py   (blake3 wheel in .whl)

36 files of 1 MiB and 32 MiB (a 1k and a 32k float32 block of gemma-3-270m), 16 threads.
Results: experiments/results/logs/blake3_probe_h200.txt.
"""

import concurrent.futures
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time

import blake3
import numpy as np

PIECE = 1 << 18


def fastest(fn, r=5):
  fn()
  best = 1e9
  for _ in range(r):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def read_into(path, out, h):
  d = h() if h else None
  with open(path, 'rb', buffering=0) as f:
    done = 0
    while done < out.size:
      c = f.readinto(out[done : done + PIECE])
      if d is not None:
        d.update(out[done : done + c])
      done += c


rows = {}
for size in (1 << 20, 32 << 20):
  with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(0)
    files = []
    for i in range(36):
      p = pathlib.Path(tmp) / f'f{i}'
      p.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
      files.append(p)
    host = [np.ones(size, np.uint8) for _ in files]
    row = {}
    row['sha256_1file_s'] = fastest(lambda: hashlib.sha256(host[0]).digest())
    row['blake3_1file_s'] = fastest(lambda: blake3.blake3(host[0]).digest())
    row['blake3_auto_1file_s'] = fastest(
      lambda: blake3.blake3(host[0], max_threads=blake3.blake3.AUTO).digest()
    )
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
      jobs = list(zip(files, host))
      row['read_s'] = fastest(lambda: list(pool.map(lambda j: read_into(*j, None), jobs)))
      for name, h in (('sha256', hashlib.sha256), ('blake3', blake3.blake3)):
        row[f'hash_all_{name}_s'] = fastest(
          lambda h=h: list(pool.map(lambda a: h(a).digest(), host))
        )
        row[f'verified_read_{name}_s'] = fastest(
          lambda h=h: list(pool.map(lambda j: read_into(*j, h), jobs))
        )
    rows[size] = row
    print(size, json.dumps(row), flush=True)
