"""The decode loop: greedy equals argmax of full forward passes; sampling controls."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.models.gemma import sampler

PROMPT = np.random.default_rng(1).integers(3, 256, 11).astype(np.int32)


@pytest.mark.slow
def test_greedy_matches_step_by_step_argmax(tiny_model):
  out = sampler.generate(
    tiny_model, PROMPT, max_new_tokens=6, capacity=32, chunk_size=4, stop_ids=(), keep_logits=True
  )
  assert len(out['tokens']) == 6
  # One full forward pass over the prompt and the tokens: causal, so its logits at each
  # step's last position are those of a pass over that step's ids alone.
  ids = np.concatenate([PROMPT, out['tokens']])
  logits, _ = tiny_model.prefill(
    ids, cache=tiny_model.init_cache(capacity=32), chunk_size=ids.size, logits='all'
  )
  for step, (token, step_logits) in enumerate(zip(out['tokens'], out['logits'])):
    assert int(np.argmax(step_logits)) == token
    assert int(jnp.argmax(logits[0, PROMPT.size - 1 + step])) == token


@pytest.mark.slow
def test_stops_on_stop_token(tiny_model):
  first = sampler.generate(tiny_model, PROMPT, max_new_tokens=5, capacity=32, stop_ids=())
  stop = first['tokens'][2]
  out = sampler.generate(tiny_model, PROMPT, max_new_tokens=5, capacity=32, stop_ids=(stop,))
  assert out['tokens'] == first['tokens'][: first['tokens'].index(stop) + 1]


def test_sampling_is_reproducible_from_key(tiny_model):
  cfg = sampler.SamplingConfig(temperature=1.0, top_k=20, top_p=0.9)
  run = lambda seed: sampler.generate(
    tiny_model,
    PROMPT,
    max_new_tokens=8,
    capacity=32,
    sampling=cfg,
    rng=jax.random.key(seed),
    stop_ids=(),
  )['tokens']
  assert run(3) == run(3)
  assert any(run(3) != run(s) for s in (4, 5, 6))


def test_top_k_one_is_greedy():
  logits = jax.random.normal(jax.random.key(0), (4, 50))
  token = sampler.choose_token(
    logits, jax.random.key(1), sampler.SamplingConfig(temperature=2.0, top_k=1)
  )
  np.testing.assert_array_equal(token, jnp.argmax(logits, -1))


def test_bad_sampling_config():
  with pytest.raises(ValueError, match='top_p'):
    sampler.SamplingConfig(top_p=0.0)
