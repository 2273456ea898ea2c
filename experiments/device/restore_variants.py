"""Issue 14 probe on the H200: verified read + copy to the device, four ways, without the model.

    python experiments/device/restore_variants.py OUT.json

For synthetic float32 blocks of gemma-3-270m's shape (18 layers, 1 kv head of 256) of 1k,
8k and 32k tokens in a BlockStore (warm in the page cache), each the median of 7 after a
warm-up: `restore.read` into one pinned `Staging`, then k, v and positions on the device.
Ways: each chunk hashed piece by piece as it is read (4 MiB pieces, `fused`) or read whole
and then hashed by BLAKE3 on all cores (`after`); with k and v copied as each verifies
(`early`) or after the read. Results: experiments/results/logs/restore_variants_h200.txt.
"""

import json
import os
import pathlib
import sys
import tempfile
import time

import blake3
import jax
import numpy as np

import synthetic_block
from graftjax import restore
from graftjax import store as store_lib
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read

FUSED = store_read._read_file  # pylint: disable=protected-access


def read_then_hash(where, local, chunk, expected, out, store_format):
  """The chunk read whole, then hashed by BLAKE3 with every core (format 3 only)."""
  fd = os.open(os.path.join(local, chunk.path), os.O_RDONLY | os.O_NOFOLLOW)
  with open(fd, 'rb', buffering=0) as f:
    done = 0
    while done < out.size:
      count = f.readinto(out[done:])
      if not count:
        raise ValueError('short')
      done += count
  assert store_format == store_manifest.FORMAT
  found = blake3.blake3(out, max_threads=blake3.blake3.AUTO).hexdigest()
  return store_read._checked(where, chunk, expected, found)  # pylint: disable=protected-access


def timed(fn, repeats=7):
  fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main():
  rows = []
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    for n in (1024, 8192, 32768):
      key = synthetic_block.put(store, n, rng)
      staging = restore.Staging()
      row = {'tokens': n, 'staging': staging.memory}
      for read_name, read_file in (('fused', FUSED), ('after', read_then_hash)):
        store_read._read_file = read_file  # pylint: disable=protected-access
        for early in (True, False):

          def run():
            staged = restore.read(store, key, staging, capacity=n + 1024)
            out = [staged.copies.get(name) for name in ('k', 'v')] if early else []
            out = [
              a if a is not None else staging.to_device(name, staged.rows)
              for a, name in zip(out or [None, None], ('k', 'v'))
            ]
            return out + [staging.to_device('positions', staged.rows)]

          if not early:
            original = store.get_page
            store.get_page = lambda key, into=None, on_verified=None: original(key, into=into)
          row[f'{read_name}_{"early" if early else "after_read"}_s'] = timed(run)
          if not early:
            store.get_page = original
      store_read._read_file = FUSED  # pylint: disable=protected-access
      rows.append(row)
      print(json.dumps(row), flush=True)
      store.delete(key)
  pathlib.Path(sys.argv[1]).write_text(
    json.dumps({'device': jax.devices()[0].device_kind, 'rows': rows}, indent=1)
  )


if __name__ == '__main__':
  main()
