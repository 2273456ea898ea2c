"""Issue 14 probe on the H200 host: BLAKE3 verified reads by piece size and thread count.

    python experiments/device/blake3_pieces_probe.py   (blake3 wheel in .whl)

Hashed as each piece lands (fused) or after the whole file is read (after), pieces of
256 KiB to 4 MiB, 8 or 16 threads; read_t* is one readinto per file, unhashed.
Results: experiments/results/logs/blake3_pieces_probe_h200.txt.
"""

import concurrent.futures
import hashlib
import json
import os
import pathlib
import tempfile
import time

import blake3
import numpy as np


def fastest(fn, r=5):
  fn()
  best = 1e9
  for _ in range(r):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def fused(path, out, piece):
  d = blake3.blake3()
  with open(path, 'rb', buffering=0) as f:
    done = 0
    while done < out.size:
      c = f.readinto(out[done : done + piece])
      d.update(out[done : done + c])
      done += c
  return d.hexdigest()


def read_whole(path, out):
  """One unhashed readinto of the whole file."""
  with open(path, 'rb', buffering=0) as f:
    return f.readinto(out)


def after(path, out, piece, threads=1):
  with open(path, 'rb', buffering=0) as f:
    done = 0
    while done < out.size:
      done += f.readinto(out[done : done + piece])
  return blake3.blake3(out, max_threads=threads).hexdigest()


for size in (1 << 20, 32 << 20):
  with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(0)
    files = []
    for i in range(36):
      p = pathlib.Path(tmp) / f'f{i}'
      p.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
      files.append(p)
    host = [np.ones(size, np.uint8) for _ in files]
    jobs = list(zip(files, host))
    row = {}
    for threads in (8, 16):
      with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        row[f'read_t{threads}'] = fastest(
          lambda: list(
            pool.map(
              lambda j: read_whole(*j),
              jobs,
            )
          )
        )
        for piece in (1 << 18, 1 << 20, 1 << 22):
          row[f'fused_{piece >> 10}k_t{threads}'] = fastest(
            lambda p=piece: list(pool.map(lambda j: fused(*j, p), jobs))
          )
          row[f'after_{piece >> 10}k_t{threads}'] = fastest(
            lambda p=piece: list(pool.map(lambda j: after(*j, p), jobs))
          )
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      row['after_auto_t4'] = fastest(
        lambda: list(pool.map(lambda j: after(*j, 1 << 22, blake3.blake3.AUTO), jobs))
      )
    print(size, json.dumps({k: round(v * 1e3, 2) for k, v in row.items()}), flush=True)
