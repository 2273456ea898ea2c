"""The Gemma forward pass on the tiny config: shapes, cache layout, determinism."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops

IDS = np.random.default_rng(0).integers(3, 256, 37).astype(np.int32)


def prefill_all(model, ids, chunk_size, capacity=64):
  return model.prefill(
    ids, cache=model.init_cache(capacity=capacity), chunk_size=chunk_size, logits='all'
  )


@pytest.mark.slow
def test_forward_shapes(tiny_model):
  logits, cache = prefill_all(tiny_model, IDS, chunk_size=16)
  cfg = tiny_model.config
  assert logits.shape == (1, IDS.size, cfg.vocab_size)
  assert logits.dtype == jnp.float32
  assert cache.k.shape == (cfg.num_layers, 1, 64, cfg.num_kv_heads, cfg.head_dim)
  assert int(cache.length) == IDS.size
  np.testing.assert_array_equal(cache.positions[0, : IDS.size], np.arange(IDS.size))
  assert np.all(np.asarray(cache.positions[0, IDS.size :]) == -1)


@pytest.mark.slow
@pytest.mark.parametrize('chunk_size', [1, 5, 16, 37])
def test_chunking_gives_same_layout_and_close_values(tiny_model, chunk_size):
  ref_logits, ref_cache = prefill_all(tiny_model, IDS, chunk_size=64)
  logits, cache = prefill_all(tiny_model, IDS, chunk_size=chunk_size)
  np.testing.assert_array_equal(cache.positions, ref_cache.positions)
  assert int(cache.length) == int(ref_cache.length)
  np.testing.assert_allclose(cache.k, ref_cache.k, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=1e-4)


def test_fresh_vs_fresh_is_byte_equal(tiny_model):
  a, _ = prefill_all(tiny_model, IDS, chunk_size=8)
  b, _ = prefill_all(tiny_model, IDS, chunk_size=8)
  assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_sliding_window_changes_late_logits():
  windowed = gemma_model.tiny()
  unwindowed = gemma_model.tiny(sliding_window=10_000)
  a, _ = prefill_all(windowed, IDS, chunk_size=64)
  b, _ = prefill_all(unwindowed, IDS, chunk_size=64)
  window = windowed.config.sliding_window
  np.testing.assert_array_equal(a[:, :window], b[:, :window])  # window not yet reached
  assert float(jnp.max(jnp.abs(a[:, window:] - b[:, window:]))) > 1e-3


@pytest.mark.slow
def test_bfloat16_runs_and_stays_close(tiny_model):
  bf16 = gemma_model.tiny(dtype=jnp.bfloat16)
  a, cache = prefill_all(bf16, IDS, chunk_size=16)
  b, _ = prefill_all(tiny_model, IDS, chunk_size=16)
  assert cache.k.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(a)))
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  assert np.linalg.norm(a - b) / np.linalg.norm(b) < 0.05


def test_cache_overflow_is_refused(tiny_model):
  with pytest.raises(ValueError, match='do not fit'):
    prefill_all(tiny_model, IDS, chunk_size=8, capacity=20)


def test_bad_config_is_refused():
  with pytest.raises(ValueError, match='multiple'):
    config_lib.tiny(num_kv_heads=3)
  with pytest.raises(ValueError, match='unknown model config'):
    config_lib.get_config('gemma-9000')


def test_fingerprint_depends_on_weights_and_scheme():
  a, b = gemma_model.tiny(seed=0), gemma_model.tiny(seed=1)
  assert a.fingerprint != b.fingerprint
  assert a.fingerprint == gemma_model.tiny(seed=0).fingerprint
  assert a.with_position_scheme('alibi').fingerprint != a.fingerprint


@pytest.mark.slow
@pytest.mark.parametrize('scheme', ['rope_f64', 'rope_relative'])
def test_positions_beyond_the_float64_tables_are_refused(scheme):
  model = dataclasses.replace(gemma_model.tiny(position_scheme=scheme), table_size=32)
  cache = model.init_cache(capacity=8)
  model.forward(np.full((1, 1), 5), np.full((1, 1), 31), cache)  # the last covered row
  with pytest.raises(ValueError, match='position table'):
    model.forward(np.full((1, 1), 5), np.full((1, 1), 32), model.init_cache(capacity=8))


def test_pallas_capacity_multiple_fits_every_attention_tile():
  from graftjax.kernels import attention

  for block_k in attention.default_block_k_values():
    assert ops.CAPACITY_MULTIPLE % block_k == 0, block_k


@pytest.mark.slow
def test_prefill_returns_the_hidden_state_of_every_chunk(tiny_model):
  """'hidden' used to return only the last chunk's rows."""
  ids = [2, 5, 9, 11, 13, 17, 19]
  cache = tiny_model.init_cache(capacity=16)
  hidden, _ = tiny_model.prefill(ids, cache=cache, chunk_size=3, logits='hidden')
  assert hidden.shape == (1, len(ids), tiny_model.config.embed_dim)


@pytest.mark.slow
def test_prefill_last_unembeds_only_the_final_chunk(monkeypatch):
  """'last' computes the vocabulary logits once, for the final chunk's last token (Pallas:
  its rows do not depend on how many share the call, so they equal 'all''s last row)."""
  # Two layers (one sliding, one global) of the tiny model: the unembedding is the same.
  model = gemma_model.tiny(attention_types=config_lib.attention_pattern(2, 1), impl='pallas')
  calls = []
  real = ops.unembed

  def spy(x, table, **kw):
    calls.append(x.shape)
    return real(x, table, **kw)

  monkeypatch.setattr(ops, 'unembed', spy)
  last, _ = model.prefill(IDS, cache=model.init_cache(capacity=64), chunk_size=8, logits='last')
  assert len(calls) == 1  # 5 chunks, one of them unembedded
  every, _ = prefill_all(model, IDS, chunk_size=8)
  assert np.asarray(last).tobytes() == np.asarray(every[:, -1]).tobytes()
