"""Seeded random weights for any config, drawn tensor by tensor on the device.

Each tensor has its own counter-based stream: block i of it is drawn with
`fold_in(fold_in(PRNGKey(seed), crc32(name)), i)`, so its values depend on
the seed, its name and its size only: not on the order of
drawing, the other tensors, the dtype asked for or the machine (jax's
threefry gives the same bits on every backend). Blocks are drawn in float32 and cast
inside one jitted call, then joined and handed to `place`; no second copy of
the model exists at any time (one tensor's blocks at most), so a 27B model in
bfloat16 fits where its weights fit.

Values: dense matrices N(0, 1 / fan_in); norm weights (which include Gemma's
+1) 1 + N(0, 0.1^2); the embedding N(0, 1 / D).
"""

from __future__ import annotations

import functools
import hashlib
import math
import zlib

import jax
import jax.numpy as jnp

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import params as params_lib

# Bump when the values drawn for a (seed, name, shape) change.
RANDOM_INIT_VERSION = 1
BLOCK = 1 << 18  # values per compiled draw


@functools.partial(jax.jit, static_argnames=('dtype',))
def _block(seed, name_hash, index, std, offset, *, dtype) -> jax.Array:
  """`BLOCK` values: block `index` of one tensor's stream."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), name_hash), index)
  return (offset + std * jax.random.normal(key, (BLOCK,), jnp.float32)).astype(dtype)


def draw(spec: params_lib.ParamSpec, seed: int, dtype=jnp.float32) -> jax.Array:
  """The random value of one tensor (default device), in `dtype`.

  The tensor's elements, row-major, are the first ones of its stream of
  blocks; one compiled block serves every shape.
  """
  std, offset = (0.1, 1.0) if spec.is_norm else (float(spec.fan_in) ** -0.5, 0.0)
  size = math.prod(spec.shape)
  args = (
    jnp.uint32(seed),
    jnp.uint32(zlib.crc32(spec.name.encode())),
  )
  blocks = [
    _block(*args, jnp.uint32(i), jnp.float32(std), jnp.float32(offset), dtype=jnp.dtype(dtype))
    for i in range(-(-size // BLOCK))
  ]
  flat = blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks)
  del blocks
  return flat[:size].reshape(spec.shape)


def random_digest(config: config_lib.GemmaConfig, seed: int) -> str:
  """Names the float32 weights `random_params` draws: they follow from these inputs alone."""
  shapes = ''.join(f'{s.name}{s.shape}\n' for s in params_lib.param_specs(config))
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
  tree = params_lib.empty_tree(config)
  for spec in params_lib.param_specs(config):
    value = draw(spec, seed, dtype)
    params_lib.tree_put(tree, spec, value if place is None else place(spec.name, value))
  return tree
