"""Gemma 4 on the chunk-invariant kernels (the Pallas interpreter on CPU): partial rotary,
head size 512, and a mixture of experts whose routing and bits do not depend on the chunk
or the batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from graftjax.kernels import attention as attention_kernel
from graftjax.kernels import rotary
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import moe

RNG = np.random.default_rng(8)
IDS = RNG.integers(3, 256, 12).astype(np.int32)


def test_partial_rotary_kernel_equals_its_reference_and_keeps_the_other_pairs():
  x = jnp.asarray(RNG.normal(size=(1, 6, 2, 512)), jnp.float32)
  positions = jnp.asarray([[0, 1, 5, 700, 4095, 70_000]], jnp.int32)
  out = rotary.apply_rotary(x, positions, theta=1e6, fraction=0.25, interpret=True)
  inv_freq = jnp.asarray(rotary.rotary_inv_freq(512, 1e6, 0.25))
  ref = rotary.apply_rotary_reference(x, positions, theta=1e6, inv_freq=inv_freq)
  assert np.asarray(out).tobytes() == np.asarray(ref).tobytes()
  rotated = rotary.rotated_pairs(512, 0.25)
  assert rotated == 64
  for lo, hi in ((rotated, 256), (256 + rotated, 512)):  # the pairs that do not rotate
    assert np.asarray(out[..., lo:hi]).tobytes() == np.asarray(x[..., lo:hi]).tobytes()
  assert not np.array_equal(out[:, 1:, :, :rotated], x[:, 1:, :, :rotated])


def test_pallas_attention_takes_head_size_512():
  q = jnp.asarray(RNG.normal(size=(1, 5, 4, 512)) * 0.05, jnp.float32)
  k = jnp.asarray(RNG.normal(size=(1, 64, 1, 512)), jnp.float32)
  v = jnp.asarray(RNG.normal(size=(1, 64, 1, 512)), jnp.float32)
  q_pos = jnp.arange(20, 25, dtype=jnp.int32)[None]
  k_pos = jnp.where(jnp.arange(64) < 25, jnp.arange(64), -1).astype(jnp.int32)[None]
  out = attention_kernel.attention(q, k, v, q_pos, k_pos, window=None, interpret=True)
  ref = attention_kernel.attention_reference(q, k, v, q_pos, k_pos, window=None)
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-6, rtol=1e-5)


# Each structure at its fewest layers (the Pallas interpreter's time grows with them): E2B's
# sliding and global layers, each with a kv-shared, double-wide copy after it; 26B's sliding
# and K=V global layers, each with its experts.
_FEWEST_LAYERS = {
  'tiny-gemma4-e2b': dict(
    attention_types=config_lib.attention_pattern(4, 1), num_kv_shared_layers=2
  ),
  'tiny-gemma4-26b': dict(attention_types=config_lib.attention_pattern(2, 1)),
}


def _pallas(name):
  config = config_lib.get_config(name, **_FEWEST_LAYERS[name])
  return gemma_model.random(config, seed=9).with_impl('pallas')


def _prefilled(m, chunk_size, batch_size=1):
  cache = m.init_cache(batch_size=batch_size, capacity=64)
  logits, _ = m.prefill(IDS, cache=cache, chunk_size=chunk_size, logits='all')
  return np.asarray(logits)


@pytest.mark.slow  # the Pallas interpreter: minutes on two cores
def test_gemma4_structures_are_chunk_and_batch_invariant_under_pallas():
  for name in ('tiny-gemma4-e2b', 'tiny-gemma4-26b'):
    m = _pallas(name)
    whole = _prefilled(m, 12)
    # Chunks of 4 (one shape) in a batch of 2: each row's bits equal the one-chunk,
    # batch-of-1 prefill's.
    for row in _prefilled(m, 4, batch_size=2):
      assert row[None].tobytes() == whole.tobytes(), name


def test_moe_routing_breaks_ties_toward_the_lower_expert_and_ignores_other_rows():
  config = config_lib.tiny_gemma4_26b()
  m = gemma_model.random(config, seed=9)
  params = dict(m.params['layers'][0])
  params['router'] = jnp.zeros_like(params['router'])  # every expert scores alike
  x = jnp.asarray(RNG.normal(size=(1, 3, config.embed_dim)), jnp.float32)
  weights, ids = moe.route(params, x, config=config, impl='pallas', precision='highest')
  assert np.asarray(ids).tolist() == [[[0, 1]] * 3]
  scale = np.asarray(params['expert_scale'])[:2]
  np.testing.assert_array_equal(np.asarray(weights)[0, 0], np.float32(0.5) * scale)
  params = dict(m.params['layers'][0])
  alone = moe.route(params, x[:, 1:2], config=config, impl='pallas', precision='highest')
  together = moe.route(params, x, config=config, impl='pallas', precision='highest')
  assert np.asarray(alone[1]).tolist() == np.asarray(together[1])[:, 1:2].tolist()
  assert np.asarray(alone[0]).tobytes() == np.asarray(together[0])[:, 1:2].tobytes()


def test_row_sum_is_the_same_whatever_the_other_rows():
  x = jnp.asarray(RNG.normal(size=(7, 128)), jnp.float32)
  each = [np.asarray(moe.row_sum(x[i : i + 1])) for i in range(7)]
  assert np.concatenate(each).tobytes() == np.asarray(jax.jit(moe.row_sum)(x)).tobytes()
  np.testing.assert_allclose(np.asarray(moe.row_sum(x)), np.asarray(x).sum(-1), rtol=1e-5)
