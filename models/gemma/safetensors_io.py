"""Hugging Face safetensors checkpoints of Gemma 3 and Gemma 4: load (streamed) and export.

A checkpoint is a `model.safetensors`, or shards listed by
`model.safetensors.index.json`, with a `config.json` beside it. Tensor names
are transformers' (`Gemma3ForCausalLM`, `model.` prefix), or those of the text
model inside `Gemma3ForConditionalGeneration` (`language_model.model.` or
`model.language_model.`); other tensors (the vision tower) are ignored.

    HF name (under the prefix)              shape        ours
    embed_tokens.weight                     [V, D]       embedding
    norm.weight                             [D]          final_norm - 1
    layers.i.input_layernorm.weight         [D]          attn_norm - 1
    layers.i.post_attention_layernorm       [D]          post_attn_norm - 1
    layers.i.pre_feedforward_layernorm      [D]          ffn_norm - 1
    layers.i.post_feedforward_layernorm     [D]          post_ffn_norm - 1
    layers.i.self_attn.q_proj.weight        [N*H, D]     q [D, N, H]
    layers.i.self_attn.{k,v}_proj.weight    [K*H, D]     k, v [D, K, H]
    layers.i.self_attn.o_proj.weight        [D, N*H]     o [N, H, D]
    layers.i.self_attn.{q,k}_norm.weight    [H]          q_norm, k_norm - 1
    layers.i.mlp.{gate,up}_proj.weight      [F, D]       gate, up [D, F]
    layers.i.mlp.down_proj.weight           [D, F]       down [F, D]

(transformers stores Gemma 3's norm weights without Gemma's +1; it adds 1 in
float32 at run time, as the loader does.)

Gemma 4 (`Gemma4ForCausalLM`, or the text model of
`Gemma4ForConditionalGeneration` under `model.language_model.`; its vision and
audio towers are ignored) keeps these names, its norm weights as they act (no
+1), and adds:

    layers.i.layer_scalar                   [1]          layer_scalar
    layers.i.per_layer_input_gate.weight    [P, D]       pl_gate [D, P]
    layers.i.per_layer_projection.weight    [D, P]       pl_proj [P, D]
    layers.i.post_per_layer_input_norm      [D]          pl_norm
    layers.i.router.scale                   [D]          router_scale
    layers.i.router.proj.weight             [E, D]       router [D, E]
    layers.i.router.per_expert_scale        [E]          expert_scale
    layers.i.experts.gate_up_proj           [E, 2X, D]   experts_gate_up [E, D, 2X]
    layers.i.experts.down_proj              [E, D, X]    experts_down [E, X, D]
    layers.i.pre_feedforward_layernorm_2    [D]          ffn_norm_2
    layers.i.post_feedforward_layernorm_{1,2} [D]        post_ffn_norm_{1,2}
    embed_tokens_per_layer.weight           [V, L*P]     per_layer_embedding
    per_layer_model_projection.weight       [L*P, D]     per_layer_projection [D, L*P]
    per_layer_projection_norm.weight        [P]          per_layer_norm

A kv-shared layer's key/value tensors, which some checkpoints still hold, are
skipped as transformers skips them.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import numpy as np

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import hf_config
from graftjax.models.gemma import params as params_lib

SINGLE_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'
CONFIG_FILE = 'config.json'
PREFIXES = ('model.', 'language_model.model.', 'model.language_model.')

_LAYER_NAMES = {
  'attn_norm': 'input_layernorm',
  'post_attn_norm': 'post_attention_layernorm',
  'ffn_norm': 'pre_feedforward_layernorm',
  'post_ffn_norm': 'post_feedforward_layernorm',
  'q': 'self_attn.q_proj',
  'k': 'self_attn.k_proj',
  'v': 'self_attn.v_proj',
  'o': 'self_attn.o_proj',
  'q_norm': 'self_attn.q_norm',
  'k_norm': 'self_attn.k_norm',
  'gate': 'mlp.gate_proj',
  'up': 'mlp.up_proj',
  'down': 'mlp.down_proj',
  'pl_gate': 'per_layer_input_gate',
  'pl_proj': 'per_layer_projection',
  'pl_norm': 'post_per_layer_input_norm',
  'router': 'router.proj',
  'ffn_norm_2': 'pre_feedforward_layernorm_2',
  'post_ffn_norm_1': 'post_feedforward_layernorm_1',
  'post_ffn_norm_2': 'post_feedforward_layernorm_2',
}
# Tensors named without '.weight' (parameters and buffers, not modules).
_LAYER_PARAMS = {
  'layer_scalar': 'layer_scalar',
  'router_scale': 'router.scale',
  'expert_scale': 'router.per_expert_scale',
  'experts_gate_up': 'experts.gate_up_proj',
  'experts_down': 'experts.down_proj',
}
_TOP_NAMES = {
  'embedding': 'embed_tokens.weight',
  'final_norm': 'norm.weight',
  'per_layer_embedding': 'embed_tokens_per_layer.weight',
  'per_layer_projection': 'per_layer_model_projection.weight',
  'per_layer_norm': 'per_layer_projection_norm.weight',
}
# Ours [.., a, b] is HF's [.., b, a].
_TRANSPOSED = (
  'gate',
  'up',
  'down',
  'pl_gate',
  'pl_proj',
  'router',
  'experts_gate_up',
  'experts_down',
  'per_layer_projection',
)
# Of a kv-shared layer: skipped if a checkpoint holds them.
_SHARED_SKIPPED = ('k_proj', 'v_proj', 'k_norm', 'v_norm')


def hf_name(spec: params_lib.ParamSpec) -> str:
  """The tensor's name under the text model's prefix (e.g. 'layers.3.self_attn.q_proj.weight')."""
  if spec.key[0] == 'layers':
    name = spec.key[2]
    if name in _LAYER_PARAMS:
      return f'layers.{spec.key[1]}.{_LAYER_PARAMS[name]}'
    return f'layers.{spec.key[1]}.{_LAYER_NAMES[name]}.weight'
  return _TOP_NAMES[spec.key[0]]


def hf_shape(spec: params_lib.ParamSpec) -> tuple[int, ...]:
  """The tensor's shape in HF's layout."""
  name = spec.key[-1]
  if name in ('q', 'k', 'v'):
    d, heads, h = spec.shape
    return (heads * h, d)
  if name == 'o':
    heads, h, d = spec.shape
    return (d, heads * h)
  if name in _TRANSPOSED:
    return tuple(spec.shape[:-2]) + (spec.shape[-1], spec.shape[-2])
  return tuple(spec.shape)


def _swap_last(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(np.swapaxes(x, -1, -2))


def to_ours(spec: params_lib.ParamSpec, value: np.ndarray, *, plus_one: bool = True) -> np.ndarray:
  """An HF tensor in our layout, float32 (Gemma 3's norms + 1 where `plus_one`, in float32
  as transformers adds it; Gemma 4 stores them as they act)."""
  x = np.asarray(value).astype(np.float32)
  name = spec.key[-1]
  if spec.is_norm:
    return x + np.float32(1.0) if plus_one else x
  if name in ('q', 'k', 'v'):
    d, heads, h = spec.shape
    return np.ascontiguousarray(x.reshape(heads, h, d).transpose(2, 0, 1))
  if name == 'o':
    heads, h, d = spec.shape
    return np.ascontiguousarray(x.reshape(d, heads, h).transpose(1, 2, 0))
  if name in _TRANSPOSED:
    return _swap_last(x)
  return x


def from_ours(
  spec: params_lib.ParamSpec, value: np.ndarray, *, plus_one: bool = True
) -> np.ndarray:
  """Our tensor (float32) in HF's layout; `to_ours` gives back the same bits.

  Raises:
    CheckpointError: if a norm weight w has no float32 v with v + 1 == w (HF
      cannot store it).
  """
  x = np.asarray(value, np.float32)
  name = spec.key[-1]
  if spec.is_norm and not plus_one:
    return x
  if spec.is_norm:
    hf = x - np.float32(1.0)
    bad = np.flatnonzero(hf + np.float32(1.0) != x)
    if bad.size:
      raise params_lib.CheckpointError(
        f'{spec.name}[{bad[0]}] = {x.flat[bad[0]]!r} has no exact form as (weight - 1) in float32'
      )
    return hf
  if name in ('q', 'k', 'v'):
    return np.ascontiguousarray(x.transpose(1, 2, 0).reshape(-1, x.shape[0]))
  if name == 'o':
    return np.ascontiguousarray(x.transpose(2, 0, 1).reshape(x.shape[2], -1))
  if name in _TRANSPOSED:
    return _swap_last(x)
  return x


def _read_json(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise params_lib.CheckpointError(f'{path}: cannot read JSON ({e})') from None
  except RecursionError:
    raise params_lib.CheckpointError(f'{path}: cannot read JSON (nested too deeply)') from None


class _Reader:
  """Opens the checkpoint's files lazily; finds one tensor by full name."""

  def __init__(self, path: pathlib.Path):
    import safetensors

    self._open, self._errors = safetensors.safe_open, (OSError, safetensors.SafetensorError)
    self._handles: dict[pathlib.Path, object] = {}
    if path.is_file():
      files = {path}
      self.where = {name: path for name in self._handle(path).keys()}  # noqa: SIM118 (a safe_open handle)
    elif (path / INDEX_FILE).exists():
      weight_map = _read_json(path / INDEX_FILE).get('weight_map')
      if not isinstance(weight_map, dict):
        raise params_lib.CheckpointError(f'{path / INDEX_FILE}: no weight_map')
      bad = [f for f in weight_map.values() if not isinstance(f, str) or pathlib.Path(f).name != f]
      if bad:
        raise params_lib.CheckpointError(
          f'{path / INDEX_FILE}: shard {bad[0]!r} is not a file name in the folder'
        )
      self.where = {name: path / file for name, file in weight_map.items()}
      files = set(self.where.values())
    elif (path / SINGLE_FILE).exists():
      files = {path / SINGLE_FILE}
      self.where = {name: path / SINGLE_FILE for name in self._handle(path / SINGLE_FILE).keys()}  # noqa: SIM118
    else:
      raise params_lib.CheckpointError(
        f'{path}: no {SINGLE_FILE} or {INDEX_FILE} (not a safetensors checkpoint)'
      )
    missing = sorted(str(f) for f in files if not f.exists())
    if missing:
      raise params_lib.CheckpointError(f'{path}: shard files missing: {missing}')

  def _handle(self, file: pathlib.Path):
    if file not in self._handles:
      try:
        self._handles[file] = self._open(str(file), framework='np')
      except self._errors as e:
        raise params_lib.CheckpointError(f'{file}: not a safetensors file ({e})') from None
    return self._handles[file]

  def shape(self, name: str) -> tuple[int, ...]:
    try:
      return tuple(self._handle(self.where[name]).get_slice(name).get_shape())
    except self._errors as e:
      raise params_lib.CheckpointError(f'{self.where[name]}: tensor {name}: {e}') from None

  def read(self, name: str) -> np.ndarray:
    try:
      return self._handle(self.where[name]).get_tensor(name)
    except self._errors as e:
      raise params_lib.CheckpointError(f'{self.where[name]}: tensor {name}: {e}') from None


def _prefix(names, source: str) -> str:
  for prefix in PREFIXES:
    if f'{prefix}embed_tokens.weight' in names:
      return prefix
  raise params_lib.CheckpointError(
    f'{source}: no embed_tokens.weight under any of {PREFIXES} (not a Gemma checkpoint)'
  )


def read_config(path: str | os.PathLike) -> config_lib.GemmaConfig | None:
  """The config of the checkpoint at `path` (its config.json), or None if it has none."""
  path = pathlib.Path(path)
  file = (path.parent if path.is_file() else path) / CONFIG_FILE
  return hf_config.config_from_hf(_read_json(file)) if file.exists() else None


def load(
  path: str | os.PathLike,
  config: config_lib.GemmaConfig,
  *,
  place: params_lib.Place,
) -> tuple[dict, str]:
  """Streams a safetensors checkpoint into params, one tensor at a time.

  Each tensor is read, converted to our layout in float32, added to the
  digest, handed to `place` (which casts and puts it on its devices) and
  dropped: host memory holds one tensor at a time.

  Args:
    path: a `.safetensors` file, or a folder with one or with an index.
    config: the architecture the tensors must have.
    place: (name, float32 numpy value) -> placed array (`model.load` casts
      the value to its dtype first).
  Returns:
    (params pytree, the float32 weights' digest, equal to
    `checkpoint.params_digest` of the same weights).
  Raises:
    CheckpointError: a tensor missing, of another shape, or left over,
      named.
  """
  path = pathlib.Path(path)
  reader = _Reader(path)
  prefix = _prefix(reader.where, str(path))
  text_names = {n for n in reader.where if n.startswith(prefix)}
  for layer in range(config.num_layers):
    if config.kv_source(layer) != layer:
      for skipped in _SHARED_SKIPPED:
        text_names.difference_update(
          n for n in list(text_names) if n.startswith(f'{prefix}layers.{layer}.self_attn.{skipped}')
        )
  plus_one = not hf_config.is_gemma4(config)
  params = params_lib.Streamed(config, place)
  for spec in params_lib.param_specs(config):
    name = prefix + hf_name(spec)
    if name not in reader.where:
      raise params_lib.CheckpointError(f'{path}: tensor {name} missing (needed for {spec.name})')
    text_names.discard(name)
    params_lib.check_shape(str(path), name, reader.shape(name), hf_shape(spec), spec)
    raw = reader.read(name)
    params_lib.check_float(name, raw, str(path))
    params.put(spec, to_ours(spec, raw, plus_one=plus_one))
    del raw
  params_lib.refuse_unused(str(path), text_names)
  return params.result()


def save(
  params,
  config: config_lib.GemmaConfig,
  directory: str | os.PathLike,
  *,
  max_shard_bytes: int | None = None,
) -> pathlib.Path:
  """Writes params as a float32 `Gemma3ForCausalLM` (or `Gemma4ForCausalLM`) checkpoint that
  `load` reads back bit-equal.

  Args:
    params: the params pytree (float32 values, numpy or jax).
    config: its architecture (written as config.json).
    directory: created if needed; must not hold a checkpoint already.
    max_shard_bytes: if set, shards of at most this many bytes (one tensor
      per shard at least) and an index; else one `model.safetensors`.
      Host memory holds one shard's tensors at a time.
  Returns:
    The directory.
  """
  from safetensors.numpy import save_file

  directory = pathlib.Path(directory)
  if directory.exists() and not directory.is_dir():
    raise params_lib.CheckpointError(f'{directory} is a file, not a folder')
  directory.mkdir(parents=True, exist_ok=True)
  if any((directory / f).exists() for f in (SINGLE_FILE, INDEX_FILE)):
    raise params_lib.CheckpointError(f'{directory} already holds a checkpoint')
  (directory / CONFIG_FILE).write_text(json.dumps(hf_config.config_to_hf(config), indent=2))
  specs = params_lib.param_specs(config)
  plus_one = not hf_config.is_gemma4(config)
  written: list[tuple[str, list[str]]] = []  # (file, its tensor names)

  def write(shard: dict[str, np.ndarray]) -> None:
    name = SINGLE_FILE if max_shard_bytes is None else f'part-{len(written):05d}.safetensors'
    save_file(shard, str(directory / name), metadata={'format': 'pt'})
    written.append((name, list(shard)))

  shard, shard_bytes = {}, 0
  for spec in specs:
    value = from_ours(spec, np.asarray(_leaf(params, spec.key), np.float32), plus_one=plus_one)
    if max_shard_bytes is not None and shard and shard_bytes + value.nbytes > max_shard_bytes:
      write(shard)
      shard, shard_bytes = {}, 0
    shard['model.' + hf_name(spec)] = value
    shard_bytes += value.nbytes
  write(shard)
  if max_shard_bytes is not None:
    weight_map = {}
    for i, (name, tensors) in enumerate(written):
      final = f'model-{i + 1:05d}-of-{len(written):05d}.safetensors'
      os.replace(directory / name, directory / final)
      weight_map.update(dict.fromkeys(tensors, final))
    index = {
      'metadata': {'total_size': sum(math.prod(s.shape) * 4 for s in specs)},
      'weight_map': weight_map,
    }
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
  return directory


def _leaf(params, key: tuple):
  node = params
  for part in key:
    node = node[part]
  return node
