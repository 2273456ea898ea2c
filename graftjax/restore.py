"""`restore`: read a stored block, verify it, check it and graft it, in one call.

Apart from blocks.py because it needs the store, and the store needs blocks. A restore
reads the block's chunk files into host staging buffers (`Staging`: reused from one
restore to the next; pinned host memory on a GPU), every byte hashed and checked against
its digest as it lands; verified layers of k and v are copied to the device while later
ones are still read (into new device arrays, not the cache). It then checks the block
against the model and the cache, and only then writes the copied rows into the cache (one
in-place write). Why each step, and the floor it is measured against:
docs/store_format.md, "Restoring into a cache".
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from collections.abc import Sequence

import jax
import numpy as np

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.models import cache as cache_lib
from graftjax.models import target as target_lib
from graftjax.models.gemma import config as config_lib

_ALIGN = 64  # XLA on CPU takes a host buffer aligned so without copying it

# Verified layers of k or v are copied to the device once they hold this many bytes (and
# the rest when the array is complete). In the H200's read stage 16 MiB was the fastest of
# 1, 4 and 16 MiB and whole arrays: as fast as whole arrays up to 4k tokens, 10% faster at 32k
# (experiments/results/graft_speed/logs/restore_groups_h200.txt; each copy costs 60-80 us
# of dispatch, pinned_view_put_h200.txt there).
COPY_BYTES = 16 << 20


class Staging:
  """Host buffers a restore reads into and installs from, kept between restores.

  On a device that offers `pinned_host` memory (a GPU) the buffers are jax arrays
  in pinned host memory, written through a numpy view of their memory (checked
  once with a round trip through the device; numpy memory otherwise), so the
  host-to-device copy is a DMA from pinned memory. On CPU they are numpy
  buffers aligned to 64 bytes and touched once when made: `jax.device_put`
  hands them to XLA without a copy, and no restore pays page faults.

  A buffer is kept per array and reused while the shape stays; the arrays
  `read` returns are views of it, valid until the next `read` into this
  staging. One restore at a time.

  `early_copies` says whether `read` copies verified layers to the device while
  later ones are still read (`COPY_BYTES` at a time). By default only off the
  host CPU: there XLA takes a staging buffer without copying it, so an early
  `device_put` overlaps nothing and costs only its dispatch, on the cores that
  read and hash (measured in
  experiments/results/graft_speed/logs/restore_install_probe_cpu.txt); the install
  then takes each array whole.

  Attributes:
    device: the device restores install into.
    memory: 'pinned_host' or 'host' (numpy memory).
    early_copies: whether `read` copies verified layers to the device as they verify.
    timings: seconds of the last restore through it, by stage: 'read_s' (`read`: every
      chunk read and verified, the copies of verified layers dispatched meanwhile),
      'copy_dispatch_s' (of it, dispatching those copies), 'install_s' (`install`:
      its checks, the copies left, the write into the cache and the wait for all).
  """

  def __init__(
    self,
    device: jax.Device | None = None,
    *,
    memory: str = 'auto',
    early_copies: bool | None = None,
  ):
    if memory not in ('auto', 'host', 'pinned_host'):
      raise ValueError(f"memory must be 'auto', 'host' or 'pinned_host', got {memory!r}")
    self.device = device or jax.devices()[0]
    self.early_copies = self.device.platform != 'cpu' if early_copies is None else early_copies
    offers = self.device.platform != 'cpu' and 'pinned_host' in _memory_kinds(self.device)
    if memory == 'pinned_host' and not offers:
      raise ValueError(f'device {self.device} offers no pinned_host memory')
    pinned = memory != 'host' and offers and _pinned_view_works(self.device)
    self.memory = 'pinned_host' if pinned else 'host'
    if memory == 'pinned_host' and self.memory != 'pinned_host':
      raise ValueError(f'cannot write pinned_host memory of {self.device} through a host view')
    self._buffers: dict[str, tuple[np.ndarray, jax.Array | None]] = {}
    self._copies: list[jax.Array] = []  # copies out of the buffers that may be in flight
    self.timings: dict[str, float] = {}

  def buffer(self, name: str, shape: Sequence[int], dtype) -> np.ndarray:
    """A writable host array of `shape` and `dtype` kept under `name` (reused if it fits).

    Waits first for every copy out of this staging still in flight.
    """
    jax.block_until_ready(self._copies)
    self._copies = []
    shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
    held = self._buffers.get(name)
    if held is None or held[0].shape != shape or held[0].dtype != dtype:
      self._buffers.pop(name, None)
      held = _make_buffer(shape, dtype, self.device if self.memory == 'pinned_host' else None)
      self._buffers[name] = held
    return held[0]

  def to_device(self, name: str, rows: int, layers: slice = slice(None)) -> jax.Array:
    """The first `rows` along axis 0 (positions) or 1 (k, v: of `layers` only) of buffer
    `name`, on `device`.

    Whole rows go in one host-to-device copy straight from the buffer (from
    pinned memory a DMA, also for a numpy view of part of it; on CPU none, XLA
    takes the buffer); fewer rows are copied out first.
    """
    buffer, pinned = self._buffers[name]
    view = buffer if buffer.ndim == 1 else buffer[layers]
    axis = 0 if view.ndim == 1 else 1
    if rows != view.shape[axis]:
      return jax.device_put(
        np.ascontiguousarray(view[(slice(None),) * axis + (slice(rows),)]), self.device
      )
    whole = pinned is not None and view.shape == buffer.shape
    copy = jax.device_put(pinned if whole else view, device_memory(self.device))
    self._copies.append(copy)
    return copy

  def landed(self) -> None:
    """Says that every copy out of this staging has reached the device."""
    self._copies = []


@dataclasses.dataclass(frozen=True)
class Staged:
  """A block read into a `Staging`, verified, ready to install.

  Attributes:
    block: the block; its arrays (k, v [L, n, K, H], a compact block's k_tail,
      v_tail [Lt, r, Kt, Ht], positions [n]) are views of the staging buffers (for a
      page of layout 3, zeros in the rows it does not keep).
    layout: the page layout of a page of layout 3, or None.
    rows: the rows staged per array, m >= n (rows n..m are not installed), by name.
    staging: where it lies.
    copies: the arrays already on the device, by name: k and v (and tails) each as
      parts [L_i, m, K, H], layers in order (sum of L_i = L); positions as ([m],).
  """

  block: blocks.KVBlock
  layout: tuple[tuple[int, int], ...] | None
  rows: dict[str, int]
  staging: Staging
  copies: dict[str, tuple[jax.Array, ...]] = dataclasses.field(default_factory=dict)


def read(store: store_lib.BlockStore, key: str, staging: Staging, *, capacity: int) -> Staged:
  """Reads and verifies the block under `key` into `staging`, for a cache of `capacity` slots.

  Rows are staged as `blocks.graft` pads them (to a multiple of
  `blocks.INSTALL_BUCKET`, within the capacity), so installs of any length
  share a few compiled programs. With `staging.early_copies`, layers of k and v
  are copied to the device as they verify, `COPY_BYTES` or more at a time, and
  positions once verified (`Staged.copies`).

  Raises:
    store.StoreError: if the block is missing or does not verify.
  """
  rows, layers, layer_bytes = {}, {}, {}
  parts = {name: [] for name in _ARRAYS}
  copied = dict.fromkeys(_ARRAYS, 0)

  def into(meta: blocks.BlockMeta, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    n = shapes['positions'][0]
    rows['positions'] = m = blocks.install_bucket(n, start=meta.start, capacity=capacity)
    layers['positions'] = 1
    out = {}
    for name, shape in shapes.items():
      if name == 'positions':
        continue
      # A compact block's tail lands at its last slots: padded within the capacity from there.
      first = meta.start + n - shape[1]
      rows[name] = bucket = blocks.install_bucket(shape[1], start=first, capacity=capacity)
      layers[name] = shape[0]
      layer_bytes[name] = bucket * int(np.prod(shape[2:])) * np.dtype(meta.dtype).itemsize
      out[name] = staging.buffer(name, (shape[0], bucket, *shape[2:]), meta.dtype)[:, : shape[1]]
    positions = staging.buffer('positions', (m,), np.int32)
    positions[n:] = cache_lib.EMPTY_POSITION
    return {**out, 'positions': positions[:n]}

  def copy(name: str, stop: int | None) -> None:
    stop = layers[name] if stop is None else stop
    start = copied[name]
    if stop < layers[name] and (stop - start) * layer_bytes[name] < COPY_BYTES:
      return
    t0 = time.perf_counter()
    parts[name].append(staging.to_device(name, rows[name], slice(start, stop)))
    copied[name] = stop
    staging.timings['copy_dispatch_s'] += time.perf_counter() - t0

  staging.timings = {'copy_dispatch_s': 0.0}
  t0 = time.perf_counter()
  block, layout = store.get_page(key, into=into, on_verified=copy if staging.early_copies else None)
  staging.timings['read_s'] = time.perf_counter() - t0
  copies = {name: tuple(parts[name]) for name in rows if copied[name] == layers[name]}
  return Staged(block=block, layout=layout, rows=rows, staging=staging, copies=copies)


_ARRAYS = ('k', 'v', 'k_tail', 'v_tail', 'positions')


def install(
  cache: cache_lib.KVCache,
  staged: Staged,
  *,
  target: target_lib.GraftTarget,
  config: config_lib.GemmaConfig | None = None,
  query_position: int | None = None,
  allow_shifted: bool = False,
  allow_other_shape: bool = False,
  chunk_size: int | None = None,
  donate: bool = False,
) -> cache_lib.KVCache:
  """`cache` with the staged block installed, as `blocks.graft` installs it.

  Every refusal of `graft` is checked first, and for a page every refusal of
  `paging.pages.page_in` (`blocks.check_page` against `config`'s windows and
  `query_position`; a page is refused without `config`). The cache is untouched
  on any error, even with `donate=True`; then the staged rows are copied to the
  device (unless `read` copied them already) and written in place. Returns
  when the cache is ready (the staging may then be reused).

  Raises:
    blocks.GraftError: as `blocks.graft`; blocks.PageError for a page.
  """
  t0 = time.perf_counter()
  block = staged.block
  check_page(staged, config, query_position=query_position)
  blocks.check_graft(
    cache,
    block,
    target=target,
    allow_shifted=allow_shifted,
    allow_other_shape=allow_other_shape,
    chunk_size=chunk_size,
    query_position=query_position,
  )
  meta = block.meta
  arrays = {}
  for name, staged_rows in staged.rows.items():
    # Fewer rows than staged only if this cache is smaller than `read` was told; still enough.
    first = (
      meta.start if name in ('k', 'v', 'positions') else meta.start + len(block) - meta.tail_rows
    )
    m = min(staged_rows, cache.capacity - first)
    copied = staged.copies.get(name) if m == staged_rows else None
    arrays[name] = copied or (staged.staging.to_device(name, m),)
  (positions,) = arrays['positions']
  if meta.compact:
    written = blocks.install_compact(
      cache,
      arrays['k'],
      arrays['v'],
      arrays.get('k_tail'),
      arrays.get('v_tail'),
      positions,
      meta=meta,
      layers=block.num_layers,
      donate=donate,
    )
  else:
    written = blocks.install_rows(
      cache,
      arrays['k'],
      arrays['v'],
      positions,
      segment=meta.segment,
      start=meta.start,
      n=len(block),
      donate=donate,
    )
  cache = jax.block_until_ready(written)
  staged.staging.landed()  # the cache is ready, so every copy it was written from landed
  staged.staging.timings['install_s'] = time.perf_counter() - t0
  return cache


def check_page(
  staged: Staged, config: config_lib.GemmaConfig | None, *, query_position: int | None
) -> None:
  """Raises blocks.PageError unless the staged block is a plain block, or a page exact for
  `config` and a query at `query_position` (as `paging.pages.page_in` checks one)."""
  if staged.layout is None:
    return
  if config is None:
    raise blocks.PageError(
      f'the block is a page (rows kept per layer: {list(staged.layout)}); pass the'
      " model's config to check that its layers keep what a query sees"
    )
  windows = tuple(config.window(layer) for layer in range(config.num_layers))
  blocks.check_page(staged.block, staged.layout, windows, query_position=query_position)


def restore(
  store: store_lib.BlockStore,
  key: str,
  cache: cache_lib.KVCache,
  *,
  target: target_lib.GraftTarget,
  config: config_lib.GemmaConfig | None = None,
  query_position: int | None = None,
  token_ids: Sequence[int] | None = None,
  allow_shifted: bool = False,
  allow_other_shape: bool = False,
  chunk_size: int | None = None,
  donate: bool = False,
  staging: Staging | None = None,
) -> cache_lib.KVCache:
  """`cache` with the block stored under `key` grafted in (see `blocks.graft`).

  The store checks every chunk against its digest and that the manifest describes
  `key`; `graft`'s checks then hold the block against `target` and `cache`.
  All of it happens before the cache is touched, so on any error `cache` is
  left as it was, even with `donate=True`.

  Args:
    store: where the block is.
    key: its content key (`store.put`'s return value).
    cache: the cache to graft into.
    target: the model's `graft_target`.
    config: the model's config; needed only for a page (a block stored with
      `page_layout`), whose layout it checks as `paging.pages.page_in` does.
    query_position: for a page that keeps fewer than W - 1 local rows, the
      position of the first query (exact only from `Page.first_exact_position`).
    token_ids: if given, the tokens the caller expects the block to hold.
    chunk_size: the prefill chunk size in force (this cache's). Under kernels
      that are not chunk-invariant it must be given and be the block's
      recorded one (`blocks.graft`).
    allow_shifted, allow_other_shape, donate: as for `blocks.graft`.
    staging: host buffers to read through, kept between restores (if None,
      numpy buffers used once: no pinned memory is allocated for one restore).

  Raises:
    store.StoreError: if the block is missing or does not verify.
    blocks.GraftError: if it holds other tokens than `token_ids`, or
      `graft` refuses it; blocks.PageError if it is a page `page_in` refuses.
  """
  staged = read(store, key, staging or Staging(memory='host'), capacity=cache.capacity)
  if token_ids is not None and tuple(int(t) for t in token_ids) != staged.block.meta.token_ids:
    raise blocks.GraftError(f'block {key[:12]}… holds other tokens than the ones asked for')
  return install(
    cache,
    staged,
    target=target,
    config=config,
    query_position=query_position,
    allow_shifted=allow_shifted,
    allow_other_shape=allow_other_shape,
    chunk_size=chunk_size,
    donate=donate,
  )


def _memory_kinds(device: jax.Device) -> set[str]:
  try:
    return {memory.kind for memory in device.addressable_memories()}
  except (AttributeError, NotImplementedError, RuntimeError):
    return set()


def _make_buffer(
  shape: tuple[int, ...], dtype: np.dtype, pinned_on: jax.Device | None
) -> tuple[np.ndarray, jax.Array | None]:
  """(writable numpy view, its pinned jax array or None), touched once (no later faults)."""
  nbytes = int(np.prod(shape)) * dtype.itemsize
  if pinned_on is not None:
    sharding = jax.sharding.SingleDeviceSharding(pinned_on, memory_kind='pinned_host')
    pinned = jax.block_until_ready(jax.device_put(np.zeros(shape, dtype), sharding))
    memory = (ctypes.c_uint8 * nbytes).from_address(pinned.unsafe_buffer_pointer())
    return np.frombuffer(memory, np.uint8).view(dtype).reshape(shape), pinned
  raw = np.empty(nbytes + _ALIGN, np.uint8)
  offset = -raw.ctypes.data % _ALIGN
  view = raw[offset : offset + nbytes]
  view.fill(0)
  return view.view(dtype).reshape(shape), None


def device_memory(device: jax.Device) -> jax.sharding.Sharding:
  """`device`'s own memory, named: moving a pinned_host array there needs the memory kind
  said (jax 0.11 refuses `device_put(pinned, device)` as a memory kind mismatch)."""
  return jax.sharding.SingleDeviceSharding(device, memory_kind='device')


def _pinned_view_works(device: jax.Device) -> bool:
  """Whether bytes written through a host view of a pinned buffer reach the device."""
  try:
    want = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    view, pinned = _make_buffer(want.shape, want.dtype, device)
    view[:] = want
    return bool(np.array_equal(np.asarray(jax.device_put(pinned, device_memory(device))), want))
  except Exception:  # any failure: use numpy memory
    return False
