"""Seeded random weights: deterministic per tensor, any dtype, through a placement hook."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model
from graftjax.models.gemma import params as params_lib
from graftjax.models.gemma import random_init


def _leaves(m):
  return [np.asarray(x) for x in jax.tree.leaves(m.params)]


def test_same_seed_same_weights_other_seed_other():
  a, b = model.load('tiny', weights='random', seed=5), model.load('tiny', weights='random', seed=5)
  c = model.load('tiny', weights='random', seed=6)
  assert all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))
  assert not any(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(c), strict=True))
  assert a.fingerprint == b.fingerprint != c.fingerprint


def test_a_tensor_depends_on_its_name_and_seed_only():
  """Drawing one tensor alone gives the bits it has inside a whole model (no shared stream)."""
  m = model.load('tiny', weights='random', seed=5)
  spec = params_lib.param_specs(m.config)[-1]  # the last layer's 'v'
  assert spec.name == "['layers'][5]['v']"
  assert np.array_equal(
    np.asarray(random_init.draw(spec, 5)), np.asarray(m.params['layers'][5]['v'])
  )
  # Two layers' same-shaped tensors differ.
  assert not np.array_equal(
    np.asarray(m.params['layers'][0]['q']), np.asarray(m.params['layers'][1]['q'])
  )


def test_bfloat16_is_the_float32_draw_cast():
  f32 = model.load('tiny', weights='random', seed=2)
  bf16 = model.load('tiny', weights='random', seed=2, dtype=jnp.bfloat16)
  for x, y in zip(jax.tree.leaves(f32.params), jax.tree.leaves(bf16.params), strict=True):
    assert y.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(x.astype(jnp.bfloat16)), np.asarray(y))
  assert f32.params_digest == bf16.params_digest  # the same float32 weights


def test_values_are_scaled_per_kind():
  """1B widths (one layer, small vocabulary): dense N(0, 1 / fan_in), norms near 1."""
  config = config_lib.gemma3_1b(
    attention_types=config_lib.gemma3_attention_pattern(1), vocab_size=4096
  )
  m = model.random(config, seed=0, place=_small_place)
  assert m.params_digest == random_init.random_digest(config, 0)


def _small_place(name, value):
  """Checks the streamed tensor and keeps a 1-element stand-in (saves memory)."""
  arr = np.asarray(value)
  if name.endswith("['q']"):
    assert abs(arr.std() - 1152**-0.5) < 0.01 * 1152**-0.5
  if 'norm' in name:
    assert abs(arr.mean() - 1.0) < 0.02
  return jnp.zeros((1,), value.dtype)


def test_place_hook_sees_every_tensor_once_in_order():
  seen = []

  def place(name, value):
    seen.append((name, tuple(value.shape), value.dtype))
    return jax.device_put(value, jax.devices()[0])

  m = model.load('tiny', weights='random', seed=1, dtype=jnp.bfloat16, place=place)
  specs = params_lib.param_specs(m.config)
  assert [s[0] for s in seen] == [s.name for s in specs]
  assert [s[1] for s in seen] == [tuple(s.shape) for s in specs]
  assert {s[2] for s in seen} == {jnp.dtype(jnp.bfloat16)}


def test_random_weights_run_and_the_fingerprint_names_them():
  m = model.load('tiny', weights='random', seed=1)
  logits, _ = m.prefill(np.arange(1, 9), cache=m.init_cache(capacity=16), chunk_size=8)
  assert np.isfinite(np.asarray(logits)).all()
  assert m.params_digest == random_init.random_digest(m.config, 1)
  assert m.params_digest != random_init.random_digest(config_lib.tiny(num_kv_heads=2), 1)


@pytest.mark.parametrize('name', ['gemma3-4b', 'gemma3-12b', 'gemma3-27b'])
def test_every_size_has_the_published_tensor_shapes(name):
  config = config_lib.get_config(name)
  specs = params_lib.param_specs(config)
  assert len(specs) == 2 + 13 * config.num_layers
  total = sum(int(np.prod(s.shape)) for s in specs)
  # Parameter counts of the text decoders (embedding included): 3.9B, 11.8B, 27.0B.
  expected = {'gemma3-4b': 3.88e9, 'gemma3-12b': 11.77e9, 'gemma3-27b': 27.01e9}[name]
  assert abs(total - expected) / expected < 0.01, total


def test_a_large_tensor_is_its_blocks_in_order():
  """The whole-tensor draw (several blocks in one call) equals its blocks drawn one by one."""
  spec = params_lib.ParamSpec("['layers'][0]['gate']", ('layers', 0, 'gate'), (300, 2000), 300)
  whole = np.asarray(random_init.draw(spec, 9))
  name_hash = jnp.uint32(zlib.crc32(spec.name.encode()))
  blocks = [
    np.asarray(
      random_init._block(
        jnp.uint32(9),
        name_hash,
        jnp.uint32(i),
        jnp.float32(300**-0.5),
        jnp.float32(0.0),
        dtype=jnp.dtype(jnp.float32),
      )
    )
    for i in range(3)
  ]
  assert whole.size > 2 * random_init.BLOCK
  assert np.array_equal(whole.reshape(-1), np.concatenate(blocks)[: whole.size])


@pytest.mark.parametrize('seed', [-1, 2**32, 1.5, '3'])
def test_bad_seed_refused(seed):
  with pytest.raises(ValueError, match='seed'):
    model.load('tiny', weights='random', seed=seed)


def test_values_do_not_follow_jax_prng_defaults():
  m = model.load('tiny', weights='random', seed=8)
  with jax.threefry_partitionable(False):
    other = model.load('tiny', weights='random', seed=8)
  assert all(np.array_equal(x, y) for x, y in zip(_leaves(m), _leaves(other), strict=True))


@pytest.mark.parametrize(
  ('kwargs', 'match'),
  [({'dtype': jnp.int8}, 'dtype'), ({'weights': 3}, 'weights must be')],
)
def test_bad_load_arguments_refused(kwargs, match):
  with pytest.raises(ValueError, match=match):
    model.load('tiny', **{'weights': 'random', **kwargs})
