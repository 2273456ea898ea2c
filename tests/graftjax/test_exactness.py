"""The gate itself, and the whole fresh/grafted/other-process flow on the tiny model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.studies.common import corpus
from graftjax import exactness
from graftjax.studies.graft import graft_gate
from graftjax import ledger
from graftjax import store as store_lib


def test_identical_logits_pass():
  a = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
  c = exactness.compare(a, a.copy())
  assert c.byte_equal and c.kl_max == 0.0 and c.argmax_agreement == 1.0


def test_one_ulp_fails_the_byte_gate():
  a = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
  b = a.copy()
  b[1, 7] = np.nextafter(b[1, 7], np.float32(np.inf))
  c = exactness.compare(a, b)
  assert not c.byte_equal and c.sha256_reference != c.sha256_candidate
  assert c.max_abs_diff > 0 and c.kl_max >= 0


def test_prepared_reference_gives_the_figures_of_compare():
  rng = np.random.default_rng(1)
  a = rng.normal(size=(4, 64)).astype(np.float32)
  prepared = exactness.ReferenceLogits(a)
  for b in (
    a.copy(),
    a + rng.normal(size=a.shape).astype(np.float32) * 1e-3,
    rng.normal(size=a.shape).astype(np.float32),
  ):
    assert prepared.compare(b) == exactness.compare(a, b)
  assert not prepared.compare(a * 2).byte_equal
  np.testing.assert_array_equal(
    exactness.kl_divergence(a, a * 2),
    np.sum(
      np.exp(exactness.log_softmax64(a))
      * (exactness.log_softmax64(a) - exactness.log_softmax64(a * 2)),
      -1,
    ),
  )


def test_compare_refuses_empty_arrays():
  with pytest.raises(ValueError, match='nothing to compare'):
    exactness.compare(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))


def test_compare_refuses_mismatched_arrays():
  with pytest.raises(ValueError, match='cannot compare'):
    exactness.compare(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64))


@pytest.mark.slow
def test_gate_on_tiny_model(tiny_model, tmp_path):
  rng = np.random.default_rng(5)
  samples = [
    corpus.TextSample(
      source=f'random-{i}',
      prefix_ids=tuple(int(t) for t in rng.integers(3, 256, 14)),
      continuation_ids=tuple(int(t) for t in rng.integers(3, 256, 5)),
    )
    for i in range(2)
  ]
  schedule = graft_gate.Schedule(chunk_size=4, rollout_tokens=3, capacity=24)
  store = store_lib.BlockStore(tmp_path / 'store')
  # The parent frees its own weights before the child loads its copy (a 31B fits a GPU once).
  own = dataclasses.replace(tiny_model, params=jax.tree.map(jnp.array, tiny_model.params))
  released = []

  def release():
    released.append(len(store.list()))
    graft_gate.free_weights(own)

  result = graft_gate.run_gate(
    model=own,
    model_name='tiny',
    samples=samples,
    schedule=schedule,
    store=store,
    workdir=tmp_path,
    release=release,
  )
  assert released == [2]  # once, after both deposits
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(own.params))
  summary = result['summary']
  for arm in ('fresh_vs_grafted', 'fresh_vs_fresh', 'fresh_vs_grafted_other_process'):
    assert summary[arm]['byte_equal'] == 2, arm
    assert summary[arm]['kl_max'] == 0.0, arm
  assert summary['rollout_fresh_vs_grafted']['logits_byte_equal'] == 2
  assert summary['rollout_fresh_vs_grafted_other_process']['tokens_equal'] == 2
  assert len(store.list()) == 2
  path = tmp_path / 'result.json'
  ledger.write_result(path, result)
  assert ledger.verify_result(path)['summary'] == summary


def test_gate_blocks_record_their_chunk_size_and_refuse_another(tiny_model, tmp_path):
  """Under XLA (not chunk-invariant) a gate block is grafted only under its own chunk size."""
  from graftjax import blocks

  sample = corpus.TextSample(
    source='random', prefix_ids=tuple(range(3, 17)), continuation_ids=(20,) * 5
  )
  store = store_lib.BlockStore(tmp_path / 'store')
  key = graft_gate.deposit(tiny_model, sample, graft_gate.Schedule(4, 3, 24), store)
  assert store.get(key).meta.chunk_size == 4
  graft_gate.grafted(tiny_model, sample, graft_gate.Schedule(4, 3, 24), store, key, rollout=False)
  with pytest.raises(blocks.GraftError, match='chunk'):
    graft_gate.grafted(tiny_model, sample, graft_gate.Schedule(8, 3, 24), store, key, rollout=False)


def test_tampered_result_is_detected(tmp_path):
  path = tmp_path / 'r.json'
  ledger.write_result(path, {'byte_equal': 50})
  path.write_text(path.read_text().replace('50', '49'))
  with pytest.raises(ValueError, match='digest'):
    ledger.verify_result(path)
