"""Gemma 3 over a device mesh: tensor parallel over 'model', batch over 'data'.

    mesh = jax.make_mesh((1, 4), ('data', 'model'))
    m = sharding.shard_model(model, mesh)        # params placed, forward pinned
    m = sharding.load('gemma3-12b', weights=ckpt, mesh=mesh)  # placed as each tensor loads
    cache = m.init_cache(batch_size=1, capacity=256)  # k/v split by kv heads
    logits, cache = m.prefill(ids, cache=cache, chunk_size=16)

Placement (`param_spec`; D embed, F hidden, N heads, K kv heads, H head dim):
  q [D, N, H], k/v [D, K, H]  heads over 'model'
  o [N, H, D]                 heads over 'model' (its sum over heads all-reduces)
  gate/up [D, F], down [F, D] F over 'model' (down's sum over F all-reduces)
  embedding [V, D]            vocabulary over 'model' (a lookup sums one row and
                              zeros; the tied unembedding's logits split over V)
  norms [D] or [H]            replicated (a few KB)
A dimension the 'model' axis does not divide is replicated instead. The cache
k/v [L, B, S, K, H] (and a 'ring' cache's ring k/v [Lr, B, R, K, H]) splits K
over 'model' and B over 'data'; when K is not a multiple of the 'model'
devices (270M and 1B have one kv head) the kv
projections and the cache are replicated over 'model': every device of a data
row holds the whole cache and computes its keys, and the query heads stay
split. Everything is a `NamedSharding`; the jitted forward pins its inputs and
its cache to them with sharding constraints and leaves the rest to XLA's
partitioner. See docs/sharding.md for what this does to the bits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from graftjax.errors import GraftjaxError
from graftjax.models import cache as cache_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as model_lib
from graftjax.models.gemma import transformer

DATA, MODEL = 'data', 'model'
AXES = (DATA, MODEL)

# Leaf name -> the axis of that leaf split over 'model' (None: replicated).
_MODEL_AXIS = {
  'embedding': 0,
  'q': 1,
  'k': 1,
  'v': 1,
  'o': 0,
  'gate': 1,
  'up': 1,
  'down': 0,
}


class MeshError(GraftjaxError, ValueError):
  """A mesh or a placement that this module cannot use; names the cause."""


def make_mesh(data: int, model: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'model') mesh of data x model devices (default: the first of `jax.devices()`)."""
  devices = list(jax.devices() if devices is None else devices)
  if data * model > len(devices):
    raise MeshError(f'a {data} x {model} mesh needs {data * model} devices, {len(devices)} given')
  grid = np.asarray(devices[: data * model], dtype=object).reshape(data, model)
  return Mesh(grid, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def check_mesh(mesh: Mesh) -> Mesh:
  """`mesh` with Auto axes (XLA's partitioner places what is not pinned).

  Raises:
    MeshError: unless `mesh` has exactly the axes ('data', 'model').
  """
  if tuple(mesh.axis_names) != AXES:
    raise MeshError(f'mesh axes are {tuple(mesh.axis_names)}, expected {AXES}')
  if all(t == AxisType.Auto for t in mesh.axis_types):
    return mesh
  return Mesh(mesh.devices, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def _split(size: int, devices: int) -> bool:
  return devices > 1 and size % devices == 0


def param_spec(name: str, shape: Sequence[int], mesh: Mesh) -> P:
  """The PartitionSpec of the param leaf `name` ('q', 'down', ...) of `shape`."""
  axis = _MODEL_AXIS.get(name)
  spec = [None] * len(shape)
  if axis is not None and _split(shape[axis], mesh.shape[MODEL]):
    spec[axis] = MODEL
  return P(*spec)


def cache_splits_heads(config: config_lib.GemmaConfig, mesh: Mesh) -> bool:
  """Whether the cache's kv heads split over 'model' (else it is replicated there)."""
  return _split(config.num_kv_heads, mesh.shape[MODEL])


def kv_spec(splits_heads: bool, batch: bool) -> P:
  """Spec of cache k/v [L, B, S, K, H]."""
  return P(None, DATA if batch else None, None, MODEL if splits_heads else None, None)


def block_spec(splits_heads: bool) -> P:
  """Spec of a block's k/v [L, n, K, H]: kv heads as in the cache, one batch row."""
  return P(None, None, MODEL if splits_heads else None, None)


def _leaf_name(path: Any) -> str:
  """'q' from ('layers', 3, 'q'), 'layers/3/q', 'layers.3.q' or a jax key path."""
  if isinstance(path, str):
    return path.replace('/', '.').split('.')[-1]
  last = path[-1]
  for attr in ('key', 'name', 'idx'):
    if hasattr(last, attr):
      return str(getattr(last, attr))
  return str(last)


def put(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global jax.Array from a host array every process holds the same of.

  Each process transfers only the slices its own devices hold
  (`jax.make_array_from_callback`), so this works across processes.
  """
  array = np.asarray(array)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def placer(mesh: Mesh, *, dtype=None) -> Callable[[Any, np.ndarray], jax.Array]:
  """`place(path, np_array) -> jax.Array` for a checkpoint loader, one tensor at a time.

  `path` names the leaf as a tuple ('layers', 3, 'q'), a string 'layers.3.q'
  (or with '/'), or a jax key path; its last part picks the spec
  (`param_spec`). The array is cast to `dtype` (if given) on the host and
  only the slices this process's devices hold are transferred.
  """
  mesh = check_mesh(mesh)

  def place(path, array):
    array = np.asarray(array)
    if dtype is not None:
      array = array.astype(jnp.dtype(dtype))
    spec = param_spec(_leaf_name(path), array.shape, mesh)
    return put(array, NamedSharding(mesh, spec))

  return place


def place_params(params, mesh: Mesh):
  """The params pytree placed by `param_spec` (leaves already in their dtype).

  Host arrays and single-process jax arrays go through `placer`; arrays that
  already span several processes (a loader's output) are moved by
  `jax.device_put`, which is a no-op where they are placed already.
  """
  mesh = check_mesh(mesh)
  place = placer(mesh)

  def one(path, a):
    if isinstance(a, jax.Array) and (not a.is_fully_addressable or len(a.devices()) > 1):
      return jax.device_put(a, NamedSharding(mesh, param_spec(_leaf_name(path), a.shape, mesh)))
    return place(path, np.asarray(a))

  return jax.tree_util.tree_map_with_path(one, params)


@dataclasses.dataclass(frozen=True)
class Layout:
  """The shardings of one model's state on one mesh.

  Attributes:
    mesh: a mesh with axes ('data', 'model').
    splits_heads: whether cache k/v split kv heads over 'model'.
    batch: whether batch rows split over 'data' (the data axis divides B).
    ring_layers, ring_window: of a 'ring' cache (`KVCache`): its ring k/v split
      as k/v do, its ring positions and segments as positions do; () and 0 for
      the 'full' layout.
    ring_splits_heads: whether ring k/v split their kv heads (None: as k/v do); differs
      where the ring caches another head count (Gemma 4: 16 sliding, 4 global kv heads).
  """

  mesh: Mesh
  splits_heads: bool
  batch: bool
  ring_layers: tuple[int, ...] = ()
  ring_window: int = 0
  ring_splits_heads: bool | None = None

  def sharding(self, spec: P) -> NamedSharding:
    return NamedSharding(self.mesh, spec)

  @property
  def rows(self) -> NamedSharding:
    """Of tokens / positions / segments [B, T] and cache positions [B, S]."""
    return self.sharding(P(DATA if self.batch else None, None))

  @property
  def replicated(self) -> NamedSharding:
    return self.sharding(P())

  @property
  def cache(self) -> cache_lib.KVCache:
    """A KVCache whose leaves are the shardings of a cache's leaves."""
    kv = self.sharding(kv_spec(self.splits_heads, self.batch))
    ring = {}
    if self.ring_layers:
      ring_splits = self.splits_heads if self.ring_splits_heads is None else self.ring_splits_heads
      ring_kv = self.sharding(kv_spec(ring_splits, self.batch))
      ring = {
        'ring_k': ring_kv,
        'ring_v': ring_kv,
        'ring_positions': self.rows,
        'ring_segments': self.rows,
        'ring_layers': self.ring_layers,
        'ring_window': self.ring_window,
      }
    return cache_lib.KVCache(
      k=kv, v=kv, positions=self.rows, segments=self.rows, length=self.replicated, **ring
    )

  @property
  def block(self) -> NamedSharding:
    """Of a block's k/v [L, n, K, H]."""
    return self.sharding(block_spec(self.splits_heads))


def layout(
  config: config_lib.GemmaConfig,
  mesh: Mesh,
  batch_size: int,
  *,
  ring_layers: tuple[int, ...] = (),
  ring_window: int = 0,
) -> Layout:
  """The layout of `config`'s caches; k/v and a ring each split by their own kv heads (the
  full layers' and the ring's, `config.kv_heads_of`), or, with no ring, by `num_kv_heads`."""
  mesh = check_mesh(mesh)
  full = [i for i in config.cached_layers if i not in ring_layers]
  heads = config.kv_heads_of(full[0]) if ring_layers and full else config.num_kv_heads
  ring_heads = config.kv_heads_of(ring_layers[0]) if ring_layers else heads
  return Layout(
    mesh=mesh,
    splits_heads=_split(heads, mesh.shape[MODEL]),
    batch=_split(batch_size, mesh.shape[DATA]),
    ring_layers=tuple(ring_layers),
    ring_window=ring_window,
    ring_splits_heads=_split(ring_heads, mesh.shape[MODEL]),
  )


@functools.partial(jax.jit, static_argnames=('config', 'logits', 'layout'), donate_argnums=(3,))
def _forward_jit(params, tokens, positions, cache, segments, tables, *, config, logits, layout):
  """`transformer.forward` with its batch inputs and cache pinned to `layout`."""
  pin = jax.lax.with_sharding_constraint
  tokens, positions, segments = (pin(a, layout.rows) for a in (tokens, positions, segments))
  cache = pin(cache, layout.cache)
  out, cache = transformer.forward(
    params,
    tokens,
    positions,
    cache,
    config=config,
    logits=logits,
    tables=tables,
    segments=segments,
  )
  if out is not None:
    out = pin(out, layout.sharding(P(DATA if layout.batch else None)))
  return out, pin(cache, layout.cache)


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedGemma(model_lib.Gemma):
  """A `Gemma` whose params live on `mesh` and whose forward keeps caches sharded.

  Everything else (`prefill`, `graft_target`, `with_impl`, ...) is Gemma's.
  The split changes the last bits (docs/sharding.md), so, as with another
  kernel, a mesh of more than one device gives another fingerprint: a block
  is grafted only under the split it was computed with.
  """

  mesh: Mesh | None = None

  @functools.cached_property
  def fingerprint(self) -> str:
    """Gemma's fingerprint, with the mesh's axis sizes folded in unless it is one device."""
    base = model_lib.Gemma.fingerprint.func(self)
    if self.mesh.size == 1:  # measured: the same bits as unsharded
      return base
    split = f'mesh:{DATA}={self.mesh.shape[DATA]},{MODEL}={self.mesh.shape[MODEL]}'
    return hashlib.sha256(f'{base}\n{split}\n'.encode()).hexdigest()

  def layout(self, batch_size: int) -> Layout:
    """The shardings of this model's caches of `batch_size` rows, in its local layout."""
    ring = self.ring_layers
    window = self.config.sliding_window if ring else 0
    return layout(self.config, self.mesh, batch_size, ring_layers=ring, ring_window=window)

  def init_cache(self, *, batch_size: int = 1, capacity: int) -> cache_lib.KVCache:
    """`Gemma.init_cache`'s cache (its local layout too), made directly in its shards
    (`Layout.cache`)."""
    make = lambda: model_lib.Gemma.init_cache(self, batch_size=batch_size, capacity=capacity)
    return jax.jit(make, out_shardings=self.layout(batch_size).cache)()

  def forward(self, tokens, positions, cache: cache_lib.KVCache, *, logits='all', segment: int = 0):
    """`Gemma.forward` on the mesh: same checks, same arithmetic per shard."""
    tokens = np.asarray(tokens, np.int32)
    positions = np.asarray(positions, np.int32)
    self.check_chunk(tokens, positions, cache)
    lay = self.layout(cache.batch_size)
    return _forward_jit(
      self.params,
      put(tokens, lay.rows),
      put(positions, lay.rows),
      cache,
      put(np.full(tokens.shape, segment, np.int32), lay.rows),
      self.tables,
      config=self.config,
      logits=logits,
      layout=lay,
    )


def load(name: str | None = None, *, mesh: Mesh, dtype=jnp.float32, **kwargs) -> ShardedGemma:
  """`model.load(name, dtype=dtype, **kwargs)` with each tensor placed on `mesh` as it
  is loaded (a checkpoint streams one tensor at a time onto its shards), then sharded."""
  mesh = check_mesh(mesh)
  model = model_lib.load(name, dtype=dtype, place=placer(mesh, dtype=dtype), **kwargs)
  return shard_model(model, mesh)


def shard_model(model: model_lib.Gemma, mesh: Mesh) -> ShardedGemma:
  """`model` with its params placed on `mesh` (see the module docstring)."""
  mesh = check_mesh(mesh)
  fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model_lib.Gemma)}
  fields['params'] = place_params(model.params, mesh)
  return ShardedGemma(**fields, mesh=mesh)


def place_cache(cache: cache_lib.KVCache, model: ShardedGemma) -> cache_lib.KVCache:
  """`cache` moved to the model's cache layout (a no-op where it is there already)."""
  return jax.device_put(cache, model.layout(cache.batch_size).cache)
