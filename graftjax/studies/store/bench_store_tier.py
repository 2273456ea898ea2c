"""Restore from a remote tier (S3) against `file` and against the server's own GET floor.

    result = bench_store_tier.experiment(Settings(tokens=(1024, 4096)))

For each block size, a block of random finite values shaped like `config`'s cache (k, v
[L, n, K, H] in `dtype`; what is measured is bytes) is put in a store on a local S3 server
(moto, started here on a free loopback port) and in a store on `file`, and timed three ways:

- restore: `graftjax.restore.read` (the store's `get_page`: listing, manifest, zarr.json,
  every chunk with its digest checked) into reused host staging buffers, each layer handed
  to the device (here the CPU) as it verifies; from S3 and from `file`. Also `BlockStore.get`
  into new arrays, which pays for fresh memory (page faults) on every read;
- floor: the same objects of the same block fetched by raw GETs straight from the server
  (tensorstore's `s3` kvstore, every read issued at once under the same request concurrency,
  names known beforehand, nothing checked, nothing copied out of tensorstore's buffers): what
  the server can give;
- verified floor: the floor, each object's bytes taken out of tensorstore (a copy), copied
  into memory of its own and hashed with the store format's hash as it arrives: what any
  verified read through tensorstore's Python API adds to the floor. Restore over verified
  floor is what the store adds beyond that (listing, manifest and zarr.json checks, threads).

Many small pages (`pages` blocks of `page_tokens` tokens) are timed the same way, read one
after the other, as a cache pages them in, against one concurrent fetch of all their objects.
The server runs on this machine's CPU, beside the client: its times are CPU-local-server
times, not a network's. Credentials are set in the environment for the server and never
recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from graftjax import blocks
from graftjax import restore as restore_lib
from graftjax import store as store_lib
from graftjax.models.gemma import config as config_lib
from graftjax.store import chunks as store_chunks
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read
from graftjax.studies.store import local_s3
from graftjax.studies.common import results


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the bench measures.

  Attributes:
    config: config name whose cache shape the blocks take.
    dtype: k, v dtype.
    tokens: block sizes.
    pages: how many small pages; page_tokens: tokens of each (0 pages: none).
    concurrency: requests in flight at once, for restore and floor alike.
    repeats: timed runs of each (after one warm-up); the best and the median are kept.
    page_repeats: the same for the pages (a run reads every page).
    sweep: request concurrencies at which the largest size is measured again (restore and
      floor each at that concurrency).
  """

  config: str = 'gemma3-270m'
  dtype: str = 'bfloat16'
  tokens: tuple[int, ...] = (1024, 4096, 16384, 32768)
  pages: int = 256
  page_tokens: int = 64
  concurrency: int = store_kvstore.CONCURRENCY
  repeats: int = 7
  page_repeats: int = 3
  sweep: tuple[int, ...] = ()


def synthetic_block(config: config_lib.GemmaConfig, n: int, dtype: str, seed: int):
  """A block of n tokens shaped like `config`'s cache: k, v [L, n, K, H] random finite."""
  rng = np.random.default_rng(seed)
  shape = (config.num_layers, n, config.num_kv_heads, config.head_dim)
  np_dtype = store_chunks.DTYPES[dtype]
  # Random values in [-4, 4): finite, every mantissa bit used.
  k, v = (rng.uniform(-4, 4, shape).astype(np_dtype) for _ in range(2))
  meta = blocks.BlockMeta(
    model_fingerprint=hashlib.sha256(config.digest().encode()).hexdigest(),
    token_ids=tuple(int(t) for t in rng.integers(0, config.vocab_size, n)),
    start=0,
    dtype=dtype,
    position_scheme='rope',
    capacity=n,
  )
  return blocks.KVBlock(k=k, v=v, positions=np.arange(n, dtype=np.int32), meta=meta)


def _interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, Any]]:
  """Wall seconds of each fn: one warm-up each, then `repeats` rounds that call every fn once
  in turn, so that each round's calls share the machine's load of that moment.

  Returns:
    By name: 'times_s' (one per round), 'best_s', 'median_s'.
  """
  for fn in fns.values():
    fn()
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return {
    name: {'times_s': t, 'best_s': min(t), 'median_s': float(np.median(t))}
    for name, t in times.items()
  }


def _paired(row: dict[str, Any], top: str, bottom: str) -> float:
  """The median over rounds of `top`'s time over `bottom`'s in the same round."""
  return float(np.median(np.divide(row[top]['times_s'], row[bottom]['times_s'])))


class Floor:
  """Raw GETs of known objects straight from the server: every read issued at once on one
  `s3` kvstore with the restore's request concurrency; nothing parsed, nothing checked."""

  def __init__(self, spec: dict[str, Any], names: Sequence[str], concurrency: int):
    self._kv = ts.KvStore.open({**spec, 's3_request_concurrency': {'limit': concurrency}}).result()
    self._names = list(names)
    self._buffers = {}

  def __call__(self) -> None:
    """Fetches every object into tensorstore's buffers (not copied out into Python)."""
    for read in [self._kv.read(name) for name in self._names]:
      read.result()

  def nbytes(self) -> int:
    """The bytes of every object."""
    return sum(len(read.result().value) for read in [self._kv.read(n) for n in self._names])

  def verified(self) -> None:
    """Fetches every object as `__call__` does, and as each arrives (in the order asked
    for) takes its bytes out of tensorstore (`ReadResult.value`, a copy), copies them into
    a buffer of its own (made on the first call, reused after) and hashes them with the
    store format's hash: the work any verified read through tensorstore's Python API adds
    to the floor, nothing else of the store's."""
    reads = [self._kv.read(name) for name in self._names]
    for name, read in zip(self._names, reads):
      data = np.frombuffer(read.result().value, np.uint8)
      out = self._buffers.setdefault(name, np.ones_like(data))
      digest = store_manifest.new_hash()
      for offset in range(0, data.size, store_read.PIECE):
        piece = data[offset : offset + store_read.PIECE]
        digest.update(piece)
        out[offset : offset + piece.size] = piece


def _digests(block: blocks.KVBlock) -> list[str]:
  """SHA-256 of k, v and positions' bytes (no copies)."""
  return [
    hashlib.sha256(np.ascontiguousarray(a).view(np.uint8)).hexdigest()
    for a in (block.k, block.v, block.positions)
  ]


def _hash(block: blocks.KVBlock) -> None:
  """The store format's hash of k's and v's bytes, as a verified read computes it."""
  for array in (block.k, block.v):
    store_manifest.new_hash().update(np.ascontiguousarray(array).view(np.uint8))


def _objects(spec: dict[str, Any], keys: Sequence[str]) -> list[str]:
  """Every object of the blocks under `keys` (relative to `spec`'s path)."""
  kv = ts.KvStore.open(spec).result()
  names = [name.decode() for name in kv.list().result()]
  return [name for name in names if name.split('/')[0] in set(keys)]


def _measure(
  server: local_s3.MotoServer,
  local_root: str,
  block_list: Sequence[blocks.KVBlock],
  settings: Settings,
  repeats: int,
  concurrency: int,
) -> dict[str, Any]:
  """Restore from S3 and from `file`, and the floor, of the blocks; each restore reads the
  blocks one after the other, the floor fetches all their objects at once."""
  path = f'bench/{hashlib.sha256(os.urandom(16)).hexdigest()[:16]}/'
  spec = server.spec(path)
  s3 = store_lib.BlockStore(spec, concurrency=concurrency)
  file = store_lib.BlockStore(local_root)
  keys = [s3.put(block) for block in block_list]
  for block in block_list:
    file.put(block)
  names = _objects(spec, keys)
  floor = Floor(spec, names, concurrency)
  small = Floor(spec, [n for n in names if n.endswith('.json')], concurrency)
  nbytes = floor.nbytes()
  digests = [_digests(block) for block in block_list]
  for key, expected in zip(keys, digests):
    if _digests(s3.get(key)) != expected:
      raise AssertionError(f'block {key} read from S3 differs from the block put there')

  capacity = max(block.positions.size for block in block_list)

  def restore(store):
    staging = restore_lib.Staging(memory='host')

    def run():
      for key in keys:
        jax.block_until_ready(restore_lib.read(store, key, staging, capacity=capacity).copies)

    return run

  fns = {
    's3_restore': restore(s3),
    'floor': floor,
    'file_restore': restore(file),
    'verified_floor': floor.verified,
    # Where a restore's time beyond the floor can go: the small files (manifest, zarr.json)
    # fetched alone, all at once; and hashing the k and v bytes on one thread.
    'small_files': small,
    'hash_one_thread': lambda: [_hash(b) for b in block_list],
  }
  if len(keys) == 1:  # `BlockStore.get` into new arrays, paying for fresh memory each time
    fns['s3_get_new_arrays'] = lambda: s3.get(keys[0])
  row = {
    # SHA-256 over the blocks' k, v, positions SHA-256s: the bytes read, equal to those put.
    'blocks_sha256': hashlib.sha256(''.join(d for ds in digests for d in ds).encode()).hexdigest(),
    'blocks': len(keys),
    'objects': len(names),
    'bytes': nbytes,
    'concurrency': s3.concurrency,
    's3_get_new_arrays': None,
    **_interleaved(fns, repeats),
  }
  for key in keys:
    s3.delete(key)
    file.delete(key)
  row['restore_over_floor_paired'] = _paired(row, 's3_restore', 'floor')
  row['restore_over_verified_floor_paired'] = _paired(row, 's3_restore', 'verified_floor')
  for stat in ('best_s', 'median_s'):
    row[f'restore_over_floor_{stat.removesuffix("_s")}'] = (
      row['s3_restore'][stat] / row['floor'][stat]
    )
    row[f'restore_over_verified_floor_{stat.removesuffix("_s")}'] = (
      row['s3_restore'][stat] / row['verified_floor'][stat]
    )
    row[f's3_over_file_{stat.removesuffix("_s")}'] = (
      row['s3_restore'][stat] / row['file_restore'][stat]
    )
  row['floor_bytes_per_s'] = nbytes / row['floor']['best_s']
  return row


def experiment(
  settings: Settings,
  *,
  log: Callable[[str], None] | None = print,
  command: str | None = None,
) -> dict[str, Any]:
  """Every size and the pages, side by side in one run; the result."""
  config = config_lib.get_config(settings.config)
  rows, pages, sweep = [], None, []
  local_root = tempfile.mkdtemp(prefix='bench_store_tier_')
  try:
    with local_s3.MotoServer() as server:
      for i, n in enumerate(settings.tokens):
        row = {
          'tokens': n,
          **_measure(
            server,
            local_root,
            [synthetic_block(config, n, settings.dtype, i)],
            settings,
            settings.repeats,
            settings.concurrency,
          ),
        }
        rows.append(row)
        if log:
          log(_line(f'{n} tokens', row))
      if settings.pages:
        page_list = [
          synthetic_block(config, settings.page_tokens, settings.dtype, 1000 + i)
          for i in range(settings.pages)
        ]
        pages = {
          'pages': settings.pages,
          'page_tokens': settings.page_tokens,
          **_measure(
            server, local_root, page_list, settings, settings.page_repeats, settings.concurrency
          ),
        }
        if log:
          log(_line(f'{settings.pages} pages of {settings.page_tokens}', pages))
      largest = max(settings.tokens)
      for concurrency in settings.sweep:
        block = synthetic_block(config, largest, settings.dtype, len(settings.tokens) - 1)
        row = {
          'tokens': largest,
          **_measure(server, local_root, [block], settings, settings.repeats, concurrency),
        }
        sweep.append(row)
        if log:
          log(_line(f'{largest} tokens at concurrency {concurrency}', row))
  finally:
    shutil.rmtree(local_root, ignore_errors=True)
  goal = [r['restore_over_floor_paired'] <= 1.5 for r in rows if r['tokens'] >= 4096]
  inputs = {f'blocks_sha256_{r["tokens"]}_tokens': r['blocks_sha256'] for r in rows}
  if pages is not None:
    inputs['blocks_sha256_pages'] = pages['blocks_sha256']
  return {
    **results.header('bench_store_tier', inputs=inputs, command=command),
    'settings': dataclasses.asdict(settings),
    'config_digest': config.digest(),
    'server': 'moto S3 server on loopback, on the same CPU as the client',
    'timing': (
      'wall seconds after a warm-up, every timed call of a block size once per round, in'
      ' turn; ratios: the median over rounds of the two calls of one round (paired), and of'
      ' the best and median times; on a CPU shared with other work; the S3 server runs on'
      ' that CPU: CPU-local-server times, not a network'
    ),
    'summary': {
      'restore_over_floor': {str(r['tokens']): r['restore_over_floor_paired'] for r in rows},
      's3_over_file': {str(r['tokens']): r['s3_over_file_best'] for r in rows},
      'pages_restore_over_floor': None if pages is None else pages['restore_over_floor_paired'],
      'goal_restore_over_floor_at_most': 1.5,
      'goal_met_from_4k': all(goal) if goal else None,  # None: no size of 4k or more
      'sweep_restore_over_floor': {
        str(r['concurrency']): r['restore_over_floor_paired'] for r in sweep
      },
    },
    'rows': rows,
    'pages': pages,
    'concurrency_sweep': sweep,
  }


def _line(what: str, row: dict[str, Any]) -> str:
  return (
    f'{what}: {row["bytes"] / 1e6:.1f} MB in {row["objects"]} objects; S3 restore'
    f' {row["s3_restore"]["best_s"]:.3f}s, file {row["file_restore"]["best_s"]:.3f}s,'
    f' floor {row["floor"]["best_s"]:.3f}s: restore/floor {row["restore_over_floor_paired"]:.2f}'
    f' (paired), {row["restore_over_floor_best"]:.2f} (best);'
    f' verified floor {row["verified_floor"]["best_s"]:.3f}s,'
    f' small files {row["small_files"]["best_s"]:.3f}s,'
    f' hash (1 thread) {row["hash_one_thread"]["best_s"]:.3f}s'
  )
