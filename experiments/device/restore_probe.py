"""Issue 14 probe on the H200: where a verified restore's time goes, without the model.

    python experiments/device/restore_probe.py OUT.json

For 36 files (gemma-3-270m's 18 layers of k and v) of 1 MiB and 32 MiB each (a 1k and a
32k float32 block), warm in the page cache, each the fastest of 5: SHA-256 alone, the plain
and the verified read (256 KiB pieces, hashed as they land) into touched memory with a pool
of 16 threads (one per CPU, as the store reads) and with one thread per file; and a
verified read into one pinned host buffer per file, each buffer's host-to-device copy
started as soon as its file verifies (the pipelined restore), against the same reads
followed by one copy. Also: whether `device_put` of a numpy view of pinned memory is a
pinned-speed copy. Results: experiments/results/logs/restore_probe_h200.txt.
"""

import concurrent.futures
import ctypes
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

_PIECE = 1 << 18
FILES = 36
DEVICE = jax.devices()[0]
PINNED = jax.sharding.SingleDeviceSharding(DEVICE, memory_kind='pinned_host')
ON_DEVICE = jax.sharding.SingleDeviceSharding(DEVICE, memory_kind='device')


def fastest(fn, repeats=5):
  fn()
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def read_into(path, out, hashed):
  digest = hashlib.sha256() if hashed else None
  with open(path, 'rb', buffering=0) as f:
    done = 0
    while done < out.size:
      count = f.readinto(out[done : done + _PIECE])
      if digest is not None:
        digest.update(out[done : done + count])
      done += count
  return digest


def pinned_buffer(nbytes):
  pinned = jax.block_until_ready(jax.device_put(np.zeros(nbytes, np.uint8), PINNED))
  memory = (ctypes.c_uint8 * nbytes).from_address(pinned.unsafe_buffer_pointer())
  return np.frombuffer(memory, np.uint8), pinned


def probe(size):
  row = {'file_bytes': size, 'files': FILES}
  with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(0)
    files = []
    for i in range(FILES):
      path = pathlib.Path(tmp) / f'f{i}'
      path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
      files.append(path)
    host = [np.ones(size, np.uint8) for _ in files]
    for threads in (os.cpu_count(), FILES):
      with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        jobs = list(zip(files, host))
        row[f'hash_s_{threads}'] = fastest(
          lambda: list(pool.map(lambda a: hashlib.sha256(a).digest(), host))
        )
        for hashed in (False, True):
          name = f'{"verified_" if hashed else ""}read_s_{threads}'
          row[name] = fastest(lambda h=hashed: list(pool.map(lambda j: read_into(*j, h), jobs)))
    row['hash_s_1thread_one_file'] = fastest(lambda: hashlib.sha256(host[0]).digest())
    big = np.ones(size * FILES, np.uint8)
    row['pageable_copy_s'] = fastest(lambda: jax.device_put(big, DEVICE))
    del big
    view_all, pinned_all = pinned_buffer(size * FILES)
    row['pinned_copy_s'] = fastest(lambda: jax.device_put(pinned_all, ON_DEVICE))
    row['numpy_view_of_pinned_copy_s'] = fastest(lambda: jax.device_put(view_all, DEVICE))
    del view_all, pinned_all
    buffers = [pinned_buffer(size) for _ in files]
    row['pinned_per_file_copy_s'] = fastest(
      lambda: [jax.device_put(p, ON_DEVICE) for _, p in buffers]
    )
    for threads in (os.cpu_count(), FILES):
      with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        jobs = [(path, view) for path, (view, _) in zip(files, buffers)]

        def then_copy():
          list(pool.map(lambda j: read_into(*j, True), jobs))
          return [jax.device_put(p, ON_DEVICE) for _, p in buffers]

        def pipelined():
          futures = {pool.submit(read_into, *j, True): i for i, j in enumerate(jobs)}
          out = [None] * len(jobs)
          for future in concurrent.futures.as_completed(futures):
            future.result()
            out[futures[future]] = jax.device_put(buffers[futures[future]][1], ON_DEVICE)
          return out

        row[f'verified_read_then_copy_s_{threads}'] = fastest(then_copy)
        row[f'verified_read_pipelined_copy_s_{threads}'] = fastest(pipelined)
  return row


def main():
  cpu = subprocess.run(['lscpu'], capture_output=True, text=True).stdout
  flags = open('/proc/cpuinfo').read()
  result = {
    'device': DEVICE.device_kind,
    'jax_version': jax.__version__,
    'cpu_count': os.cpu_count(),
    'lscpu': [
      l
      for l in cpu.splitlines()
      if l.split(':')[0].strip()
      in ('Model name', 'Thread(s) per core', 'Core(s) per socket', 'Socket(s)', 'L3 cache')
    ],
    'sha_ni': ' sha_ni' in flags,
    'openssl': __import__('ssl').OPENSSL_VERSION,
    'rows': [],
  }
  for size in (1 << 20, 32 << 20):
    result['rows'].append(probe(size))
    print(json.dumps(result['rows'][-1]), flush=True)
  pathlib.Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
  print(json.dumps({k: v for k, v in result.items() if k != 'rows'}))


if __name__ == '__main__':
  main()
