"""What a catalog's `sync` costs against the number of stored blocks.

The library of experiments/bench_store_sync.py. `experiment(...)` fills a store with small
synthetic blocks, then times `Catalog.sync` three times: from an empty catalog (every
manifest read), after `new` more blocks (only theirs read) and with nothing new (the
listing alone). The listing is timed apart: on an object store it lists every object of
every block, and it is the floor of any sync (`local_s3.MotoServer` gives a local S3 server).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.paging import catalog as catalog_lib
from graftjax.store import encode as store_encode
from graftjax.store import kvstore as store_kvstore
from graftjax.studies.common import results

_FINGERPRINT = '0' * 64  # no model: the blocks stand for some model's
_SHAPE = (1, 2, 1, 4)  # [L, n, K, H]: the smallest block of the format's every file


def synthetic_block(i: int) -> blocks.KVBlock:
  """Block `i`: two tokens (`i`'s own ids), one layer of seeded random k and v."""
  rng = np.random.default_rng(i)
  meta = blocks.BlockMeta(
    model_fingerprint=_FINGERPRINT,
    token_ids=(i % 262_144, i // 262_144),
    start=0,
    dtype='float32',
    position_scheme='rope',
    capacity=8,
    first_position=0,
  )
  return blocks.KVBlock(
    k=rng.standard_normal(_SHAPE, np.float32),
    v=rng.standard_normal(_SHAPE, np.float32),
    positions=np.arange(_SHAPE[1], dtype=np.int32),
    meta=meta,
  )


def describe(key: str, meta: blocks.BlockMeta) -> tuple[str, str]:
  """A block's catalog text and source, from its metadata."""
  return f'synthetic block {meta.token_ids[0]} {meta.token_ids[1]}', 'bench'


def fill(spec: Any, first: int, count: int, *, in_flight: int = 64) -> float:
  """Writes blocks first..first+count-1 into the store at `spec` as `put` writes them
  (payload, then manifest, the commit point), `in_flight` blocks at a time, without `put`'s
  read-back; returns seconds."""
  kv = store_kvstore.open_kvstore(spec, read_only=False)[0]

  def write(i: int) -> None:
    files, manifest = store_encode.block_files(synthetic_block(i), 'bench')
    block_kv = kv / f'{manifest["key"]}/'
    name = store_lib.MANIFEST
    store_kvstore.write_files(block_kv, {n: d for n, d in files.items() if n != name})
    store_kvstore.write_files(block_kv, {name: files[name]})

  start = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
    list(pool.map(write, range(first, first + count)))
  return time.perf_counter() - start


def _phase(name: str, synced: catalog_lib.Synced, list_s: float) -> dict[str, Any]:
  return {
    'phase': name,
    'listed': synced.listed,
    'manifests_read': synced.read,
    'added': len(synced.added),
    'removed': len(synced.removed),
    'sync_s': synced.seconds,
    'sync_list_s': synced.list_seconds,
    'listing_alone_s': list_s,
  }


def _listing_seconds(store: store_lib.BlockStore) -> float:
  start = time.perf_counter()
  store.list()
  return time.perf_counter() - start


@contextlib.contextmanager
def request_timeout(seconds: float | None) -> Iterator[None]:
  """The store's request timeout (`kvstore.TIMEOUT_SECONDS`) set to `seconds` meanwhile
  (None: left as it is): a listing of every object is one request."""
  old = store_kvstore.TIMEOUT_SECONDS
  if seconds is not None:
    store_kvstore.TIMEOUT_SECONDS = seconds
  try:
    yield
  finally:
    store_kvstore.TIMEOUT_SECONDS = old


def experiment(
  *,
  spec: Any,
  backend: str,
  blocks_count: int,
  new: int,
  folder: pathlib.Path,
  timeout: float | None = None,
) -> dict[str, Any]:
  """Fills the store at `spec`, syncs a catalog in `folder` three times; the result.

  `timeout`: seconds a request may take (the listing is one), default the store's."""
  with request_timeout(timeout):
    return _experiment(spec, backend, blocks_count, new, folder)


def _experiment(spec, backend, blocks_count, new, folder) -> dict[str, Any]:
  store = store_lib.BlockStore(spec)
  if store.list():
    raise ValueError(f'{store.root} is not empty: the bench fills a store of its own')
  fill_s = fill(spec, 0, blocks_count)
  rows = []
  with catalog_lib.Catalog(folder / 'sync.sqlite', store=store) as catalog:
    listing = _listing_seconds(store)
    rows.append(_phase('full', catalog.sync(describe), listing))
    fill(spec, blocks_count, new)
    listing = _listing_seconds(store)
    rows.append(_phase(f'incremental (+{new})', catalog.sync(describe), listing))
    listing = _listing_seconds(store)
    rows.append(_phase('no-op', catalog.sync(describe), listing))
    indexed = len(catalog)
  objects = len(store_kvstore.result(store_kvstore.open_kvstore(spec, False)[0].list()))
  result = results.header(
    'bench_store_sync',
    inputs={'block_shape': list(_SHAPE), 'dtype': 'float32', 'fingerprint': _FINGERPRINT},
  )
  result.update(
    backend=backend,
    request_timeout_s=store_kvstore.TIMEOUT_SECONDS,
    blocks=blocks_count,
    new=new,
    objects_listed=objects,
    fill_s=fill_s,
    indexed=indexed,
    rows=rows,
    summary={
      'full_sync_s': rows[0]['sync_s'],
      'incremental_sync_s': rows[1]['sync_s'],
      'noop_sync_s': rows[2]['sync_s'],
      'listing_s': rows[2]['listing_alone_s'],
      'manifests_read': [row['manifests_read'] for row in rows],
      'full_ms_per_manifest': 1e3 * (rows[0]['sync_s'] - rows[0]['sync_list_s']) / blocks_count,
    },
  )
  return result


def format_rows(result: dict[str, Any]) -> str:
  lines = [
    f'{result["backend"]}: {result["blocks"]:,} blocks, {result["objects_listed"]:,} objects'
  ]
  for row in result['rows']:
    lines.append(
      f'  {row["phase"]:<18} read {row["manifests_read"]:>6,}  sync {row["sync_s"]:8.2f} s'
      f'  (listing in it {row["sync_list_s"]:.2f} s; alone {row["listing_alone_s"]:.2f} s)'
    )
  return '\n'.join(lines)
