"""What a restore cannot beat: the floors a stored block's restore is measured against.

For a block whose files lie under `folder` (warm in the page cache), each the fastest of
`repeats` runs, with as many threads as the store reads with (one per CPU):

- read: the files read into host memory touched beforehand (no page faults), each thread a
  file at a time in the store's pieces or in one `readinto` per file, or one thread in
  order, or in 16 MiB `read`s on one thread (the old floor's read), whichever is fastest;
- verified read: the same in the store's pieces, each piece hashed as it lands with the hash
  of the block's format as a restore hashes (`store.read.chunk_hash`: BLAKE3 on every core
  for chunks from 1 MiB; what a verified read must do), and with SHA-256 (format 2's hash)
  for comparison;
- hash: the format's hash so (and SHA-256) of the bytes already in memory;
- device copy: the block's bytes into the device's memory. On a GPU, `jax.device_put` from an
  array already in pinned host memory (`memory_kind='pinned_host'`) to the device; and the
  pageable copy from a numpy array, the old floor's. On CPU the device is host memory: a
  memcpy between buffers touched beforehand.

floor = read + device copy (pinned on a GPU); verified floor = verified read + device copy;
pageable floor = the old definition, bytes over a one-thread read bandwidth plus a pageable
host-to-device copy. docs/store_format.md, "Restoring into a cache", says why.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pathlib
import time
from collections.abc import Callable

import jax
import numpy as np

from graftjax import restore
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read


def _fastest(fn: Callable[[], object], repeats: int) -> float:
  """Seconds of the fastest of `repeats` calls after one warm-up."""
  fn()
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def _read_into(path: pathlib.Path, out: np.ndarray, new_hash, piece: int) -> None:
  """`path` read into `out` in `piece`s, each hashed as it lands if `new_hash(nbytes)`."""
  with open(path, 'rb', buffering=0) as f:
    digest = new_hash(out.size) if new_hash else None
    done = 0
    while done < out.size:
      count = f.readinto(out[done : done + piece])
      if digest is not None:
        digest.update(out[done : done + count])
      done += count


def measure(folder: pathlib.Path, *, repeats: int = 3) -> dict:
  """Floors (seconds) and the rates behind them for the block stored under `folder`."""
  files = sorted(p for p in folder.rglob('*') if p.is_file())
  sizes = [p.stat().st_size for p in files]
  nbytes = sum(sizes)
  starts = np.cumsum([0, *sizes])
  memory = np.ones(nbytes, np.uint8)  # touched: no page faults while timed
  places = [memory[a:b] for a, b in zip(starts, starts[1:])]
  store_format = json.loads((folder / store_manifest.MANIFEST).read_text())['format']
  new_hash = lambda nbytes: store_read.chunk_hash(store_format, nbytes)  # as a restore does
  sha256 = lambda nbytes: hashlib.sha256()
  threads = os.cpu_count() or 1
  pieces = (store_read.PIECE, max(sizes))
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:

    def read(hashing, parallel: bool, piece: int = store_read.PIECE):
      jobs = list(zip(files, places))
      if parallel:
        return list(pool.map(lambda job: _read_into(*job, hashing, piece), jobs))
      return [_read_into(*job, hashing, piece) for job in jobs]

    def hash_all(hashing):
      return list(pool.map(lambda place: _hashed(hashing, place), places))

    into_s = min(
      _fastest(lambda p=p, n=n: read(None, p, n), repeats) for p in (False, True) for n in pieces
    )
    verified = {
      name: min(_fastest(lambda p=p, h=h: read(h, p), repeats) for p in (False, True))
      for name, h in (('format', new_hash), ('sha256', sha256))
    }
    verified_read_s = verified['format']
    hash_s = _fastest(lambda: hash_all(new_hash), repeats)
    sha256_hash_s = _fastest(lambda: hash_all(sha256), repeats)
  sequential_read_s = _fastest(lambda: read_sequential(files), repeats)
  read_s = min(into_s, sequential_read_s)
  device = jax.devices()[0]
  copy = device_copy(nbytes, device, repeats=repeats)
  floors = {
    'floor_s': read_s + copy['copy_s'],
    'verified_floor_s': verified_read_s + copy['copy_s'],
    'floor_pageable_s': sequential_read_s + (copy['pageable_copy_s'] or 0.0),
  }
  return {
    'floor_bytes': nbytes,
    'threads': threads,
    'digest': store_manifest.DIGEST_OF_FORMAT[store_format],
    'read_s': read_s,
    'verified_read_s': verified_read_s,
    'verified_read_sha256_s': verified['sha256'],
    'hash_s': hash_s,
    'hash_sha256_s': sha256_hash_s,
    'sequential_read_s': sequential_read_s,
    'read_bandwidth_Bps': nbytes / read_s,
    'hash_bandwidth_Bps': nbytes / hash_s,
    **copy,
    **floors,
  }


def _hashed(new_hash, data: np.ndarray) -> bytes:
  digest = new_hash(data.size)
  digest.update(data)
  return digest.digest()


def read_sequential(files: list[pathlib.Path]) -> None:
  """Every file read in 16 MiB pieces on one thread: the old floor's read."""
  for path in files:
    with open(path, 'rb') as f:
      while f.read(1 << 24):
        pass


def device_copy(nbytes: int, device: jax.Device, *, repeats: int = 3) -> dict:
  """The fastest copy of `nbytes` into `device` memory: pinned (GPU) or memcpy (CPU).

  Returns:
    copy_s, copy_kind ('pinned_host_to_device', 'memcpy' or 'pageable_host_to_device' where
    the device offers no pinned memory) and pageable_copy_s (None on CPU).
  """
  host = np.ones(nbytes, np.uint8)
  if device.platform == 'cpu':
    target = np.zeros(nbytes, np.uint8)
    return {
      'copy_s': _fastest(lambda: np.copyto(target, host), repeats),
      'copy_kind': 'memcpy',
      'pageable_copy_s': None,
    }
  pageable_s = _fastest(lambda: jax.device_put(host, device), repeats)
  kinds = {memory.kind for memory in device.addressable_memories()}
  if 'pinned_host' not in kinds:
    return {
      'copy_s': pageable_s,
      'copy_kind': 'pageable_host_to_device',
      'pageable_copy_s': pageable_s,
    }
  sharding = jax.sharding.SingleDeviceSharding(device, memory_kind='pinned_host')
  pinned = jax.block_until_ready(jax.device_put(host, sharding))
  return {
    'copy_s': _fastest(lambda: jax.device_put(pinned, restore.device_memory(device)), repeats),
    'copy_kind': 'pinned_host_to_device',
    'pageable_copy_s': pageable_s,
  }
