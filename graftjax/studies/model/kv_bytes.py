"""KV cache bytes per cached token, full-size vs ring sliding-window layers, from configs alone.

    rows = kv_bytes.table(['tiny', 'gemma3-270m'], capacities=(4096, 32768))

For each config and capacity S: the bytes of one batch row's cache (k, v,
positions and segments, as `Gemma.init_cache` lays them out, shapes taken
with `jax.eval_shape`, nothing allocated; Gemma 4's kv-shared layers cache
nothing, its global layers their own kv heads and head size, and its K=V
layers still two arrays, keys and values differing by their norms and
rotary) under each layout, per cached
token, against the global layers' own bytes; the bytes of a block of as
many tokens, as blocks were (every row of every layer) and compact (what
`blocks.capture` keeps: a global layer's every row, a sliding layer's last
W - 1); and the slots (one row, or tokens over all rows) that fit a device of
`device_bytes` beside the weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import blocks
from graftjax.models import cache as cache_lib
from graftjax.models import target as target_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as model_lib
from graftjax.models.gemma import ops
from graftjax.models.gemma import params as params_lib

DEVICE_BYTES = 80 * 10**9  # an 80 GB accelerator
CAPACITIES = (4096, 8192, 32768, 131072)


def resolve(config: str | config_lib.GemmaConfig) -> tuple[str, config_lib.GemmaConfig]:
  """(name, config) of a config object or a name in `config.NAMED_CONFIGS`."""
  if isinstance(config, config_lib.GemmaConfig):
    return config.digest()[:12], config
  return config, config_lib.get_config(config)


def param_count(config: config_lib.GemmaConfig) -> int:
  """Parameters of the decoder (every tensor of `params.param_specs`; tied embedding once)."""
  return sum(int(np.prod(spec.shape)) for spec in params_lib.param_specs(config))


def ring_layers(config: config_lib.GemmaConfig) -> tuple[int, ...]:
  """The sliding-window layers that cache keys and values."""
  return tuple(i for i in config.cached_layers if config.window(i) is not None)


def global_layers(config: config_lib.GemmaConfig) -> tuple[int, ...]:
  """The global layers that cache keys and values."""
  return tuple(i for i in config.cached_layers if config.window(i) is None)


def ring_capacity(
  config: config_lib.GemmaConfig, capacity: int, *, chunk_size: int, multiple: int
) -> int | None:
  """R of a ring cache, as `Gemma.ring_capacity` computes it, or None without local layers."""
  if not ring_layers(config):
    return None
  return cache_lib.ring_slots(
    capacity, window=config.sliding_window, chunk_size=chunk_size, multiple=multiple
  )


def cache_bytes(
  config: config_lib.GemmaConfig,
  capacity: int,
  *,
  local: str,
  dtype=jnp.bfloat16,
  chunk_size: int = model_lib.DEFAULT_RING_CHUNK,
  multiple: int = ops.CAPACITY_MULTIPLE,
) -> dict[str, int]:
  """{'kv': k and v bytes, 'total': with positions and segments} of one batch row's cache, as
  `Gemma.init_cache` makes it (`multiple`: 1, or the Pallas capacity multiple)."""
  if multiple not in (1, ops.CAPACITY_MULTIPLE):
    raise ValueError(f'multiple must be 1 or {ops.CAPACITY_MULTIPLE}, got {multiple}')
  impl = 'pallas' if multiple == ops.CAPACITY_MULTIPLE else 'xla'
  model = model_lib.Gemma(
    config=config.with_impl(impl),
    params=None,
    dtype=jnp.dtype(dtype),
    params_digest='',
    local_cache=local,
    ring_chunk_size=chunk_size,
  )
  shapes = jax.eval_shape(lambda: model.init_cache(batch_size=1, capacity=capacity))
  nbytes = lambda a: 0 if a is None else int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize
  kv = sum(nbytes(getattr(shapes, name)) for name in ('k', 'v', 'ring_k', 'ring_v'))
  return {'kv': kv, 'total': sum(nbytes(a) for a in jax.tree.leaves(shapes))}


def global_bytes_per_token(config: config_lib.GemmaConfig, dtype=jnp.bfloat16) -> int:
  """K/V bytes per token of the global layers alone (what a window-sized ring approaches)."""
  per_layer = [config.kv_heads_of(i) * config.head_dim_of(i) for i in global_layers(config)]
  return 2 * sum(per_layer) * jnp.dtype(dtype).itemsize


def block_bytes(config: config_lib.GemmaConfig, n: int, dtype=jnp.bfloat16) -> dict[str, int]:
  """{'full', 'compact'}: bytes of a block of n tokens (k, v and int32 positions) holding every
  row of every cached layer (block layout 3), and holding the rows `blocks.capture` keeps (the
  tail rows `blocks.kept_rows` gives for the model's windows)."""
  itemsize = jnp.dtype(dtype).itemsize
  layers = config.cached_layers
  row = [2 * config.kv_heads_of(i) * config.head_dim_of(i) * itemsize for i in layers]
  target = target_lib.GraftTarget(
    fingerprint='',
    position_scheme=config.position_scheme,
    dtype=jnp.dtype(dtype).name,
    kernels=(),
    chunk_invariant=False,
    windows=tuple(config.window(i) for i in layers),
  )
  tail, rows = blocks.kept_rows(target, len(layers), n)
  kept = [rows if j in tail else n for j in range(len(layers))]
  return {
    'full': n * sum(row) + 4 * n,
    'compact': sum(r * b for r, b in zip(kept, row)) + 4 * n,
  }


def fitting_slots(
  config: config_lib.GemmaConfig,
  *,
  local: str,
  free_bytes: int,
  dtype=jnp.bfloat16,
  chunk_size: int = model_lib.DEFAULT_RING_CHUNK,
  multiple: int = ops.CAPACITY_MULTIPLE,
) -> int:
  """The largest capacity S (a multiple of `multiple`) whose cache fits `free_bytes`."""
  kwargs = dict(local=local, dtype=dtype, chunk_size=chunk_size, multiple=multiple)
  fits = lambda s: cache_bytes(config, s * multiple, **kwargs)['total'] <= free_bytes
  if not fits(1):
    return 0
  lo, hi = 1, 2
  while fits(hi):
    lo, hi = hi, hi * 2
  while hi - lo > 1:  # cache bytes grow with S: bisect
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
  return lo * multiple


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every row of the table assumes."""

  dtype: str = 'bfloat16'
  chunk_size: int = model_lib.DEFAULT_RING_CHUNK
  multiple: int = ops.CAPACITY_MULTIPLE
  device_bytes: int = DEVICE_BYTES


def config_rows(
  name: str, config: config_lib.GemmaConfig, capacities: Iterable[int], settings: Settings
) -> dict[str, Any]:
  """One config's entry: its sizes, weights, per-capacity bytes and the slots that fit."""
  dtype = jnp.dtype(settings.dtype)
  sizes = dict(dtype=dtype, chunk_size=settings.chunk_size, multiple=settings.multiple)
  weights = param_count(config) * dtype.itemsize
  free = settings.device_bytes - weights
  glob = global_bytes_per_token(config, dtype)
  per_capacity = []
  for capacity in capacities:
    row = {'capacity': capacity}
    for local in cache_lib.LOCAL_LAYOUTS:
      b = cache_bytes(config, capacity, local=local, **sizes)
      row[local] = {
        'cache_bytes': b['total'],
        'kv_bytes': b['kv'],
        'kv_bytes_per_token': b['kv'] / capacity,
        'kv_vs_global_layers': b['kv'] / capacity / glob if glob else None,
      }
    row['ring_capacity'] = ring_capacity(
      config, capacity, chunk_size=settings.chunk_size, multiple=settings.multiple
    )
    row['full_over_ring'] = row['full']['kv_bytes'] / row['ring']['kv_bytes']
    row['block_bytes'] = block_bytes(config, capacity, dtype)
    per_capacity.append(row)
  slots = {
    local: (fitting_slots(config, local=local, free_bytes=free, **sizes) if free > 0 else 0)
    for local in cache_lib.LOCAL_LAYOUTS
  }
  return {
    'name': name,
    'config_digest': config.digest(),
    'layers': config.num_layers,
    'global_layers': sum(config.window(i) is None for i in range(config.num_layers)),
    'kv_heads': config.num_kv_heads,
    'head_dim': config.head_dim,
    **_gemma4_entry(config),
    'sliding_window': config.sliding_window,
    'parameters': param_count(config),
    'weight_bytes': weights,
    'global_kv_bytes_per_token': glob,
    'full_kv_bytes_per_token': cache_bytes(config, settings.multiple, local='full', **sizes)['kv']
    / settings.multiple,
    'capacities': per_capacity,
    'slots_that_fit': slots,
  }


def _gemma4_entry(config: config_lib.GemmaConfig) -> dict[str, Any]:
  """What a Gemma 4 config adds to its entry (nothing for Gemma 3, whose entries stay)."""
  if config.uniform_kv and not config.num_kv_shared_layers:
    return {}
  glob = global_layers(config)
  return {
    'cached_layers': len(config.cached_layers),
    'global_kv_heads': config.kv_heads_of(glob[0]),
    'global_head_dim': config.head_dim_of(glob[0]),
    'k_eq_v': config.attention_k_eq_v,
  }


def table(
  configs: Sequence[str | config_lib.GemmaConfig],
  *,
  capacities: Iterable[int] = CAPACITIES,
  settings: Settings = Settings(),
) -> dict[str, Any]:
  """The settings and one entry per config (`config_rows`)."""
  capacities = tuple(capacities)
  bad = [c for c in capacities if c <= 0 or c % settings.multiple]
  if bad:
    raise ValueError(f'capacities {bad} are not positive multiples of {settings.multiple}')
  return {
    'settings': dataclasses.asdict(settings),
    'configs': [config_rows(*resolve(c), capacities, settings) for c in configs],
  }


def experiment(
  configs: Sequence[str | config_lib.GemmaConfig],
  *,
  capacities: Iterable[int] = CAPACITIES,
  settings: Settings = Settings(),
) -> dict[str, Any]:
  """The result: `results.header` (each config's digest as input) and `table`."""
  from graftjax.studies.common import results

  named = [resolve(c) for c in configs]
  result = results.header(
    'kv_bytes', inputs={'config_digests': {name: config.digest() for name, config in named}}
  )
  body = table([config for _, config in named], capacities=capacities, settings=settings)
  for entry, (name, _) in zip(body['configs'], named):
    entry['name'] = name
  result.update(body)
  return result


def markdown(result: dict[str, Any]) -> str:
  """The result as a markdown table: one row per config and capacity."""
  settings = result['settings']
  lines = [
    f'KV cache bytes per cached token ({settings["dtype"]}, one batch row; rings take chunks of'
    f' up to {settings["chunk_size"]} tokens, R rounded to {settings["multiple"]}). "vs global":'
    " against the global layers' own bytes per token. Block: a block of capacity tokens,"
    ' every row of every layer (full) or the rows a continuation sees (compact). Slots: the'
    f' capacity whose cache fits {settings["device_bytes"] / 1e9:g} GB beside the weights.',
    '',
    '| config | capacity | ring R | full B/token | ring B/token | full vs global'
    ' | ring vs global | full / ring | block, full | block, compact |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  ]
  for entry in result['configs']:
    for row in entry['capacities']:
      full, ring = row['full'], row['ring']
      lines.append(
        f'| {entry["name"]} | {row["capacity"]:,} | {row["ring_capacity"] or "-"}'
        f' | {full["kv_bytes_per_token"]:,.0f} | {ring["kv_bytes_per_token"]:,.0f}'
        f' | {full["kv_vs_global_layers"]:.3f} | {ring["kv_vs_global_layers"]:.3f}'
        f' | {row["full_over_ring"]:.2f} | {_size(row["block_bytes"]["full"])}'
        f' | {_size(row["block_bytes"]["compact"])} |'
      )
  lines += ['', '| config | weights (GB) | slots that fit, full | slots that fit, ring |']
  lines.append('| --- | ---: | ---: | ---: |')
  for entry in result['configs']:
    slots = entry['slots_that_fit']
    lines.append(
      f'| {entry["name"]} | {entry["weight_bytes"] / 1e9:.2f} | {slots["full"]:,}'
      f' | {slots["ring"]:,} |'
    )
  return '\n'.join(lines) + '\n'


def _size(nbytes: int) -> str:
  """Bytes for a table: in GB from 1 GB, else MB."""
  return f'{nbytes / 1e9:.2f} GB' if nbytes >= 1e9 else f'{nbytes / 1e6:.2f} MB'
