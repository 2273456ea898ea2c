"""Issue 14 probe on the H200: where a small restore's time goes beyond its verified read.

    python experiments/device/restore_overhead.py OUT.json

For synthetic float32 blocks of gemma-3-270m's shape (18 layers, 1 kv head of 256) of 1k to
32k tokens in a BlockStore (warm in the page cache), each the median of 15 after a warm-up:
`restore.read` into one pinned `Staging` with k, v on the device (as `bench_graft` times its
read stage), beside each fixed step of it timed alone (the listing, the manifest, the
zarr.json checks, the rebuilt manifest, the thread pool with no work, one copy's dispatch),
the chunk reads alone, the same read with a shorter GIL switch interval and with fewer
threads, and the block's floors (`restore_floor.measure`).

Results: experiments/results/logs/restore_overhead_h200.txt. That log (store format 3) timed
each step through `jax.block_until_ready(result)`, which walked the manifest's token-id list
as a pytree: its manifest_* figures are inflated by that walk (manifest_check_s even came out
negative); logs/restore_timeline_h200.txt has the manifest's own time. Only the read is
waited for now.
"""

import concurrent.futures
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
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read
from graftjax.studies import restore_floor


def median_s(fn, repeats=15):
  fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main():
  rows = []
  rng = np.random.default_rng(0)
  pool16 = store_chunks._pool()  # pylint: disable=protected-access
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    for n in (1024, 2048, 4096, 8192, 32768):
      key = synthetic_block.put(store, n, rng)
      staging = restore.Staging()
      read = lambda: jax.block_until_ready(
        list(restore.read(store, key, staging, capacity=n + 1024).copies.values())
      )
      local = str(pathlib.Path(store.root) / key)
      kv = store._kv / f'{key}/'  # pylint: disable=protected-access
      data = store_kvstore.read_value(kv, store_manifest.MANIFEST)
      manifest, meta2 = store_manifest.parse_manifest(data, 'w', key)
      entries = manifest['arrays']
      chunks = {
        name: store_chunks.chunks(name, e['dtype'], e['shape']) for name, e in entries.items()
      }
      names = ['k', 'v', 'positions']
      arrays = {
        'k': staging.buffer('k', k.shape, k.dtype),
        'v': staging.buffer('v', k.shape, k.dtype),
        'positions': staging.buffer('positions', (n,), np.int32),
      }
      _, reads = store_read._jobs(chunks, entries, names, None, arrays, manifest['format'])
      fmt = manifest['format']
      chunk_reads = lambda: store_chunks.map_threads(
        lambda r: store_read._read_file('w', local, *r, fmt), reads
      )
      shapes = {name: store_read._shape_only(e) for name, e in entries.items()}
      digests = {name: e['chunk_blake3'] for name, e in entries.items()}

      def rebuilt():
        again = store_manifest.build_manifest(
          key, store_manifest.meta_json(meta2), shapes, digests, None
        )
        return store_manifest.differences(manifest, again)

      def dispatch():  # the time to return, not to land
        t0 = time.perf_counter()
        copy = staging.to_device('k', n)
        spent = time.perf_counter() - t0
        jax.block_until_ready(copy)
        staging.landed()
        return spent

      dispatch()
      row = {
        'tokens': n,
        'staging': staging.memory,
        'read_and_copies_s': median_s(read),
        'chunk_reads_alone_s': median_s(chunk_reads),
        'listing_s': median_s(lambda: store_read._listing(kv, 'w', local)),
        'manifest_read_parse_check_s': median_s(
          lambda: store_manifest.parse_manifest(
            store_kvstore.read_value(kv, store_manifest.MANIFEST), 'w', key
          )
        ),
        'manifest_load_json_s': median_s(lambda: store_manifest.load_json(data)),
        'manifest_check_s': median_s(
          lambda: store_manifest.check_manifest(store_manifest.load_json(data))
        )
        - median_s(lambda: store_manifest.load_json(data)),
        'manifest_key_for_s': median_s(lambda: store_manifest.key_for(meta2)),
        'zarr_checks_s': median_s(
          lambda: [
            store_read._check_zarr_metadata(
              store_kvstore.read_value(kv, f'{name}/zarr.json'), 'w', name, entries[name], '.'
            )
            for name in names
          ]
        ),
        'rebuilt_manifest_s': median_s(rebuilt),
        'pool_no_work_s': median_s(lambda: store_chunks.map_threads(lambda x: x, reads)),
        'copy_dispatch_k_s': float(np.median([dispatch() for _ in range(15)])),
      }
      sys.setswitchinterval(1e-4)
      row['read_and_copies_switch_100us_s'] = median_s(read)
      row['chunk_reads_alone_switch_100us_s'] = median_s(chunk_reads)
      sys.setswitchinterval(5e-3)
      for threads in (4, 8):
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix='p') as pool:
          store_chunks._pool = lambda pool=pool: pool
          row[f'read_and_copies_{threads}_threads_s'] = median_s(read)
          row[f'chunk_reads_alone_{threads}_threads_s'] = median_s(chunk_reads)
        store_chunks._pool = lambda: pool16
      row['floor'] = restore_floor.measure(pathlib.Path(local), repeats=7)
      rows.append(row)
      print(json.dumps(row), flush=True)
  pathlib.Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
  main()
