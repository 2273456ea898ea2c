"""The paged attention context: route, read, verify, check against the catalog, install, query.

Details and the exactness argument: docs/paging.md, section `graftjax/paging/context.py`.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from graftjax import blocks
from graftjax import compose
from graftjax import store as store_lib
from graftjax.models import cache as cache_lib
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import pages

WINDOW_SLOTS = 32_768  # gemma-3-270m's context: the paged context's default capacity


class PagedContextError(compose.ComposeError):
  """A paged context cannot be built as asked; no cache was built."""


# --- host-memory tier --------------------------------------------------------------------------


def pinned_host_sharding() -> jax.sharding.Sharding | None:
  """A sharding on the first device's `pinned_host` memory, or None (CPU, or no such kind)."""
  device = jax.devices()[0]
  if device.platform == 'cpu':
    return None
  try:
    kinds = {memory.kind for memory in device.addressable_memories()}
  except (AttributeError, NotImplementedError, RuntimeError):
    return None
  if 'pinned_host' not in kinds:
    return None
  return jax.sharding.SingleDeviceSharding(device, memory_kind='pinned_host')


@dataclasses.dataclass
class _Held:
  arrays: dict[str, Any]  # the kept rows: numpy, or jax arrays in pinned host memory
  layout: pages.Layout | None
  meta: blocks.BlockMeta
  digest: str
  nbytes: int


def _compact(block: blocks.KVBlock, layout: pages.Layout | None) -> dict[str, np.ndarray]:
  """The rows `layout` keeps, as copies: k/v rows from `first` grouped by first row, positions;
  a compact block's own arrays."""
  if block.meta.compact:
    return {name: np.array(a) for name, a in block.arrays().items()}
  k, v = np.asarray(block.k), np.asarray(block.v)
  out = {'positions': np.array(block.positions, np.int32)}
  groups: dict[int, list[int]] = {}
  for layer, (first, _) in enumerate(layout or ((0, len(block)),) * k.shape[0]):
    groups.setdefault(first, []).append(layer)
  for first, layers in sorted(groups.items()):
    out[f'k@{first}'] = np.ascontiguousarray(k[layers, first:])
    out[f'v@{first}'] = np.ascontiguousarray(v[layers, first:])
  return out


def _expand(arrays: dict[str, np.ndarray], held: _Held) -> blocks.KVBlock:
  """The block from `_compact`'s arrays (for a block of layout 3, zeros in the rows not kept)."""
  if held.meta.compact:
    return blocks.KVBlock(meta=held.meta, **arrays)
  n = len(held.meta.token_ids)
  layout = held.layout or ((0, n),) * arrays['k@0'].shape[0]
  any_k = next(a for name, a in arrays.items() if name.startswith('k@'))
  shape = (len(layout), n, *any_k.shape[2:])
  full = {name: np.zeros(shape, any_k.dtype) for name in ('k', 'v')}
  groups: dict[int, list[int]] = {}
  for layer, (first, _) in enumerate(layout):
    groups.setdefault(first, []).append(layer)
  for first, layers in groups.items():
    for name in ('k', 'v'):
      full[name][layers, first:] = arrays[f'{name}@{first}']
  return blocks.KVBlock(k=full['k'], v=full['v'], positions=arrays['positions'], meta=held.meta)


def _digest(arrays: dict[str, np.ndarray]) -> str:
  h = hashlib.sha256()
  for name in sorted(arrays):
    a = arrays[name]
    h.update(f'{name}:{a.dtype.name}{list(a.shape)}\n'.encode())
    h.update(np.ascontiguousarray(a).data)
  return h.hexdigest()


class HostTier:
  """An LRU of verified pages in host memory in front of `store`, bounded by `max_bytes`.

  A miss reads the page from the store (every chunk's digest verified), keeps a copy of its
  kept rows (evicting the least recently used pages until it fits; a page larger than
  `max_bytes` is returned but not kept) and returns it. A hit rebuilds the page from host
  memory, re-hashing it first when `verify_hits`.

  Args:
    store: the store behind the tier.
    max_bytes: bound on the bytes of the pages held.
    verify_hits: re-hash a held page on every hit (default True).
    memory: 'auto' (pinned host memory where the device offers it, else numpy), 'numpy', or
      'pinned_host' (an error where the device does not offer it).
  """

  def __init__(
    self,
    store: store_lib.BlockStore,
    *,
    max_bytes: int,
    verify_hits: bool = True,
    memory: str = 'auto',
  ):
    if max_bytes < 0:
      raise ValueError(f'max_bytes must be >= 0, got {max_bytes}')
    if memory not in ('auto', 'numpy', 'pinned_host'):
      raise ValueError(f"memory must be 'auto', 'numpy' or 'pinned_host', got {memory!r}")
    self._sharding = None if memory == 'numpy' else pinned_host_sharding()
    if memory == 'pinned_host' and self._sharding is None:
      raise ValueError(f'device {jax.devices()[0]} offers no pinned_host memory')
    self.store = store
    self.max_bytes = int(max_bytes)
    self.verify_hits = verify_hits
    self.memory = 'numpy' if self._sharding is None else 'pinned_host'
    self._held: collections.OrderedDict[str, _Held] = collections.OrderedDict()
    self.nbytes = 0
    self.hits = self.misses = self.evictions = 0

  def __len__(self) -> int:
    return len(self._held)

  def __contains__(self, key: str) -> bool:
    return key in self._held

  def stats(self) -> dict[str, Any]:
    return {
      'memory': self.memory,
      'max_bytes': self.max_bytes,
      'nbytes': self.nbytes,
      'pages': len(self._held),
      'hits': self.hits,
      'misses': self.misses,
      'evictions': self.evictions,
    }

  def clear(self) -> None:
    self._held.clear()
    self.nbytes = 0

  def get(self, key: str) -> pages.Page:
    """The page under `key`, verified: from host memory on a hit, else from the store.

    Raises:
      store.StoreError: the page is missing or does not verify in the store, or (a
        `CorruptBlockError` naming the tier) its bytes changed in host memory.
    """
    held = self._held.get(key)
    if held is None:
      self.misses += 1
      block, layout = self.store.get_page(key)
      self._keep(key, block, layout)
      return pages.Page(block=block, layout=layout)
    self._held.move_to_end(key)
    arrays = {name: np.asarray(a) for name, a in held.arrays.items()}
    if self.verify_hits and _digest(arrays) != held.digest:
      self._drop(key)
      raise store_lib.CorruptBlockError(
        f'host tier/{key}',
        'the page changed in host memory since it was verified; evicted (read it again)',
      )
    self.hits += 1
    return pages.Page(block=_expand(arrays, held), layout=held.layout)

  def _keep(self, key: str, block: blocks.KVBlock, layout: pages.Layout | None) -> None:
    arrays = _compact(block, layout)
    nbytes = sum(a.nbytes for a in arrays.values())
    if nbytes > self.max_bytes:
      return
    while self.nbytes + nbytes > self.max_bytes:
      self._drop(next(iter(self._held)))
      self.evictions += 1
    digest = _digest(arrays)
    if self._sharding is not None:
      arrays = {name: jax.device_put(a, self._sharding) for name, a in arrays.items()}
    self._held[key] = _Held(arrays, layout, block.meta, digest, nbytes)
    self.nbytes += nbytes

  def _drop(self, key: str) -> None:
    self.nbytes -= self._held.pop(key).nbytes


# --- the context -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Context:
  """A cache holding the routed pages, ready for a query in segment 0.

  Attributes:
    cache: `capacity` slots; its `length` is the query's first slot.
    layout: where each page sits (`compose.Layout`; placement i holds entries[i]).
    entries: the catalog entries of the pages, in placement order.
    scores: the router's score of each (None when assembled from keys).
    token_ids: each page's tokens (for the fresh reference, `PagedContext.fresh`).
    seconds: wall time of each step: route, read (+ verify), check, install.
    hits: how many of the pages came from the host tier.
  """

  cache: cache_lib.KVCache
  layout: compose.Layout
  entries: tuple[catalog_lib.Entry, ...]
  scores: tuple[float, ...] | None
  token_ids: tuple[tuple[int, ...], ...]
  seconds: dict[str, float]
  hits: int

  @property
  def keys(self) -> tuple[str, ...]:
    return tuple(entry.key for entry in self.entries)


class PagedContext:
  """Pages of `store`, catalogued in `catalog`, installed on demand into `capacity` slots.

  Args:
    model: a `Gemma` under `rope_relative` with split-invariant attention, Pallas or 'xla_split'
      (`compose.check_model`).
    store: the pages' store.
    catalog: their catalog (its router answers `open`).
    capacity: slots of the context's cache (default 32,768, gemma-3-270m's context).
    page: slots per page, a multiple of the model's attention split (default one split).
    tier: a `HostTier` in front of `store` (None: every page read from the store).
  """

  def __init__(
    self,
    model,
    store: store_lib.BlockStore,
    catalog: catalog_lib.Catalog,
    *,
    capacity: int = WINDOW_SLOTS,
    page: int | None = None,
    tier: HostTier | None = None,
  ):
    self.page = compose.check_model(model, page, capacity=capacity)
    if capacity <= 0 or capacity % self.page:
      raise PagedContextError(
        f'capacity {capacity} is not a whole number of pages of {self.page} slots'
      )
    if tier is not None and tier.store is not store:
      raise PagedContextError(f'the host tier sits in front of {tier.store.root}, not {store.root}')
    self.model, self.store, self.catalog = model, store, catalog
    self.capacity, self.tier = capacity, tier

  @classmethod
  def from_spec(
    cls, model, store_spec: Any, catalog_path: str, *, tier_bytes: int = 0, **kwargs
  ) -> PagedContext:
    """A context over the store at `store_spec` (path, kvstore URL or JSON spec), read-only.

    Raises:
      store.UnknownDriverError: the spec names a kvstore driver tensorstore does not have.
    """
    store = store_lib.BlockStore(store_spec, read_only=True)
    tier = HostTier(store, max_bytes=tier_bytes) if tier_bytes else None
    catalog = catalog_lib.Catalog(catalog_path, store=store)
    return cls(model, store, catalog, tier=tier, **kwargs)

  def open(self, query: str, k: int, *, threshold: float | None = None) -> Context:
    """Routes `query` to its top-k pages and assembles them (see `assemble`)."""
    start = time.perf_counter()
    routed = self.catalog.route(query, k, threshold=threshold)
    route_s = time.perf_counter() - start
    if not routed:
      raise PagedContextError(f'no page routed for query {query[:60]!r} (k={k})')
    return self.assemble(
      [entry.key for entry, _ in routed],
      scores=[score for _, score in routed],
      route_s=route_s,
    )

  def assemble(
    self,
    keys: Sequence[str],
    *,
    slots: Sequence[int] | None = None,
    scores: Sequence[float] | None = None,
    route_s: float = 0.0,
  ) -> Context:
    """The context of the pages under `keys`: page i in segment i + 1, the query after them.

    Every page is read and verified, and checked against its catalog entry and the model,
    before the cache is built.

    Raises:
      catalog.CatalogError: a key is not catalogued.
      PagedContextError: a page catalogued for another model or dtype, or whose stored
        layout or length is not the catalogued one; a layout `compose.plan` refuses.
      catalog.BindingError: a page whose tokens are not the ones its catalog row claims
        (e.g. rows whose keys were swapped), checked before anything is installed.
      store.StoreError: a page missing or corrupted (in the store or in the host tier).
      blocks.GraftError (pages.PageError): a page of another model, scheme or dtype, or whose
        trimmed rows a query at the context's position would see.
    """
    target, config = self.model.graft_target, self.model.config
    if not keys:
      raise PagedContextError('nothing to assemble: no pages')
    entries = [self.catalog.get(key) for key in keys]
    for entry in entries:
      if entry.model_fingerprint != target.fingerprint or entry.dtype != target.dtype:
        raise PagedContextError(
          f'page {_name(entry)} is catalogued for another model or dtype'
          f' ({entry.model_fingerprint[:16]}…, {entry.dtype}); this model is'
          f' {target.fingerprint[:16]}…, {target.dtype}'
        )
    times = {'route': route_s}
    start = time.perf_counter()
    hits_before = self.tier.hits if self.tier is not None else 0
    read = [self._read(key) for key in keys]
    hits = (self.tier.hits - hits_before) if self.tier is not None else 0
    times['read'] = time.perf_counter() - start
    start = time.perf_counter()
    shapes = jax.eval_shape(lambda: self.model.init_cache(capacity=self.capacity))
    for entry, page in zip(entries, read):
      catalog_lib.check_entry(entry, page.block.meta, tokens_only=True)
      if page.layout != entry.page_layout or len(page.block) != entry.n_tokens:
        raise PagedContextError(
          f'page {_name(entry)}: the store holds {len(page.block)} tokens in layout'
          f' {page.layout}, the catalog says {entry.n_tokens} in {entry.page_layout}'
        )
      with _naming(entry):
        blocks.check_compatible(shapes, page.block, target=target)
    placed, layout = compose.place(
      self.model,
      [page.block for page in read],
      capacity=self.capacity,
      page=self.page,
      slots=slots,
      keys=list(keys),
    )
    for entry, page, block in zip(entries, read, placed):
      with _naming(entry):
        pages.check_page(
          pages.Page(block=block, layout=page.layout), config, query_position=layout.next_position
        )
    times['check'] = time.perf_counter() - start
    start = time.perf_counter()
    cache = jax.block_until_ready(
      compose.install(
        self.model, placed, capacity=self.capacity, query_position=layout.next_position
      )
    )
    times['install'] = time.perf_counter() - start
    return Context(
      cache=cache,
      layout=layout,
      entries=tuple(entries),
      scores=None if scores is None else tuple(float(s) for s in scores),
      token_ids=tuple(page.block.meta.token_ids for page in read),
      seconds=times,
      hits=hits,
    )

  def query(self, context: Context, token_ids: Sequence[int], *, chunk_size: int, logits='last'):
    """Runs `token_ids` in segment 0 after the pages; returns (logits, cache) as `prefill`.

    The context's cache is donated to the prefill where the backend donates: use the
    returned cache, not `context.cache`, afterwards.
    """
    n = len(token_ids)
    if context.layout.length + n > self.capacity:
      raise PagedContextError(
        f'a query of {n} tokens does not fit after the pages (slot {context.layout.length}'
        f' of {self.capacity})'
      )
    return self.model.prefill(
      token_ids,
      cache=context.cache,
      chunk_size=chunk_size,
      start_position=context.layout.next_position,
      logits=logits,
      segment=0,
    )

  def fresh(self, context: Context, *, chunk_size: int) -> cache_lib.KVCache:
    """The reference: the pages' texts prefilled fresh in the context's layout (segments)."""
    return compose.fresh_layout(
      self.model, context.token_ids, context.layout, chunk_size=chunk_size
    )

  def _read(self, key: str) -> pages.Page:
    return self.tier.get(key) if self.tier is not None else pages.get(self.store, key)


def _name(entry: catalog_lib.Entry) -> str:
  return f'{entry.key[:12]}… ({entry.source})'


class _naming:
  """Re-raises a GraftError with the page's key and source in front of its message."""

  def __init__(self, entry: catalog_lib.Entry):
    self.entry = entry

  def __enter__(self):
    return self

  def __exit__(self, kind, error, traceback):
    if isinstance(error, blocks.GraftError) and not isinstance(error, PagedContextError):
      raise type(error)(f'page {_name(self.entry)}: {error}') from error
    return False
