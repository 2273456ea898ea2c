"""The KV-bytes table: sizes from configs agree with the caches and weights the model makes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graftjax import blocks
from graftjax import ledger
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import transformer
from graftjax.studies.model import kv_bytes


def _nbytes(tree):
  return sum(a.nbytes for a in jax.tree.leaves(tree))


def test_param_count_is_that_of_the_params_the_model_makes():
  config = config_lib.tiny()
  params = transformer.init_params(config)
  assert kv_bytes.param_count(config) == sum(a.size for a in jax.tree.leaves(params))


@pytest.mark.parametrize('local', ['full', 'ring'])
def test_cache_bytes_are_those_of_the_cache_the_model_makes(local):
  model = gemma_model.tiny(impl='pallas').with_local_cache(local)
  cache = model.init_cache(capacity=1024)
  got = kv_bytes.cache_bytes(model.config, 1024, local=local, dtype=jnp.float32)
  assert got['total'] == _nbytes(cache)
  kv = [cache.k, cache.v] + ([cache.ring_k, cache.ring_v] if local == 'ring' else [])
  assert got['kv'] == _nbytes(kv)


def test_ring_bytes_per_token_approach_the_global_layers_own():
  table = kv_bytes.table(['tiny', config_lib.gemma3_270m()], capacities=(1024, 32768))
  for entry in table['configs']:
    full, ring = (
      [row[local]['kv_vs_global_layers'] for row in entry['capacities']]
      for local in ('full', 'ring')
    )
    assert full == [entry['layers'] / entry['global_layers']] * 2
    assert ring[0] > ring[1] > 1.0
    assert entry['slots_that_fit']['ring'] > entry['slots_that_fit']['full']


def test_fitting_slots_is_the_largest_capacity_that_fits():
  config = config_lib.gemma3_270m()
  free = 10**9
  slots = kv_bytes.fitting_slots(config, local='ring', free_bytes=free)
  assert slots % 64 == 0
  size = lambda s: kv_bytes.cache_bytes(config, s, local='ring')['total']
  assert size(slots) <= free < size(slots + 64)


def test_experiment_writes_a_result_that_verifies(tmp_path):
  from graftjax.studies.common import results

  result = kv_bytes.experiment(['tiny'], capacities=(256,))
  assert result['inputs']['config_digests'] == {'tiny': config_lib.tiny().digest()}
  results.write(tmp_path / 'kv_bytes.json', result, log=None)
  again = ledger.verify_result(tmp_path / 'kv_bytes.json')
  assert again['configs'][0]['capacities'][0]['ring_capacity'] == 256
  assert np.isclose(again['configs'][0]['capacities'][0]['ring']['kv_vs_global_layers'], 6.0)


def test_ring_meets_the_12b_goal_at_32k():
  """At 12B, bfloat16, 32k slots: ring bytes per token within 1.2x of the global layers' own."""
  if 'gemma3-12b' not in config_lib.NAMED_CONFIGS:
    pytest.skip('no gemma3-12b config in models/gemma/config.py yet')
  (entry,) = kv_bytes.table(['gemma3-12b'], capacities=(32768,))['configs']
  assert entry['capacities'][0]['ring']['kv_vs_global_layers'] <= 1.2


@pytest.mark.parametrize('name', ['tiny', 'tiny-gemma4-31b', 'tiny-gemma4-e2b'])
def test_block_bytes_are_those_of_a_captured_block(name):
  """The compact column is what `blocks.capture` keeps; the full one every row of every layer."""
  m = gemma_model.random(config_lib.get_config(name), seed=3)
  ids = np.arange(3, 23, dtype=np.int32)
  _, cache = m.prefill(ids, cache=m.init_cache(capacity=32), chunk_size=4, logits='none')
  span = blocks.Span(0, ids.size)
  capture = lambda keep: blocks.capture(
    cache, span, token_ids=ids, target=m.graft_target, chunk_size=4, keep=keep
  )
  got = kv_bytes.block_bytes(m.config, ids.size, jnp.float32)
  assert got == {'full': capture('span').nbytes(), 'compact': capture('needed').nbytes()}


def test_a_compact_31b_block_of_32k_tokens_fits_3_6_gb():
  """Gemma 4 31B, bfloat16, 32k tokens: 50 sliding layers' last W - 1 rows and 10 global
  layers' every row, about 3.52 GB, where every row of every layer is 29.5 GB."""
  sizes = kv_bytes.block_bytes(config_lib.get_config('gemma4-31b'), 32768)
  assert sizes['compact'] <= 3.6e9 < sizes['full']
