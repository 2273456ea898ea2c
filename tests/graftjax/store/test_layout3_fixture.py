"""Blocks and pages stored in block layout 3 (every row of every layer, zeros where a ring
dropped them; Gemma 4's layers packed in one row) still read, verify and graft byte-exact.

tests/fixtures/layout3_store.json says how each was made and records the fresh continuation's
logit digest on the machine that wrote them: CPU bits are comparable only between machines
of one CPU kind, so where this machine's fresh logits differ the byte test skips.
"""

import json
import pathlib

import numpy as np
import pytest
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

from graftjax import ledger
from graftjax import restore as restore_lib
from graftjax import store as store_lib

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'fixtures'
RECORD = json.loads((FIXTURES / 'layout3_store.json').read_text())


def _model(case):
  m = gemma_model.random(config_lib.get_config(case['config']), seed=case['seed'])
  return m.with_local_cache(case['local_cache'], chunk_size=case['ring_chunk_size'])


def _continued(m, cache, n):
  out, _ = m.prefill(
    np.asarray(RECORD['continuation_tokens'], np.int32),
    cache=cache,
    chunk_size=RECORD['chunk_size'],
    start_position=n,
    logits='all',
  )
  return np.asarray(out)


@pytest.mark.parametrize('case', RECORD['cases'], ids=lambda c: c['key'][:8])
def test_a_layout3_block_reads_verifies_and_grafts_byte_exact(case):
  store = store_lib.BlockStore(FIXTURES / 'layout3_store', read_only=True)
  store.verify(case['key'])
  meta, _ = store.read_meta(case['key'])
  assert meta.layout_version == 3
  m, n = _model(case), case['tokens']
  ids = np.asarray(RECORD['prefix_tokens'][:n], np.int32)
  capacity, chunk = RECORD['capacity'], RECORD['chunk_size']
  _, cache = m.prefill(ids, cache=m.init_cache(capacity=capacity), chunk_size=chunk, logits='none')
  fresh = _continued(m, cache, n)
  if ledger.sha256_array(fresh) != case['fresh_logits_sha256']:
    pytest.skip('this CPU computes other bits than the one that wrote the fixture')
  restored = restore_lib.restore(
    store,
    case['key'],
    m.init_cache(capacity=capacity),
    target=m.graft_target,
    config=m.config,
    token_ids=ids,
    chunk_size=chunk,
  )
  assert _continued(m, restored, n).tobytes() == fresh.tobytes()
