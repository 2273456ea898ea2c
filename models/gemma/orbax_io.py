"""google-deepmind/gemma orbax checkpoints of Gemma 3: load (streamed) and export.

The gemma library saves params either flat (`'transformer/layer_0/attn/q_einsum':
{'w': ...}`, as its released checkpoints are) or nested (`{'layer_0': {'attn':
...}}`, with or without the 'transformer' level). Both are read; names below
are relative to the transformer:

    embedder/input_embedding          [V, D]          embedding
    final_norm/scale                  [D]             final_norm - 1
    layer_i/pre_attention_norm/scale  [D]             attn_norm - 1
    layer_i/post_attention_norm/scale [D]             post_attn_norm - 1
    layer_i/pre_ffw_norm/scale        [D]             ffn_norm - 1
    layer_i/post_ffw_norm/scale       [D]             post_ffn_norm - 1
    layer_i/attn/q_einsum/w           [N, D, H]       q [D, N, H]
    layer_i/attn/kv_einsum/w          [2, K, D, H]    k, v [D, K, H]
    layer_i/attn/qkv_einsum/w         [3, N, D, H]    q, k, v (when K == N)
    layer_i/attn/attn_vec_einsum/w    [N, H, D]       o
    layer_i/attn/_query_norm/scale    [H]             q_norm - 1 (likewise _key_norm)
    layer_i/mlp/gating_einsum(/w)     [2, F, D]       gate, up [D, F]
    layer_i/mlp/linear(/w)            [F, D]          down

Tensors are restored one at a time (orbax partial restore); a tensor holding
two of ours (kv, gating) is kept until both are taken, within one layer.
"""

from __future__ import annotations

import json
import os
import pathlib

import jax
import numpy as np

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import hf_config
from graftjax.models.gemma import params as params_lib

_MARKERS = ('_METADATA', '_CHECKPOINT_METADATA', 'manifest.ocdbt', 'checkpoint')
CONFIG_FILE = 'config.json'
_NORMS = {
  'attn_norm': 'pre_attention_norm/scale',
  'post_attn_norm': 'post_attention_norm/scale',
  'ffn_norm': 'pre_ffw_norm/scale',
  'post_ffn_norm': 'post_ffw_norm/scale',
  'q_norm': 'attn/_query_norm/scale',
  'k_norm': 'attn/_key_norm/scale',
}


def is_orbax(path: str | os.PathLike) -> bool:
  """Whether `path` is an orbax checkpoint folder."""
  path = pathlib.Path(path)
  return path.is_dir() and any((path / m).exists() for m in _MARKERS)


def _source(
  spec: params_lib.ParamSpec, num_kv_heads: int, num_heads: int
) -> tuple[str, int | None]:
  """(gemma name relative to the transformer, index in its leading axis or None)."""
  if spec.key == ('embedding',):
    return 'embedder/input_embedding', None
  if spec.key == ('final_norm',):
    return 'final_norm/scale', None
  layer, name = f'layer_{spec.key[1]}', spec.key[2]
  if name in _NORMS:
    return f'{layer}/{_NORMS[name]}', None
  fused_qkv = num_kv_heads == num_heads
  table = {
    'q': (f'{layer}/attn/qkv_einsum/w', 0) if fused_qkv else (f'{layer}/attn/q_einsum/w', None),
    'k': (f'{layer}/attn/qkv_einsum/w', 1) if fused_qkv else (f'{layer}/attn/kv_einsum/w', 0),
    'v': (f'{layer}/attn/qkv_einsum/w', 2) if fused_qkv else (f'{layer}/attn/kv_einsum/w', 1),
    'o': (f'{layer}/attn/attn_vec_einsum/w', None),
    'gate': (f'{layer}/mlp/gating_einsum', 0),
    'up': (f'{layer}/mlp/gating_einsum', 1),
    'down': (f'{layer}/mlp/linear', None),
  }
  return table[name]


def _source_shape(spec: params_lib.ParamSpec) -> tuple[int, ...]:
  """Shape of the gemma tensor (of its slice, for a fused one)."""
  name = spec.key[-1]
  if name in ('q', 'k', 'v'):
    d, heads, h = spec.shape
    return (heads, d, h)
  if name in ('gate', 'up'):
    return tuple(reversed(spec.shape))
  return tuple(spec.shape)  # o [N, H, D], down [F, D], norms, embedding


def _to_ours(spec: params_lib.ParamSpec, x: np.ndarray) -> np.ndarray:
  x = np.asarray(x).astype(np.float32)
  name = spec.key[-1]
  if spec.is_norm:
    return x + np.float32(1.0)
  if name in ('q', 'k', 'v'):
    return np.ascontiguousarray(x.transpose(1, 0, 2))
  if name in ('gate', 'up'):
    return np.ascontiguousarray(x.T)
  return x


def _from_ours(spec: params_lib.ParamSpec, x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  name = spec.key[-1]
  if spec.is_norm:
    scale = x - np.float32(1.0)
    bad = np.flatnonzero(scale + np.float32(1.0) != x)
    if bad.size:
      raise params_lib.CheckpointError(
        f'{spec.name}[{bad[0]}] = {x.flat[bad[0]]!r} has no exact form as (scale + 1) in float32'
      )
    return scale
  if name in ('q', 'k', 'v'):
    return np.ascontiguousarray(x.transpose(1, 0, 2))
  if name in ('gate', 'up'):
    return np.ascontiguousarray(x.T)
  return x


def _flat_metadata(tree, prefix: str = '') -> dict[str, tuple[tuple, tuple[int, ...]]]:
  """'/'-joined name (relative to the transformer) -> (key path in the tree, shape)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(
    tree, is_leaf=lambda x: hasattr(x, 'shape')
  )[0]:
    keys = tuple(p.key for p in path)
    name = '/'.join(str(k) for k in keys)
    name = name.removeprefix('transformer/')
    if name.endswith(('/mlp/gating_einsum/w', '/mlp/linear/w')):
      name = name[: -len('/w')]  # flat checkpoints keep the old 'w' level
    out[name] = (keys, tuple(leaf.shape))
  return out


class _Reader:
  """Restores one tensor at a time from an orbax checkpoint."""

  def __init__(self, path: pathlib.Path):
    import orbax.checkpoint as ocp

    self._ocp, self.path = ocp, path
    self._ckpt = ocp.PyTreeCheckpointer()
    try:
      meta = self._ckpt.metadata(path)
    except Exception as e:  # noqa: BLE001 (orbax raises many types for an unreadable folder)
      raise params_lib.CheckpointError(f'{path}: cannot read orbax metadata ({e})') from None
    item = getattr(meta, 'item_metadata', meta)
    tree = getattr(item, 'tree', item)
    if not isinstance(tree, dict) or not tree:
      raise params_lib.CheckpointError(f'{path}: no readable orbax params tree in its metadata')
    self.tensors = _flat_metadata(tree)

  def read(self, name: str) -> np.ndarray:
    keys = self.tensors[name][0]
    item: dict = {}
    node = item
    for k in keys[:-1]:
      node = node.setdefault(k, {})
    node[keys[-1]] = 0
    restore_args = jax.tree.map(lambda _: self._ocp.RestoreArgs(restore_type=np.ndarray), item)
    args = self._ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    try:
      out = self._ckpt.restore(self.path, args=args)
    except Exception as e:  # noqa: BLE001 (orbax and tensorstore raise many types)
      raise params_lib.CheckpointError(f'{self.path}: cannot read tensor {name} ({e})') from None
    for k in keys:
      out = out[k]
    return np.asarray(out)


def vocab_size(path: str | os.PathLike) -> int:
  """Rows of the checkpoint's embedding table (the gemma library keeps 262,144 at 4B and up)."""
  reader = _Reader(pathlib.Path(path))
  if 'embedder/input_embedding' not in reader.tensors:
    raise params_lib.CheckpointError(f'{path}: tensor embedder/input_embedding missing')
  return reader.tensors['embedder/input_embedding'][1][0]


def load(
  path: str | os.PathLike,
  config: config_lib.GemmaConfig,
  *,
  place: params_lib.Place,
) -> tuple[dict, str]:
  """Streams a gemma orbax checkpoint into params (see `safetensors_io.load`).

  Returns:
    (params pytree, digest of the float32 weights, equal to
    `checkpoint.params_digest` of the same weights).
  Raises:
    CheckpointError: a tensor missing, of another shape, or left over,
      named.
  """
  path = pathlib.Path(path)
  reader = _Reader(path)
  if any(n.startswith('stacked_layers') for n in reader.tensors):
    raise params_lib.CheckpointError(
      f'{path}: a stacked-layers checkpoint; save it in the gemma library flat or nested layout'
    )
  unused = {n for n in reader.tensors if not n.startswith(('vision_encoder', 'SigLiP'))}
  unused = {n for n in unused if not n.startswith('embedder/mm_')}
  params = params_lib.Streamed(config, place)
  held: dict[str, np.ndarray] = {}  # fused tensors of the current layer
  for spec in params_lib.param_specs(config):
    name, index = _source(spec, config.num_kv_heads, config.num_heads)
    if name not in reader.tensors:
      raise params_lib.CheckpointError(f'{path}: tensor {name} missing (needed for {spec.name})')
    unused.discard(name)
    want = _source_shape(spec)
    shape = reader.tensors[name][1]
    if index is not None:
      parts = 3 if name.endswith('qkv_einsum/w') else 2
      params_lib.check_shape(str(path), name, shape, (parts, *want), spec)
      if name not in held:
        held.clear()
        held[name] = reader.read(name)
        params_lib.check_float(name, held[name], str(path))
      value = _to_ours(spec, held[name][index])
    else:
      params_lib.check_shape(str(path), name, shape, want, spec)
      raw = reader.read(name)
      params_lib.check_float(name, raw, str(path))
      value = _to_ours(spec, raw)
      del raw
    params.put(spec, value)
    del value
  params_lib.refuse_unused(str(path), unused)
  return params.result()


def save(params, config: config_lib.GemmaConfig, directory: str | os.PathLike) -> pathlib.Path:
  """Writes params in the gemma library's flat layout, with a config.json beside.

  Holds one converted copy of the params while orbax writes (an exporter for
  tests and small models).
  """
  import orbax.checkpoint as ocp

  directory = pathlib.Path(directory)
  if directory.exists() and not directory.is_dir():
    raise params_lib.CheckpointError(f'{directory} is a file, not a folder')
  if directory.exists() and any(directory.iterdir()):
    raise params_lib.CheckpointError(f'{directory} exists and is not empty')
  flat: dict[str, dict[str, np.ndarray]] = {}
  fused: dict[str, dict[int, np.ndarray]] = {}
  for spec in params_lib.param_specs(config):
    node = params
    for part in spec.key:
      node = node[part]
    name, index = _source(spec, config.num_kv_heads, config.num_heads)
    value = _from_ours(spec, np.asarray(node, np.float32))
    if index is not None:
      fused.setdefault(name, {})[index] = value
      continue
    group, leaf = _split(name)
    flat.setdefault(f'transformer/{group}', {})[leaf] = value
  for name, parts in fused.items():
    group, leaf = _split(name)
    flat.setdefault(f'transformer/{group}', {})[leaf] = np.stack([parts[i] for i in sorted(parts)])
  ocp.PyTreeCheckpointer().save(directory, flat)
  (directory / CONFIG_FILE).write_text(json.dumps(hf_config.config_to_hf(config), indent=2))
  return directory


def _split(name: str) -> tuple[str, str]:
  """The flat layout's (module path, leaf name): MLP weights keep the 'w' level there."""
  if name.endswith(('/mlp/gating_einsum', '/mlp/linear')):
    return name, 'w'
  group, leaf = name.rsplit('/', 1)
  return group, leaf
