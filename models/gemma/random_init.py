"""Seeded random weights for any config, drawn tensor by tensor on the device.

Each tensor has its own counter-based stream: block i of it is drawn with
`fold_in(fold_in(PRNGKey(seed), crc32(name)), i)`, so its values depend on
the seed, its name and its size only: not on the order of
drawing, the other tensors, the dtype asked for or the machine (threefry2x32
in its partitionable mode, pinned whatever jax's defaults, gives the same
bits on every backend). Values are drawn in float32 and cast
inside one jitted call per tensor, then handed to `place`; no second copy of
the model exists at any time (one tensor's float32 draw at most), so a 27B
model in bfloat16 fits where its weights fit.

Values: dense matrices N(0, 1 / fan_in); norm weights (which include Gemma's
+1) 1 + N(0, 0.1^2); the embedding N(0, 1 / D); each times the tensor's
`init_scale` (1 but for Gemma 4's q and k norms, `params.ParamSpec`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import params as params_lib

# Bump when the values drawn for a (seed, name, shape) change.
RANDOM_INIT_VERSION = 1
BLOCK = 1 << 18  # values per compiled draw


def _stream(seed, name_hash, index, std, offset, dtype) -> jax.Array:
  """`BLOCK` values: block `index` of one tensor's stream."""
  root = jax.random.PRNGKey(seed, impl='threefry2x32')
  key = jax.random.fold_in(jax.random.fold_in(root, name_hash), index)
  return (offset + std * jax.random.normal(key, (BLOCK,), jnp.float32)).astype(dtype)


@functools.partial(jax.jit, static_argnames=('dtype',))
def _block(seed, name_hash, index, std, offset, *, dtype) -> jax.Array:
  """One block (one compilation for every tensor of at most `BLOCK` values)."""
  return _stream(seed, name_hash, index, std, offset, dtype)


@functools.partial(jax.jit, static_argnames=('shape', 'dtype'))
def _blocks(seed, name_hash, std, offset, *, shape, dtype) -> jax.Array:
  """A whole tensor of several blocks, in one call (compiled per shape)."""
  size = math.prod(shape)
  indices = jnp.arange(-(-size // BLOCK), dtype=jnp.uint32)
  # One block at a time (a loop, not a batch): no float32 copy of the whole tensor.
  values = jax.lax.map(lambda i: _stream(seed, name_hash, i, std, offset, dtype), indices)
  return values.reshape(-1)[:size].reshape(shape)


def draw(spec: params_lib.ParamSpec, seed: int, dtype=jnp.float32) -> jax.Array:
  """The random value of one tensor (default device), in `dtype`.

  The tensor's elements, row-major, are the first ones of its stream of
  blocks. A tensor of one block takes the one compiled block; a larger one
  is drawn whole by one call compiled for its shape.
  """
  std, offset = (0.1, 1.0) if spec.is_norm else (float(spec.fan_in) ** -0.5, 0.0)
  std, offset = std * spec.init_scale, offset * spec.init_scale
  args = (
    jnp.uint32(seed),
    jnp.uint32(zlib.crc32(spec.name.encode())),
  )
  size, dtype = math.prod(spec.shape), jnp.dtype(dtype)
  with jax.threefry_partitionable(True):  # the generator's mode, whatever the user's default
    if size > BLOCK:
      return _blocks(*args, jnp.float32(std), jnp.float32(offset), shape=spec.shape, dtype=dtype)
    block = _block(*args, jnp.uint32(0), jnp.float32(std), jnp.float32(offset), dtype=dtype)
  return block[:size].reshape(spec.shape)


def random_digest(config: config_lib.GemmaConfig, seed: int) -> str:
  """Names the float32 weights `random_params` draws: they follow from these inputs alone."""
  # A scale other than 1 is named (so digests of configs without one stay as they were).
  shapes = ''.join(
    f'{s.name}{s.shape}' + (f'*{s.init_scale!r}' if s.init_scale != 1.0 else '') + '\n'
    for s in params_lib.param_specs(config)
  )
  blob = f'random-v{RANDOM_INIT_VERSION}\nblock:{BLOCK}\nseed:{int(seed)}\n{shapes}'
  return hashlib.sha256(blob.encode()).hexdigest()


def random_params(
  config: config_lib.GemmaConfig,
  *,
  seed: int,
  dtype=jnp.float32,
  place: params_lib.Place | None = None,
) -> dict:
  """Random params of `config` in `dtype`, each tensor passed through `place`.

  Args:
    config: the architecture.
    seed: the seed; the same seed and config give the same float32 values.
    dtype: the params dtype.
    place: (name, value) -> placed array, e.g. a `jax.device_put` onto a
      sharding; default: the value as drawn (default device).
  Returns:
    The params pytree (layout of `transformer.py`).
  """
  if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
    raise ValueError(f'seed must be an integer in [0, 2**32), got {seed!r}')
  tree = params_lib.empty_tree(config)
  for spec in params_lib.param_specs(config):
    value = draw(spec, seed, dtype)
    params_lib.tree_put(tree, spec, value if place is None else place(spec.name, value))
  return tree
