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

`side_by_side` times the floor's stages and a restore in turns, round by round, and takes
the median of each: on a CPU shared with other work both sides then meet the same load
(`measure`'s fastest-of floors meet the quietest moment of theirs).
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
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


def _staged_files(folder: pathlib.Path):
  """The block's files under `folder`, a touched host buffer cut into one place per file (no
  page faults while timed), their total bytes and the store format."""
  files = sorted(p for p in folder.rglob('*') if p.is_file())
  sizes = [p.stat().st_size for p in files]
  starts = np.cumsum([0, *sizes])
  memory = np.ones(sum(sizes), np.uint8)
  places = [memory[a:b] for a, b in zip(starts, starts[1:])]
  store_format = json.loads((folder / store_manifest.MANIFEST).read_text())['format']
  return files, places, sum(sizes), store_format


def measure(folder: pathlib.Path, *, repeats: int = 3) -> dict:
  """Floors (seconds) and the rates behind them for the block stored under `folder`."""
  files, places, nbytes, store_format = _staged_files(folder)
  new_hash = lambda nbytes: store_read.chunk_hash(store_format, nbytes)  # as a restore does
  sha256 = lambda nbytes: hashlib.sha256()
  threads = os.cpu_count() or 1
  pieces = (store_read.PIECE, max(len(p) for p in places))
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


def side_by_side(
  folder: pathlib.Path, restore: Callable[[], dict[str, float]], *, repeats: int
) -> dict:
  """The floor of the block under `folder` and a restore of it, timed in turns.

  Each of `repeats` rounds (after one untimed) times once each floor stage: 'read' (the
  files into touched memory on one thread per CPU, each a file at a time in the store's
  pieces), 'read_one_thread' (the same on one thread), 'copy' (`device_copy`'s copy of the
  block's bytes), 'hash' (every file hashed as a restore hashes it, on one thread per CPU),
  'hash_one_thread' (every byte with the format's one-thread hash: a core's hash rate),
  'verified_read' and 'xla_write' (as many bytes written in place by XLA's
  `dynamic_update_slice` into a donated device array: what an install's write can reach, not
  part of the floor); and calls `restore()` once, which returns its stages' seconds by name.
  Odd rounds run the restore first, so neither side always follows the other.

  Returns:
    rounds; median_s: the median of each floor stage (floor_<stage>), of each restore stage
    (restore_<stage>), of 'floor' (per round: the faster read + copy) and of 'restore' (per
    round: the sum of its stages); restore_over_floor (median over median); rates_Bps: the
    block's bytes over the medians of read, read_one_thread, copy, hash_one_thread and
    xla_write.
  """
  files, places, nbytes, store_format = _staged_files(folder)
  new_hash = lambda size: store_read.chunk_hash(store_format, size)
  one_thread = lambda size: store_manifest.new_hash(store_format)
  jobs = list(zip(files, places))
  device = jax.devices()[0]
  copy, copy_kind = _copy_call(nbytes, device)
  # XLA's in-place write of as many bytes (rows of 1 KiB) into a donated buffer of twice as
  # many, made before each round: what an install's `dynamic_update_slice` can reach.
  rows = max(1, nbytes // 1024)
  update = jax.device_put(np.ones((rows, 256), np.float32), device)
  write = jax.jit(lambda t, u, s: jax.lax.dynamic_update_slice(t, u, (s, 0)), donate_argnums=0)
  targets = []
  with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    calls = {
      'read': lambda: list(pool.map(lambda job: _read_into(*job, None, store_read.PIECE), jobs)),
      'read_one_thread': lambda: [_read_into(*job, None, store_read.PIECE) for job in jobs],
      'copy': copy,
      'hash': lambda: list(pool.map(lambda place: _hashed(new_hash, place), places)),
      'hash_one_thread': lambda: [_hashed(one_thread, place) for place in places],
      'verified_read': lambda: list(
        pool.map(lambda job: _read_into(*job, new_hash, store_read.PIECE), jobs)
      ),
      'xla_write': lambda: write(targets.pop(), update, np.int32(rows // 2)),
    }
    floor, theirs = collections.defaultdict(list), collections.defaultdict(list)
    for round_ in range(repeats + 1):
      targets.append(jax.block_until_ready(jnp.zeros((2 * rows, 256), jnp.float32, device=device)))
      timed = {}
      for side in ('restore', 'floor') if round_ % 2 else ('floor', 'restore'):
        if side == 'restore':
          timed.update({f'restore_{name}': s for name, s in restore().items()})
          continue
        for name, call in calls.items():
          t0 = time.perf_counter()
          jax.block_until_ready(call())
          timed[f'floor_{name}'] = time.perf_counter() - t0
      if round_:  # the first is untimed
        for name, s in timed.items():
          (theirs if name.startswith('restore_') else floor)[name].append(s)
  floor['floor'] = [
    min(a, b) + c
    for a, b, c in zip(floor['floor_read'], floor['floor_read_one_thread'], floor['floor_copy'])
  ]
  restore_names = list(theirs)
  theirs['restore'] = [sum(stages) for stages in zip(*(theirs[n] for n in restore_names))]
  median = {name: float(np.median(s)) for name, s in {**floor, **theirs}.items()}
  return {
    'rounds': repeats,
    'floor_bytes': nbytes,
    'copy_kind': copy_kind,
    'median_s': median,
    'restore_over_floor': median['restore'] / median['floor'],
    'rates_Bps': {
      name: nbytes / median[f'floor_{name}']
      for name in ('read', 'read_one_thread', 'copy', 'hash_one_thread', 'xla_write')
    },
  }


def _copy_call(nbytes: int, device: jax.Device) -> tuple[Callable[[], object], str]:
  """A call that copies `nbytes` into `device` memory as fast as it can be, and its kind:
  a memcpy between touched buffers on CPU, from pinned host memory on a GPU that offers it,
  else pageable."""
  host = np.ones(nbytes, np.uint8)
  if device.platform == 'cpu':
    target = np.zeros(nbytes, np.uint8)
    return lambda: np.copyto(target, host), 'memcpy'
  kinds = {memory.kind for memory in device.addressable_memories()}
  if 'pinned_host' not in kinds:
    return lambda: jax.device_put(host, device), 'pageable_host_to_device'
  sharding = jax.sharding.SingleDeviceSharding(device, memory_kind='pinned_host')
  pinned = jax.block_until_ready(jax.device_put(host, sharding))
  return (
    lambda: jax.device_put(pinned, restore.device_memory(device)),
    'pinned_host_to_device',
  )


def device_copy(nbytes: int, device: jax.Device, *, repeats: int = 3) -> dict:
  """The fastest copy of `nbytes` into `device` memory: pinned (GPU) or memcpy (CPU).

  Returns:
    copy_s, copy_kind ('pinned_host_to_device', 'memcpy' or 'pageable_host_to_device' where
    the device offers no pinned memory) and pageable_copy_s (None on CPU).
  """
  copy, kind = _copy_call(nbytes, device)
  copy_s = _fastest(copy, repeats)
  if kind == 'memcpy':
    return {'copy_s': copy_s, 'copy_kind': kind, 'pageable_copy_s': None}
  if kind == 'pageable_host_to_device':
    return {'copy_s': copy_s, 'copy_kind': kind, 'pageable_copy_s': copy_s}
  host = np.ones(nbytes, np.uint8)
  pageable_s = _fastest(lambda: jax.device_put(host, device), repeats)
  return {'copy_s': copy_s, 'copy_kind': kind, 'pageable_copy_s': pageable_s}
