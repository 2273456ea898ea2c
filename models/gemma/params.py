"""The params pytree as a list of named tensors: what loaders stream, one at a time.

A tensor is named by its path in the pytree of `transformer.py`, as
`jax.tree_util.keystr` writes it (`"['layers'][3]['q']"`), and specs come in
the pytree's own flattening order, so a digest taken while streaming equals
`checkpoint.params_digest` of the assembled tree.

    for spec in param_specs(config):
      tree_put(tree, spec, place(spec.name, value))
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from graftjax.errors import GraftjaxError
from graftjax.models.gemma import config as config_lib

# Places one tensor: (name, value in the target dtype: numpy from a checkpoint,
# a jax array for random weights) -> the array on its device(s).
Place = Callable[[str, Any], jax.Array]

LAYER_NORMS = ('attn_norm', 'post_attn_norm', 'ffn_norm', 'post_ffn_norm', 'q_norm', 'k_norm')
# Gemma 4's other weights that multiply (near 1): norms, the layer scalar, the router's scales.
GEMMA4_SCALES = (
  'pl_norm',
  'ffn_norm_2',
  'post_ffn_norm_1',
  'post_ffn_norm_2',
  'layer_scalar',
  'router_scale',
  'expert_scale',
)


class CheckpointError(GraftjaxError, ValueError):
  """A checkpoint that does not hold the model asked for (names the tensor or field)."""


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """One tensor of the params pytree.

  Attributes:
    name: its key path (`"['layers'][3]['q']"`).
    key: the same path as a tuple (`('layers', 3, 'q')`).
    shape: its shape.
    fan_in: inputs summed per output (dense matrices), else None.
    init_scale: random weights (`random_init`) are drawn times this: H ** -1/4 for the
      q and k norms of a config whose queries are not scaled (`query_scale` 1, Gemma 4),
      so that random q . k has the spread of a product scaled by H ** -1/2 (as trained
      norms give it) rather than a softmax saturated by scores of spread sqrt(H); else 1.
    is_norm: an RMSNorm weight (stored with Gemma's +1).
  """

  name: str
  key: tuple
  shape: tuple[int, ...]
  fan_in: int | None = None
  init_scale: float = 1.0

  @property
  def is_norm(self) -> bool:
    """A weight that multiplies (drawn near 1): norms, and Gemma 4's scalars and scales."""
    return self.key[-1] in LAYER_NORMS + GEMMA4_SCALES or self.key in (
      ('final_norm',),
      ('per_layer_norm',),
    )


def _layer_shapes(
  config: config_lib.GemmaConfig, layer: int
) -> dict[str, tuple[tuple[int, ...], int | None]]:
  """Gemma 3's tensors of one layer, and those Gemma 4's fields add or take away:
  a kv-shared layer has no 'k', 'v', 'k_norm'; a K=V layer no 'v'."""
  d, f, n = config.embed_dim, config.mlp_dim(layer), config.num_heads
  k, h = config.kv_heads_of(layer), config.head_dim_of(layer)
  shapes = {
    'attn_norm': ((d,), None),
    'post_attn_norm': ((d,), None),
    'ffn_norm': ((d,), None),
    'post_ffn_norm': ((d,), None),
    'q': ((d, n, h), d),
    'k': ((d, k, h), d),
    'v': ((d, k, h), d),
    'o': ((n, h, d), n * h),
    'q_norm': ((h,), None),
    'k_norm': ((h,), None),
    'gate': ((d, f), d),
    'up': ((d, f), d),
    'down': ((f, d), f),
  }
  if config.kv_source(layer) != layer:
    del shapes['k'], shapes['v'], shapes['k_norm']
  elif config.k_eq_v(layer):
    del shapes['v']
  if config.layer_scalar:
    shapes['layer_scalar'] = ((1,), None)
  p = config.per_layer_input_dim
  if p:
    shapes |= {'pl_gate': ((d, p), d), 'pl_proj': ((p, d), p), 'pl_norm': ((d,), None)}
  if config.is_moe:
    e, x = config.num_experts, config.expert_dim
    shapes |= {
      'router_scale': ((d,), None),
      'router': ((d, e), d),
      'expert_scale': ((e,), None),
      'experts_gate_up': ((e, d, 2 * x), d),
      'experts_down': ((e, x, d), x),
      'ffn_norm_2': ((d,), None),
      'post_ffn_norm_1': ((d,), None),
      'post_ffn_norm_2': ((d,), None),
    }
  return shapes


def param_specs(config: config_lib.GemmaConfig) -> list[ParamSpec]:
  """Every tensor of `config`'s params, in pytree flattening order."""
  tree = {
    'embedding': ((config.vocab_size, config.embed_dim), config.embed_dim),
    'final_norm': ((config.embed_dim,), None),
    'layers': tuple(_layer_shapes(config, i) for i in range(config.num_layers)),
  }
  p = config.per_layer_input_dim
  if p:
    tree |= {
      'per_layer_embedding': ((config.vocab_size, config.num_layers * p), p),
      'per_layer_projection': ((config.embed_dim, config.num_layers * p), config.embed_dim),
      'per_layer_norm': ((p,), None),
    }
  is_leaf = lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]
  specs = []
  for path, (shape, fan_in) in leaves:
    key = tuple(getattr(p, 'key', getattr(p, 'idx', None)) for p in path)
    scale = 1.0
    if config.query_scale == 1.0 and key[-1] in ('q_norm', 'k_norm'):
      scale = float(shape[0]) ** -0.25
    specs.append(ParamSpec(jax.tree_util.keystr(path), key, shape, fan_in, scale))
  return specs


def empty_tree(config: config_lib.GemmaConfig) -> dict:
  """A params pytree skeleton to fill with `tree_put`."""
  tree = {
    'embedding': None,
    'final_norm': None,
    'layers': tuple({} for _ in range(config.num_layers)),
  }
  if config.per_layer_input_dim:
    tree |= dict.fromkeys(('per_layer_embedding', 'per_layer_projection', 'per_layer_norm'))
  return tree


def tree_put(tree: dict, spec: ParamSpec, value) -> None:
  """Sets `spec`'s tensor in a tree made by `empty_tree`."""
  if spec.key[0] == 'layers':
    tree['layers'][spec.key[1]][spec.key[2]] = value
  else:
    tree[spec.key[0]] = value


def default_place(dtype) -> Place:
  """Places a tensor on the default device, in `dtype`."""
  return lambda name, value: jax.numpy.asarray(value, dtype)


class StreamDigest:
  """`checkpoint.params_digest`, computed one float32 tensor at a time in spec order."""

  def __init__(self):
    self._sha = hashlib.sha256()

  def update(self, spec: ParamSpec, value: np.ndarray) -> None:
    arr = np.ascontiguousarray(value, np.float32)
    self._sha.update(spec.name.encode())
    self._sha.update(f'{arr.dtype.str}{arr.shape}'.encode())
    self._sha.update(arr.reshape(-1).view(np.uint8))

  def hexdigest(self) -> str:
    return self._sha.hexdigest()


class Streamed:
  """A params tree filled one tensor at a time, each placed as it comes, and its digest."""

  def __init__(self, config: config_lib.GemmaConfig, place: Place):
    self.tree = empty_tree(config)
    self._digest = StreamDigest()
    self._place = place

  def put(self, spec: ParamSpec, value: np.ndarray) -> None:
    self._digest.update(spec, value)
    tree_put(self.tree, spec, self._place(spec.name, value))

  def result(self) -> tuple[dict, str]:
    """(params tree, the float32 weights' digest)."""
    return self.tree, self._digest.hexdigest()


def check_shape(source: str, name: str, shape, want, spec: ParamSpec) -> None:
  """Raises CheckpointError naming the tensor unless `shape` is `want`."""
  if tuple(shape) != tuple(want):
    raise CheckpointError(
      f'{source}: tensor {name} has shape {tuple(shape)}, the config needs {tuple(want)}'
      f' for {spec.name}'
    )


def refuse_unused(source: str, names) -> None:
  """Raises CheckpointError naming a few of the tensors the config has no place for."""
  if names:
    raise CheckpointError(
      f'{source}: tensors the config has no place for: {sorted(names)[:5]} ({len(names)} in all)'
    )


_FINITE_SLICE = 1 << 22  # values checked per pass of `check_float`


def check_float(name: str, value, source: str) -> None:
  """Raises CheckpointError naming the tensor unless its dtype is a float type and every
  value is finite (checked a slice at a time: no tensor-sized temporary)."""
  dtype = np.dtype(getattr(value, 'dtype', np.float32))
  if dtype.kind != 'f' and dtype.name != 'bfloat16':
    raise CheckpointError(f'{source}: tensor {name} has dtype {dtype.name}, not a float type')
  flat = np.asarray(value).reshape(-1)
  for begin in range(0, flat.size, _FINITE_SLICE):
    bad = ~np.isfinite(flat[begin : begin + _FINITE_SLICE])
    if bad.any():
      i = begin + int(np.argmax(bad))
      raise CheckpointError(
        f'{source}: tensor {name} holds {flat[i]} at flat index {i}: weights must be finite'
      )
