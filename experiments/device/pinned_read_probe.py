"""Issue 14 probe on the H200: is reading back pinned host memory what slows a verified read?

    python experiments/device/pinned_read_probe.py OUT.json

For 36 files of 1 MiB and 32 MiB (a 1k and a 32k float32 block), warm in the page cache,
16 threads, each the fastest of 5: BLAKE3 of bytes already in pinned host memory against
the same bytes in numpy memory; the verified read (4 MiB pieces, each hashed as it lands)
into numpy memory, into pinned memory, and through a 4 MiB bounce buffer per thread (read
and hashed there, then copied into pinned memory). Results:
experiments/results/logs/pinned_read_probe_h200.txt.
"""

import concurrent.futures
import ctypes
import json
import pathlib
import sys
import tempfile
import threading
import time

import blake3
import jax
import numpy as np

PIECE = 1 << 22
FILES = 36
DEVICE = jax.devices()[0]
PINNED = jax.sharding.SingleDeviceSharding(DEVICE, memory_kind='pinned_host')
_local = threading.local()


def fastest(fn, repeats=5):
  fn()
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def pinned_view(nbytes):
  pinned = jax.block_until_ready(jax.device_put(np.zeros(nbytes, np.uint8), PINNED))
  memory = (ctypes.c_uint8 * nbytes).from_address(pinned.unsafe_buffer_pointer())
  return np.frombuffer(memory, np.uint8), pinned


def fused(path, out):
  digest = blake3.blake3()
  with open(path, 'rb', buffering=0) as f:
    done = 0
    while done < out.size:
      count = f.readinto(out[done : done + PIECE])
      digest.update(out[done : done + count])
      done += count
  return digest.digest()


def bounced(path, out):
  bounce = getattr(_local, 'bounce', None)
  if bounce is None:
    bounce = _local.bounce = np.ones(PIECE, np.uint8)
  digest = blake3.blake3()
  with open(path, 'rb', buffering=0) as f:
    done = 0
    while done < out.size:
      count = f.readinto(bounce[: min(PIECE, out.size - done)])
      digest.update(bounce[:count])
      out[done : done + count] = bounce[:count]
      done += count
  return digest.digest()


def main():
  rows = []
  for size in (1 << 20, 32 << 20):
    with tempfile.TemporaryDirectory() as tmp:
      rng = np.random.default_rng(0)
      files = []
      for i in range(FILES):
        path = pathlib.Path(tmp) / f'f{i}'
        path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        files.append(path)
      host = np.ones(size * FILES, np.uint8)
      pinned, keep = pinned_view(size * FILES)
      pinned[:] = host
      host_parts = [host[i * size : (i + 1) * size] for i in range(FILES)]
      pinned_parts = [pinned[i * size : (i + 1) * size] for i in range(FILES)]
      row = {'file_bytes': size, 'files': FILES}
      with concurrent.futures.ThreadPoolExecutor(16) as pool:
        run = lambda fn, parts: list(pool.map(fn, files, parts))
        hash_all = lambda parts: list(pool.map(lambda a: blake3.blake3(a).digest(), parts))
        row['hash_numpy_s'] = fastest(lambda: hash_all(host_parts))
        row['hash_pinned_s'] = fastest(lambda: hash_all(pinned_parts))
        row['verified_read_into_numpy_s'] = fastest(lambda: run(fused, host_parts))
        row['verified_read_into_pinned_s'] = fastest(lambda: run(fused, pinned_parts))
        row['verified_read_bounced_into_pinned_s'] = fastest(lambda: run(bounced, pinned_parts))
      rows.append(row)
      print(json.dumps({k: round(v * 1e3, 2) if k.endswith('_s') else v for k, v in row.items()}))
      del keep
  pathlib.Path(sys.argv[1]).write_text(json.dumps({'device': DEVICE.device_kind, 'rows': rows}))


if __name__ == '__main__':
  main()
