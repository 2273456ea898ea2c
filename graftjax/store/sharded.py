"""Blocks of a sharded cache: each process writes and reads only its devices' kv heads.

`ShardedStore(root)` keeps blocks in the block store's layout (docs/store_format.md,
docs/sharding.md) with each k/v array chunked along the kv heads as the cache is split:

    <key>/k/c.<l>.0.<j>.0        layer l, kv heads [j * c, (j + 1) * c)   (chunk_shape [1, n, c, H])
    <key>/k_tail/c.<l>.0.<j>.0   a compact block's tail layer l, its last r rows  ([1, r, ct, Ht])

c is the number of kv heads one device holds of that array (k, v of the layers a compact
block keeps whole, k_tail, v_tail of its sliding-window layers: Gemma 4's two groups have
their own kv heads and head size, and each splits by its own). A block none of whose
arrays is split (c = K for each) is written in the block store's own format, byte for byte
what `BlockStore.put` writes, and either store reads it. A split block's manifest names
`FORMAT` and is format 4 otherwise.

`put` is collective: every process of a `jax.distributed` job calls it with the
same block (global jax.Arrays). Each process writes the chunks of the shards it
holds (replica 0 only) and reads them back, the processes exchange the chunks'
digests, and process 0 publishes the block: on a local root it renames the
staged folder into place; on other kvstores every chunk lies under the
deposit's own prefix `<key>/<data>/` and process 0 writes the manifest (format
5, naming that prefix) only if none is there, as `BlockStore.put` does
(docs/store_format.md). A process that dies before that leaves no block: nothing
is listed or readable, whatever files it wrote. A deposit that finds the key
taken compares payloads: the same, it returns the key; another, every process
raises ConflictingBlockError naming both payloads' digests.

`read` and `restore` read, on each process, only the chunks overlapping the
heads its devices hold, each checked against its digest; `reads` counts them.

A page (`put(block, page_layout=...)`, as `BlockStore.put` takes one, of a block that
holds every row of every layer) keeps its whole layers in k, v and the trimmed layers'
last rows in k_tail, v_tail, each chunked along the kv heads the same way; `read` gives it
back as a block with zeros in the rows not kept, and `restore` checks it against the
model's windows first (`blocks.check_page`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import blake3
import jax
import numpy as np
import tensorstore as ts
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.models import cache as cache_lib
from graftjax.models import target as target_lib
from graftjax.store import commit as store_commit
from graftjax.store import encode as store_encode
from graftjax.store import errors as store_errors
from graftjax.store import kvstore as store_kvstore
from graftjax.store import manifest as store_manifest
from graftjax.store import pages as store_pages
from graftjax.store import values as store_values

# Format 4 with k and v chunked along kv heads as well as layers; format 5 of it (its payload
# under its writer's prefix, which the manifest names), as a deposit on an object store writes.
FORMAT = 'graftjax.blockstore/4-kv-heads'
PREFIXED_FORMAT = 'graftjax.blockstore/5-kv-heads'
FORMATS = (store_lib.FORMAT, FORMAT, store_lib.PREFIXED_FORMAT, PREFIXED_FORMAT)
_PREFIXED = (store_lib.PREFIXED_FORMAT, PREFIXED_FORMAT)
_KV = ('k', 'v')
_TAILS = ('k_tail', 'v_tail')
_DIGEST = 'chunk_blake3'
_ARRAY_DIGEST = 'blake3'


@dataclasses.dataclass
class Reads:
  """What a store's reads of k/v chunk files fetched (this process)."""

  chunks: int = 0
  bytes: int = 0


@dataclasses.dataclass(frozen=True)
class _Part:
  """One stored array of a block: rows [first, ...) of `layers` of the block's array `source`
  (k, v, k_tail or v_tail)."""

  source: str
  layers: tuple[int, ...]
  first: int


def _parts(
  meta: blocks.BlockMeta, rows: store_pages.Layout | None, layers: int, n: int
) -> dict[str, _Part]:
  """The arrays a block (rows None) or a page stores, by name (a page's as `page_arrays`):
  `layers` is the number of layers of the block's k (of a page, of every layer). A compact
  block's tail arrays are stored as they are."""
  if rows is None:
    parts = {name: _Part(name, tuple(range(layers)), 0) for name in _KV}
    if meta.tail_layers and meta.tail_rows:
      tail = tuple(range(len(meta.tail_layers)))
      parts.update({f'{name}_tail': _Part(f'{name}_tail', tail, 0) for name in _KV})
    return parts
  whole = tuple(i for i, (first, _) in enumerate(rows) if first == 0)
  tail = tuple(i for i, (first, _) in enumerate(rows) if first != 0)
  first = rows[tail[0]][0]
  parts = {name: _Part(name, whole, 0) for name in _KV}
  if first < n:
    parts.update({f'{name}_tail': _Part(name, tail, first) for name in _KV})
  return parts


def _sources(block: blocks.KVBlock) -> tuple[str, ...]:
  """The block's k/v arrays: k, v, and k_tail, v_tail where it has them."""
  return _KV + (_TAILS if block.k_tail is not None else ())


@dataclasses.dataclass(frozen=True)
class _Layout:
  """A stored array: L layers, n rows, K kv heads of H, c heads per chunk."""

  layers: int
  rows: int
  heads: int
  head_dim: int
  per_chunk: int
  dtype: str

  @property
  def shape(self) -> tuple[int, int, int, int]:
    return (self.layers, self.rows, self.heads, self.head_dim)

  @property
  def groups(self) -> int:
    return self.heads // self.per_chunk

  def path(self, name: str, layer: int, group: int) -> str:
    return f'{name}/c.{layer}.0.{group}.0'


def _blake3(data: bytes) -> str:
  return blake3.blake3(data).hexdigest()


def _zarr_json(dtype: str, shape, chunk_shape) -> bytes:
  """zarr.json of a raw little-endian array, as tensorstore and the block store write it."""
  metadata = {
    'zarr_format': 3,
    'node_type': 'array',
    'shape': list(shape),
    'data_type': dtype,
    'chunk_grid': {'name': 'regular', 'configuration': {'chunk_shape': list(chunk_shape)}},
    'chunk_key_encoding': {'name': 'default', 'configuration': {'separator': '.'}},
    'codecs': [{'name': 'bytes', 'configuration': {'endian': 'little'}}],
    'fill_value': 0 if dtype == 'int32' else 0.0,
  }
  return json.dumps(metadata, sort_keys=True, separators=(',', ':')).encode('ascii')


def _block_spec(array: jax.Array) -> tuple[NamedSharding | None, int]:
  """(the sharding to write `array` [L, n, K, H] from, kv heads per chunk)."""
  sharding = getattr(array, 'sharding', None)
  if not isinstance(sharding, NamedSharding) or sharding.is_fully_replicated:
    return None, array.shape[2]
  heads = sharding.spec[2] if len(sharding.spec) > 2 else None
  target = NamedSharding(sharding.mesh, P(None, None, heads, None))
  return target, target.shard_shape(array.shape)[2]


def _part_layout(shape, part: _Part, per_chunk: int, dtype: str) -> _Layout:
  """How `part` of a source array of `shape` [L, rows, K, H] is stored, c kv heads a chunk."""
  return _Layout(len(part.layers), shape[1] - part.first, shape[2], shape[3], per_chunk, dtype)


def _axis_size(mesh, axes) -> int:
  """Devices along mesh axis `axes` (a name or a tuple of names)."""
  axes = axes if isinstance(axes, tuple) else (axes,)
  return int(np.prod([mesh.shape[a] for a in axes]))


def _dividing(mesh, axis, heads: int) -> NamedSharding:
  """An array [L, rows, K, H] of `heads` kv heads on `mesh`: K split over mesh axis `axis`
  where that divides it, else replicated."""
  if axis is not None and heads % _axis_size(mesh, axis):
    axis = None
  return NamedSharding(mesh, P(None, None, axis, None))


def _cache_split(cache: cache_lib.KVCache, source: str, heads: int, meta) -> NamedSharding:
  """Where `restore` reads a block's array `source` (of `heads` kv heads) for `cache`: split as
  the kv heads of the cache array that holds its layers (k, or the ring's ring_k), where
  that split divides them (`_dividing`); one device for a cache that is not sharded."""
  layers = meta.tail_layers if source in _TAILS else None
  if layers is None:  # k, v: the layers kept whole (every layer, but a compact block's tail)
    layers = [i for i in range(cache.num_layers) if i not in meta.tail_layers] or [0]
  kind, _ = cache.where(layers[0])
  array = cache.ring_k if kind == 'ring' else cache.k
  sharding = getattr(array, 'sharding', None)
  if not isinstance(sharding, NamedSharding):
    return NamedSharding(jax.sharding.Mesh(np.asarray(list(array.devices())[:1]), ('one',)), P())
  spec = tuple(sharding.spec) + (None,) * (5 - len(sharding.spec))
  return _dividing(sharding.mesh, spec[3], heads)


def _source_shapes(parts: dict[str, _Part], layouts: dict[str, _Layout]) -> dict[str, tuple]:
  """The shape [L, rows, K, H] of each of a block's arrays (k, v, k_tail, v_tail) read back
  from its stored `parts`: a page's k, v of every layer and row, the rest as stored."""
  shapes = {}
  for name, part in parts.items():
    layout = layouts[name]
    layers, rows, heads, width = shapes.get(part.source, (0, 0, layout.heads, layout.head_dim))
    shapes[part.source] = (
      max(layers, max(part.layers) + 1),
      max(rows, part.first + layout.rows),
      heads,
      width,
    )
  return shapes


class ShardedStore:
  """KV blocks under `root` (a local directory or a tensorstore kvstore spec / URL)."""

  def __init__(self, root: Any, *, read_only: bool = False):
    """Opens the store as `BlockStore` does (`store_kvstore.open_kvstore`): a local path
    normalised, one with a backslash or inside a block folder refused."""
    self.read_only = read_only
    self._kv, self._local = store_kvstore.open_kvstore(root, read_only)
    self.root = self._local or store_kvstore.location(self._kv)
    self.reads = Reads()

  # ---- listing -------------------------------------------------------------

  def list(self) -> list[str]:
    """Sorted keys of the published blocks (a manifest in place)."""
    if self._local:
      with self._io(self.root, 'cannot list the store'):
        names = os.listdir(self._local) if os.path.isdir(self._local) else []
      return sorted(
        n
        for n in names
        if _is_key(n) and os.path.isfile(os.path.join(self._local, n, store_lib.MANIFEST))
      )
    with self._io(self.root, 'cannot list the store'):
      names = _result(self._kv.list())
    suffix = f'/{store_lib.MANIFEST}'.encode()
    return sorted(
      n[:64].decode()
      for n in names
      if n.endswith(suffix) and len(n) == 64 + len(suffix) and b'/' not in n[:64]
    )

  def __contains__(self, key: str) -> bool:
    if self._manifest_bytes(self._checked_key(key)) is not None:
      return True
    with self._io(self._where(key), 'cannot read the manifest'):
      _result((self._kv / f'{key}/').list())  # a missing bucket answers a GET as a missing key
    return False

  # ---- writing -------------------------------------------------------------

  def put(self, block: blocks.KVBlock, *, page_layout=None) -> str:
    """Deposits `block` (collective: every process calls it) and returns its key.

    k and v may be global jax.Arrays split over kv heads (a block captured from
    a sharded cache) or whole arrays; each process writes only the chunks of
    the shards it holds, and reads them back. A key already published is left
    as it is if its payload is the block's (compared by digests, or by bytes
    when it was chunked under another split). With `page_layout` (one
    `(first_row, stop_row)` per layer, as `BlockStore.put` takes it) only those
    rows are stored, as a page under its own key.

    Raises:
      InvalidBlockError: if the block cannot be stored exactly (empty, dtype,
        shapes, positions other than its metadata says, a NaN or infinity in
        the k or v rows it would store); raised by every process before
        anything is written.
      ConflictingBlockError: if the key is published with another payload,
        also by a deposit that committed first (naming both payloads' digests).
      ReadOnlyStoreError, StoreIOError: if the storage refuses the deposit, or
        a value written does not read back (nothing is published then).
    """
    if self.read_only:
      raise store_lib.ReadOnlyStoreError(self.root, 'the store was opened read-only')
    meta = block.meta
    positions = _checked_block(block, self.root)  # on every process, before anything is written
    layers, n = block.k.shape[:2]
    if page_layout is not None and meta.tail_layers:
      raise store_lib.InvalidBlockError(
        self.root,
        f'cannot store the page: a block with tail layers {list(meta.tail_layers)} holds only'
        ' the rows it keeps; it takes no page_layout (only a block that holds every row of'
        ' every layer does)',
      )
    try:
      rows = None if page_layout is None else store_pages.checked_layout(page_layout, layers, n)
    except store_errors.MalformedError as e:
      raise store_lib.InvalidBlockError(self.root, f'cannot store the page: {e}') from e
    key = store_lib.key_for(meta, rows)
    where = self._where(key)
    specs = {source: _block_spec(getattr(block, source)) for source in _sources(block)}
    parts = _parts(meta, rows, layers, n)
    layouts = {
      name: _part_layout(getattr(block, part.source).shape, part, specs[part.source][1], meta.dtype)
      for name, part in parts.items()
    }
    shards = {
      source: _own_shards(getattr(block, source), spec) for source, (spec, _) in specs.items()
    }
    _agree(_nonfinite(shards, parts), store_lib.InvalidBlockError, self.root)
    digests = {
      name: np.zeros((layout.layers, layout.groups, 32), np.uint8)
      for name, layout in layouts.items()
    }
    own = []  # (path in the block, bytes, BLAKE3 hex) of each chunk this process writes
    for source, held in shards.items():
      for lo, data in held:
        for name, part in parts.items():
          if part.source != source:
            continue
          per_chunk = layouts[name].per_chunk
          for layer, group, chunk in _part_chunks(data, lo, part, per_chunk):
            digest = blake3.blake3(chunk).digest()
            digests[name][layer, group] = np.frombuffer(digest, np.uint8)
            own.append((layouts[name].path(name, layer, group), chunk, digest.hex()))
    digests = _combine(digests, where)
    files, manifest = _block_files(key, meta, layouts, positions, digests, rows)
    if self._manifest_bytes(key) is not None:
      self._check_same(key, manifest, block, rows, specs)
      _barrier(f'sharded put {key} stored')
      return key
    data = None
    if self._local is None:  # format 5: every value under this deposit's own prefix
      data = _agreed_data_id()
      prefix = f'{key}/{data}/'
      split = manifest['format'] == FORMAT
      manifest['format'] = PREFIXED_FORMAT if split else store_lib.PREFIXED_FORMAT
      manifest['data'] = data
    else:
      prefix = f'.tmp/{key}.{_agreed_token()}.sharded/'
    if jax.process_index() == 0:  # positions and the zarr.json files
      own += [(name, value, _blake3(value)) for name, value in files.items()]
    with self._io(where, 'cannot deposit the block'), self._shared_lock():
      for path, chunk, _ in own:
        write_chunk(self._kv, prefix + path, chunk)
      try:
        if data is not None:  # no collection takes the prefix from here (as `BlockStore.put`)
          _agree(self._announce(key, data), store_lib.StoreIOError, where)
        # Every process's chunks in place and read back before process 0 publishes.
        problem = self._read_back(prefix, [(path, digest) for path, _, digest in own])
        _agree(problem, store_lib.StoreIOError, where)
      except store_lib.StoreIOError:
        if jax.process_index() == 0:
          self._discard(key, prefix, data)
        raise
      if jax.process_index() == 0:  # a failed manifest write may land yet: nothing discarded
        problem = self._publish(key, prefix, data, manifest)
      _agree(problem, store_lib.StoreIOError, where)
    _barrier(f'sharded put {key} published')
    if self._manifest_bytes(key) is None:
      raise store_lib.StoreIOError(where, 'the deposit finished but no manifest is in place')
    self._check_same(key, manifest, block, rows, specs)
    return key

  def _read_back(self, prefix: str, written: list[tuple[str, str]]) -> str | None:
    """What is wrong with values written under `prefix` ((path, BLAKE3 hex) each), read back
    all at once, or None: a server may acknowledge a write it did not keep."""
    reads = [(path, digest, self._kv.read(prefix + path)) for path, digest in written]
    for path, digest, read in reads:
      found = _result(read)
      if found.state != 'value':
        return f'{path}: the server acknowledged its write but does not hold it; not published'
      if _blake3(bytes(found.value)) != digest:
        return f'{path}: reads back other bytes than were written (BLAKE3 != {digest[:16]}…)'
    return None

  def _announce(self, key: str, data: str) -> str | None:
    """Process 0 announces the commit of `<key>/<data>/` and checks its age against the
    grace in force (`store_commit.announce`); what went wrong, or None."""
    if jax.process_index() != 0:
      return None
    try:
      store_commit.announce(self._kv, self._where(key), key, data)
    except store_lib.StoreIOError as e:
      return e.cause
    return None

  def _publish(self, key: str, prefix: str, data: str | None, manifest) -> str | None:
    """Makes the block visible; what went wrong, or None. On an object store the manifest
    is written only if none is there, then read back (`store_commit.commit`); a deposit
    that finds the key taken removes what it wrote (the caller then compares payloads)."""
    text = store_encode.manifest_bytes(manifest)
    if data is not None:
      try:
        with store_errors.io_errors(self._where(key), 'cannot deposit the block'):
          absent = store_kvstore.result(self._kv.read(f'{key}/{store_lib.MANIFEST}'))
        committed = absent.state == 'missing' and store_commit.commit(
          self._kv, self._where(key), key, data, text, absent.stamp.generation
        )
      except store_lib.StoreIOError as e:
        return e.cause
      if not committed:
        self._discard(key, prefix, data)
      return None
    write_chunk(self._kv, prefix + store_lib.MANIFEST, text)
    staged = os.path.join(self._local, prefix.rstrip('/'))
    _fsync_tree(staged)
    try:
      os.rename(staged, os.path.join(self._local, key))
    except OSError:  # taken by another deposit of the same key
      shutil.rmtree(staged, ignore_errors=True)
    _fsync_dir(self._local)
    return None

  def _discard(self, key: str, prefix: str, data: str | None) -> None:
    """Removes what a deposit wrote under `prefix`, which no manifest names; what a
    failure leaves, `BlockStore.gc` removes."""
    if data is None:
      shutil.rmtree(os.path.join(self._local, prefix.rstrip('/')), ignore_errors=True)
    else:
      store_commit.discard(self._kv, key, data)

  def _check_same(self, key, manifest, block, rows, specs) -> None:
    """Raises ConflictingBlockError unless the block published under `key` holds the
    payload `manifest` describes (`block`'s): by array digests where both are chunked
    alike, else by reading the stored block's bytes (collective)."""
    stored, stored_meta, _, _ = self._manifest(key)
    where = self._where(key)
    if stored_meta != block.meta:
      raise store_lib.ConflictingBlockError(
        where, f"stored metadata {stored_meta} != the block's {block.meta}"
      )
    ours, theirs = manifest['arrays'], stored['arrays']
    if all(ours[name]['chunk_shape'] == theirs[name]['chunk_shape'] for name in ours):
      same = all(ours[name][_ARRAY_DIGEST] == theirs[name][_ARRAY_DIGEST] for name in ours)
      how = ''
    else:
      same = self._same_bytes(key, block, rows, specs)
      how = ' (chunked under another kv-head split; the bytes compared)'
    if not same:
      raise store_lib.ConflictingBlockError(
        where,
        f'the block is already stored with another payload (stored {_payload_digest(theirs)}'
        f' != new {_payload_digest(ours)}){how}. To recover: quarantine the stored block'
        ' (`BlockStore.quarantine`), then put the right one',
      )

  def _same_bytes(self, key, block, rows, specs) -> bool:
    """Whether the stored block's kept rows are `block`'s, each process comparing the
    shards it holds (the verdict agreed by all); `specs` are `_block_spec` of each of the
    block's arrays."""
    one = NamedSharding(jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ('one',)), P())
    stored, _ = self._read(key, lambda source, *_: specs[source][0] or one)
    layers, n = block.k.shape[:2]
    differs = None
    for source, (spec, _) in specs.items():
      theirs = dict(_own_shards(getattr(stored, source), spec))
      for lo, data in _own_shards(getattr(block, source), spec):
        for part in _parts(block.meta, rows, layers, n).values():
          kept = np.s_[list(part.layers), part.first :]
          if part.source == source and data[kept].tobytes() != theirs[lo][kept].tobytes():
            differs = f'{source}: kv heads from {lo} differ'
    try:
      _agree(differs, ValueError, self._where(key))
    except ValueError:
      return False
    return True

  # ---- reading -------------------------------------------------------------

  def read(self, key: str, sharding: NamedSharding) -> blocks.KVBlock:
    """The block under `key` with its arrays (k, v [L, n, K, H]; a compact block's k_tail,
    v_tail [Lt, r, Kt, Ht] too) as global arrays in `sharding`.

    Each array's kv heads split as `sharding` says where its split divides them, and are
    replicated over it where it does not (Gemma 4's global layers hold fewer kv heads than
    its sliding ones), as `sharding.layout` splits a cache. Each process reads the chunks
    overlapping the kv heads its devices hold, each chunk once (devices holding the same
    heads share it), checking each against its digest; positions are read by every process.
    For a page, the rows it does not keep are zeros (see `read_page`).

    Raises:
      MissingBlockError, CorruptBlockError, UnsupportedFormatError, StoreIOError.
    """
    return self.read_page(key, sharding)[0]

  def read_page(
    self, key: str, sharding: NamedSharding
  ) -> tuple[blocks.KVBlock, store_pages.Layout | None]:
    """(block, page_layout) under `key`: as `read`, with the rows each layer keeps (None for
    a plain block)."""
    key = self._checked_key(key)

    def split(source, heads, meta):  # after the manifest is read: a missing block is named so
      if tuple(sharding.spec[:2]) not in ((), (None,), (None, None)):
        raise store_lib.InvalidBlockError(
          self._where(key), f'a block splits only kv heads; sharding {sharding.spec} splits more'
        )
      axis = sharding.spec[2] if len(sharding.spec) > 2 else None
      return _dividing(sharding.mesh, axis, heads)

    return self._read(key, split)

  def _read(self, key: str, split) -> tuple[blocks.KVBlock, store_pages.Layout | None]:
    """`read_page` with each of the block's arrays in the sharding `split(name, kv heads,
    meta)` gives it (name: k, v, k_tail or v_tail)."""
    manifest, meta, layouts, rows = self._manifest(key)
    n = len(meta.token_ids)
    positions = np.frombuffer(self._chunk(key, manifest, 'positions', 0, 'positions/c.0'), '<i4')
    if not np.array_equal(positions, meta.first_position + meta.shift + np.arange(n)):
      raise store_lib.CorruptBlockError(
        self._where(key),
        f'positions {positions.tolist()[:8]}... do not start at meta.first_position'
        f' {meta.first_position} + shift {meta.shift} and count up',
      )
    fetched: dict[str, np.ndarray] = {}  # chunk path -> its [rows, c, H], read once
    layers = layouts['k'].layers if rows is None else len(rows)
    parts = _parts(meta, rows, layers, n)
    shapes = _source_shapes(parts, layouts)
    dtype = _dtype(meta.dtype)

    def piece(index, source):
      shape = shapes[source]
      lo, hi, _ = index[2].indices(shape[2])
      out = np.zeros((shape[0], shape[1], hi - lo, shape[3]), dtype)
      for name, part in parts.items():
        if part.source == source:
          got = self._heads(key, manifest, layouts[name], name, lo, hi, fetched)
          out[list(part.layers), part.first :] = got
      return out[index[0], index[1], :, index[3]]

    arrays = {}
    for source, shape in shapes.items():
      arrays[source] = jax.make_array_from_callback(
        shape, split(source, shape[2], meta), lambda index, source=source: piece(index, source)
      )
    block = blocks.KVBlock(positions=positions.astype(np.int32), meta=meta, **arrays)
    return block, rows

  def restore(
    self,
    key: str,
    cache: cache_lib.KVCache,
    *,
    target: target_lib.GraftTarget,
    windows: tuple[int | None, ...] | None = None,
    query_position: int | None = None,
    **graft_options: Any,
  ) -> cache_lib.KVCache:
    """`blocks.graft` of the block under `key` into `cache`, reading only its shards.

    Each of the block's arrays is read in the split of kv heads of the cache array that
    holds its layers (`cache.k` or the ring's `cache.ring_k`: a compact block's whole
    layers and its tail may lie in either), so each device receives exactly the heads it
    holds; where that split does not divide the stored heads (a packed block of layout 3)
    the array is read whole onto each device. A page is first checked against the
    model's `windows` (W per layer, None for a global layer) and the first query's position
    (`blocks.check_page`).

    Raises:
      blocks.PageError: a page without `windows`, or one that drops rows a query sees.
      blocks.GraftError, and the store's errors as `read`.
    """
    block, rows = self._read(key, functools.partial(_cache_split, cache))
    try:
      if rows is not None:
        if windows is None:
          raise blocks.PageError(
            f'the block is a page (rows kept per layer: {list(rows)}); pass the'
            " model's windows to check that its layers keep what a query sees"
          )
        blocks.check_page(block, rows, windows, query_position=query_position)
      return blocks.graft(
        cache, block, target=target, query_position=query_position, **graft_options
      )
    except blocks.GraftError as e:  # the same kind of error, naming the block
      raise type(e)(f'{self._where(key)}: {e}') from e

  def _heads(
    self, key, manifest, layout: _Layout, name: str, lo: int, hi: int, fetched: dict
  ) -> np.ndarray:
    """k or v [L, n, hi - lo, H] of heads [lo, hi), from the chunks that overlap them."""
    dtype = _dtype(layout.dtype)
    c = layout.per_chunk
    groups = range(lo // c, -(-hi // c))
    out = np.empty((layout.layers, layout.rows, len(groups) * c, layout.head_dim), dtype)
    for layer in range(layout.layers):
      for i, group in enumerate(groups):
        path = layout.path(name, layer, group)
        if path not in fetched:
          data = self._chunk(key, manifest, name, layer * layout.groups + group, path)
          fetched[path] = np.frombuffer(data, dtype).reshape(layout.rows, c, layout.head_dim)
          self.reads.chunks += 1
          self.reads.bytes += len(data)
        out[layer, :, i * c : (i + 1) * c] = fetched[path]
    first = groups.start * c
    return out[:, :, lo - first : hi - first]

  def _chunk(self, key: str, manifest, name: str, index: int, path: str) -> bytes:
    where = f'{self._where(key)}/{path}'
    prefix = store_manifest.data_prefix(manifest)
    with self._io(where, 'cannot read the chunk'):
      found = _result(self._kv.read(f'{key}/{prefix}{path}'))
    if found.state != 'value':
      now = self._manifest_bytes(key)
      if now is None or json.loads(now).get('data') != manifest.get('data'):
        raise store_lib.MissingBlockError(self._where(key), 'no such block (deleted while read)')
      raise store_lib.CorruptBlockError(where, 'chunk file missing from a published block')
    data = bytes(found.value)
    expected = manifest['arrays'][name][_DIGEST][index]
    if _blake3(data) != expected:
      raise store_lib.CorruptBlockError(
        where, f'BLAKE3 {_blake3(data)[:16]}… != manifest {expected[:16]}…'
      )
    return data

  def _manifest(
    self, key: str
  ) -> tuple[dict[str, Any], blocks.BlockMeta, dict[str, _Layout], store_pages.Layout | None]:
    where = self._where(key)
    data = self._manifest_bytes(key)
    if data is None:
      raise store_lib.MissingBlockError(where, 'no such block')
    try:
      manifest = json.loads(data)
      fmt = manifest['format']
      if fmt not in FORMATS:
        raise store_lib.UnsupportedFormatError(where, f'format {fmt!r}; this code reads {FORMATS}')
      if manifest['key'] != key:
        raise ValueError(f'manifest key {manifest["key"]} != its folder {key}')
      if (fmt in _PREFIXED) != ('data' in manifest) or not store_manifest.DATA_ID.fullmatch(
        manifest.get('data', '0000000000-' + '0' * 32)
      ):
        raise ValueError(f'format {fmt} with data {manifest.get("data")!r}')
      meta = blocks.BlockMeta.from_json(manifest['meta'])
      layouts, rows = _checked_layouts(manifest, meta)
      if store_lib.key_for(meta, rows) != key:
        raise ValueError(f'metadata hashes to {store_lib.key_for(meta, rows)}, not its key {key}')
    except store_lib.StoreError:
      raise
    except (ValueError, KeyError, TypeError, IndexError, blocks.BlockMetaError) as e:
      raise store_lib.CorruptBlockError(where, f'bad manifest: {e}') from e
    return manifest, meta, layouts, rows

  def _manifest_bytes(self, key: str) -> bytes | None:
    with self._io(self._where(key), 'cannot read the manifest'):
      found = _result(self._kv.read(f'{key}/{store_lib.MANIFEST}'))
    return bytes(found.value) if found.state == 'value' else None

  # ---- plumbing -------------------------------------------------------------

  def _checked_key(self, key: str) -> str:
    if not _is_key(key):
      raise store_lib.InvalidKeyError(self.root, f'invalid block key {key!r}')
    return key

  def _where(self, key: str) -> str:
    return os.path.join(self.root, key) if self._local else f'{self.root}{key}'

  @contextlib.contextmanager
  def _io(self, where: str, doing: str) -> Iterator[None]:
    try:
      yield
    except OSError as e:
      raise store_lib.StoreIOError(where, f'{doing}: {e}') from e

  @contextlib.contextmanager
  def _shared_lock(self) -> Iterator[None]:
    """The store's `.lock`, shared, as every deposit holds it (garbage collection owns it)."""
    if self._local is None:
      yield
      return
    os.makedirs(os.path.join(self._local, '.tmp'), exist_ok=True)
    fd = os.open(os.path.join(self._local, '.lock'), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_SH)
      yield
    finally:
      os.close(fd)


def _block_files(key, meta, layouts, positions, digests, rows) -> tuple[dict[str, bytes], dict]:
  """positions' chunk and the zarr.json files (path -> bytes), and the block's manifest (in
  format 4, or its kv-heads form when the heads are split)."""
  n = len(positions)
  files = {'positions/c.0': positions.tobytes()}
  arrays = {}
  for name, layout in layouts.items():
    chunk_shape = [1, layout.rows, layout.per_chunk, layout.head_dim]
    chunk_digests = [bytes(d).hex() for d in digests[name]]
    arrays[name] = {
      'dtype': layout.dtype,
      'shape': list(layout.shape),
      'chunk_shape': chunk_shape,
      _DIGEST: chunk_digests,
      _ARRAY_DIGEST: store_lib.array_digest(layout.dtype, layout.shape, chunk_digests),
    }
    files[f'{name}/zarr.json'] = _zarr_json(layout.dtype, layout.shape, chunk_shape)
  positions_digest = _blake3(files['positions/c.0'])
  arrays['positions'] = {
    'dtype': 'int32',
    'shape': [n],
    'chunk_shape': [n],
    _DIGEST: [positions_digest],
    _ARRAY_DIGEST: store_lib.array_digest('int32', [n], [positions_digest]),
  }
  files['positions/zarr.json'] = _zarr_json('int32', [n], [n])
  manifest = {
    'format': FORMAT if any(layout.groups > 1 for layout in layouts.values()) else store_lib.FORMAT,
    'key': key,
    'layout_version': meta.layout_version,
    'meta': meta.to_json(),
    'arrays': arrays,
  }
  if rows is not None:
    manifest['page_layout'] = {'rows': [list(pair) for pair in rows]}
  return files, manifest


def _payload_digest(arrays: dict[str, Any]) -> str:
  """`store_manifest.payload_digest` of a manifest's `arrays` (BLAKE3 in every format here)."""
  return store_manifest.payload_digest({'format': store_lib.FORMAT, 'arrays': arrays})


def _nonfinite(shards: dict[str, list], parts: dict[str, _Part]) -> str | None:
  """'name[...] is value (kv heads from lo)' for a NaN or infinity in the rows of this
  process's shards that the block stores, or None."""
  for source, held in shards.items():
    for lo, data in held:
      for name, part in parts.items():
        if part.source == source:
          found = store_values.first_nonfinite({name: data[list(part.layers), part.first :]})
          if found is not None:
            return (
              f'{found} (kv heads from {lo}): a block holds finite keys and values only (a NaN'
              ' or infinity in any row turns every logit that attends to the block NaN)'
            )
  return None


def _agree(problem: str | None, error: type, where: str) -> None:
  """Raises `error(where, ...)` on every process if any process found a `problem`."""
  flags = np.array([problem is not None], np.int32)
  if jax.process_count() > 1:
    flags = np.asarray(multihost_utils.process_allgather(flags)).reshape(-1)
  if flags.any():
    raise error(where, problem or f'process {int(np.argmax(flags))} found a problem (its error)')


def _agreed_data_id() -> str:
  """A fresh `store_manifest.DATA_ID`, the same on every process (process 0's)."""
  data = np.frombuffer(store_manifest.new_data_id().encode('ascii'), np.uint8)
  if jax.process_count() > 1:
    data = multihost_utils.broadcast_one_to_all(data)
  return bytes(np.asarray(data, np.uint8)).decode('ascii')


def _is_key(name: Any) -> bool:
  return isinstance(name, str) and len(name) == 64 and all(c in '0123456789abcdef' for c in name)


def _result(future: Any) -> Any:
  """`future.result()`, tensorstore's errors raised as OSError."""
  try:
    return future.result()
  except ValueError as e:
    raise OSError(str(e)) from e


def write_chunk(kv: ts.KvStore, name: str, data: bytes) -> None:
  """Writes one value of a deposit (one chunk file, zarr.json or manifest)."""
  _result(kv.write(name, data))


def _dtype(name: str) -> np.dtype:
  return np.dtype(jax.numpy.dtype(name)).newbyteorder('<')


def _own_shards(array, sharding: NamedSharding | None) -> list[tuple[int, np.ndarray]]:
  """(first kv head, [L, n, c', H] little-endian data) of each shard this process writes."""
  if sharding is None:  # whole: process 0 writes every chunk
    if jax.process_index() != 0:
      return []
    shards = [(slice(None), np.asarray(array))]
  else:
    array = jax.device_put(array, sharding)
    shards = [
      (s.index[2], np.asarray(s.data)) for s in array.addressable_shards if s.replica_id == 0
    ]
  heads = array.shape[2]
  return [
    (index.indices(heads)[0], np.ascontiguousarray(data, data.dtype.newbyteorder('<')))
    for index, data in shards
  ]


def _part_chunks(data: np.ndarray, lo: int, part: _Part, per_chunk: int):
  """(layer in the part, kv-head group, bytes) of each chunk of `part` in one shard
  [L, n, c', H] whose first kv head is `lo`."""
  for out, layer in enumerate(part.layers):
    for i in range(data.shape[2] // per_chunk):
      heads = slice(i * per_chunk, (i + 1) * per_chunk)
      yield out, lo // per_chunk + i, data[layer, part.first :, heads].tobytes()


def _checked_block(block: blocks.KVBlock, root: str) -> np.ndarray:
  """The block's positions as little-endian int32 [n]; InvalidBlockError unless it is storable
  exactly: a dtype the store keeps, k and v [L, n, K, H] of it (a compact block's k_tail, v_tail
  [len(tail_layers), tail_rows, Kt, Ht]), positions as its metadata says."""
  meta = block.meta
  n = len(meta.token_ids)
  if not n:
    raise store_lib.InvalidBlockError(root, 'cannot store an empty block')
  if meta.dtype not in store_lib.KV_DTYPES:
    raise store_lib.InvalidBlockError(
      root, f'cannot store k/v of dtype {meta.dtype!r}; only {store_lib.KV_DTYPES}'
    )
  for name in _sources(block):
    array = getattr(block, name)
    layers, rows = ('L', n) if name in _KV else (len(meta.tail_layers), meta.tail_rows)
    if (
      np.dtype(array.dtype).name != meta.dtype
      or len(array.shape) != 4
      or array.shape[1] != rows
      or layers not in ('L', array.shape[0])
    ):
      raise store_lib.InvalidBlockError(
        root,
        f'block {name} is {np.dtype(array.dtype).name}{list(array.shape)}, its metadata'
        f' says {meta.dtype}[{layers}, {rows}, K, H]',
      )
  positions = np.asarray(block.positions)
  expected = meta.first_position + meta.shift + np.arange(n, dtype=np.int64)
  if positions.shape != (n,) or not np.array_equal(positions, expected):
    raise store_lib.InvalidBlockError(
      root,
      f'block positions {positions.tolist()[:4]}... are not {meta.first_position} +'
      f' shift {meta.shift} + i, i < {n}, as its metadata says',
    )
  if expected[-1] > np.iinfo(np.int32).max:
    raise store_lib.InvalidBlockError(root, f'positions up to {expected[-1]} exceed int32')
  return np.ascontiguousarray(positions, np.dtype('<i4'))


def _combine(digests: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
  """Every process's chunk digests per array [layers, groups, 32] (zeros where another
  process wrote the chunk), merged and flattened to [layers * groups, 32]."""
  flat = np.concatenate([d.reshape(-1, 32) for d in digests.values()])
  if jax.process_count() > 1:
    flat = np.bitwise_or.reduce(multihost_utils.process_allgather(flat), axis=0)
  if not flat.any(axis=1).all():
    raise store_lib.StoreIOError(where, 'some chunk was written by no process')
  stops = np.cumsum([d.size // 32 for d in digests.values()])
  return dict(zip(digests, np.split(flat, stops[:-1]), strict=True))


def _agreed_token() -> str:
  """A fresh name for this deposit, the same on every process (process 0's)."""
  token = np.frombuffer(uuid.uuid4().bytes, np.uint8)
  if jax.process_count() > 1:
    token = multihost_utils.broadcast_one_to_all(token)
  return bytes(np.asarray(token, np.uint8)).hex()


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def _checked_layouts(
  manifest: dict[str, Any], meta: blocks.BlockMeta
) -> tuple[dict[str, _Layout], store_pages.Layout | None]:
  """The arrays a manifest declares and its page layout, checked against its metadata
  (ValueError)."""
  n = len(meta.token_ids)
  entries = manifest['arrays']
  shape = entries['k']['shape']
  if len(shape) != 4:
    raise ValueError(f'arrays.k.shape {shape}, expected [L, rows, K, H]')
  rows = None
  layers = shape[0]
  if 'page_layout' in manifest:
    if meta.tail_layers:
      raise ValueError(
        f'page_layout beside meta.tail_layers {list(meta.tail_layers)}: a compact block'
        ' records its rows in its metadata'
      )
    layers = len(manifest['page_layout']['rows'])
    rows = store_pages.checked_layout(manifest['page_layout']['rows'], layers, n)
  parts = _parts(meta, rows, layers, n)
  if set(entries) != {*parts, 'positions'}:
    raise ValueError(f'arrays {sorted(entries)}, expected {sorted({*parts, "positions"})}')
  layouts = {}
  for name, part in parts.items():
    # v is stored as k, v_tail as k_tail; a page's tail in k's heads.
    reference = entries['k_tail' if part.source in _TAILS else 'k']
    ref_shape, chunk_shape = reference['shape'], reference['chunk_shape']
    if len(ref_shape) != 4 or len(chunk_shape) != 4:
      raise ValueError(f'arrays.{name}: shape {ref_shape}, chunk_shape {chunk_shape}')
    per_chunk, heads = chunk_shape[2], ref_shape[2]
    if per_chunk <= 0 or heads % per_chunk:
      raise ValueError(f'chunk_shape {chunk_shape} does not tile {ref_shape} by kv heads')
    source_rows = meta.tail_rows if part.source in _TAILS else n
    stored = (0, source_rows, heads, ref_shape[3])
    layout = _part_layout(stored, part, per_chunk, meta.dtype)
    entry = entries[name]
    want = [1, layout.rows, per_chunk, layout.head_dim]
    if entry['shape'] != list(layout.shape) or entry['chunk_shape'] != want:
      raise ValueError(
        f'arrays.{name} is {entry["shape"]}/{entry["chunk_shape"]}, expected'
        f' {list(layout.shape)}/{want} for {n} token ids'
      )
    if entry['dtype'] != meta.dtype:
      raise ValueError(f"arrays.{name}.dtype {entry['dtype']} != the metadata's {meta.dtype}")
    digests = entry[_DIGEST]
    if len(digests) != layout.layers * layout.groups:
      raise ValueError(
        f'arrays.{name} has {len(digests)} chunk digests, expected {layout.layers * layout.groups}'
      )
    if store_lib.array_digest(meta.dtype, entry['shape'], digests) != entry[_ARRAY_DIGEST]:
      raise ValueError(f'arrays.{name}.blake3 does not match its chunk digests')
    layouts[name] = layout
  split = [name for name, layout in layouts.items() if layout.groups != 1]
  if manifest['format'] in (store_lib.FORMAT, store_lib.PREFIXED_FORMAT) and split:
    raise ValueError(
      f'format {manifest["format"]} keeps every kv head in a chunk: arrays {split} are split'
    )
  positions = entries['positions']
  if positions['shape'] != [n] or positions['dtype'] != 'int32' or len(positions[_DIGEST]) != 1:
    raise ValueError(f'arrays.positions is {positions["dtype"]}{positions["shape"]}')
  return layouts, rows


def _fsync_tree(path: str) -> None:
  for folder, _, files in os.walk(path):
    for name in files:
      fd = os.open(os.path.join(folder, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    _fsync_dir(folder)


def _fsync_dir(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)
