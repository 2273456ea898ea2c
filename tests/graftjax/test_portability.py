"""Blocks move between machines byte for byte; logits, between CPUs of one kind.

The fixture (scripts/make_portable_block_fixture.py) holds a real-model block
written on an earlier development machine, and the logit digests its grafted
continuation gave on each kind of CPU it was recorded on. XLA's CPU code
depends on the processor: its matmuls (YNNPACK fusions) choose kernels from
the CPU at run time, and no XLA flag tried removes the dependence
(`--xla_cpu_max_isa`, `--xla_cpu_use_xnnpack=false`,
`--xla_cpu_enable_platform_dependent_math=false`, YNNPACK fusions off: each
still gave other bits on an AMD Zen 5 and on emulated AVX2 EPYCs). So the
block's files must be identical everywhere, and the grafted logits identical
to the recording made on another machine of this `determinism.cpu_kind()`.
A CPU kind with no recording fails, saying so: the claim is untested there
until a machine of that kind records it.
"""

import json
import pathlib

import numpy as np
import pytest

from graftjax import blocks
from graftjax import determinism
from graftjax import ledger
from graftjax import store as store_lib

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'fixtures'
RECORD = json.loads((FIXTURES / 'portable_block.json').read_text())


def test_block_files_are_byte_identical_when_written_again(tmp_path):
  store = store_lib.BlockStore(FIXTURES / 'portable_store')
  block = store.get(RECORD['key'])
  again = store_lib.BlockStore(tmp_path)
  assert again.put(block) == RECORD['key']
  assert store_lib.digest_tree(tmp_path / RECORD['key']) == RECORD['block_tree_sha256']
  assert (
    store_lib.digest_tree(FIXTURES / 'portable_store' / RECORD['key'])
    == RECORD['block_tree_sha256']
  )


def recording_for_this_machine():
  """The fixture's logits recording made on this CPU kind and jax version."""
  here = determinism.record()
  matches = [
    r
    for r in RECORD['logits_by_cpu_kind']
    if all(r[field] == here[field] for field in determinism.CPU_BITS_FIELDS)
  ]
  assert matches, (
    'no logits recording for this CPU kind and jax version: logit bits are a function of'
    ' the CPU kind (see the module docstring), so they can only be compared with a'
    ' recording made on a machine of this kind. Recorded: '
    f'{[{f: r[f] for f in determinism.CPU_BITS_FIELDS} for r in RECORD["logits_by_cpu_kind"]]};'
    f' here: { ({f: here[f] for f in determinism.CPU_BITS_FIELDS}) }. Record this kind with'
    ' scripts/make_portable_block_fixture.py on another machine of it.'
  )
  return matches[0]


@pytest.mark.real_model
def test_block_from_another_machine_gives_the_recorded_logit_bytes(real_model):
  assert real_model.fingerprint == RECORD['model_fingerprint']
  recording = recording_for_this_machine()
  store = store_lib.BlockStore(FIXTURES / 'portable_store')
  cache = blocks.graft(
    real_model.init_cache(capacity=RECORD['capacity']),
    store.get(RECORD['key']),
    model_fingerprint=real_model.fingerprint,
    position_scheme=real_model.position_scheme,
  )
  ids = RECORD['token_ids']
  prefix = RECORD['prefix_tokens']
  logits, _ = real_model.prefill(
    ids[prefix:], cache=cache, chunk_size=RECORD['chunk_size'], start_position=prefix, logits='all'
  )
  assert ledger.sha256_array(np.asarray(logits)) == recording['logits_sha256']


def test_the_fixture_records_logits_from_more_than_one_kind_of_cpu():
  """The recordings really differ by CPU kind, which is why they are kept per kind."""
  digests = {r['logits_sha256'] for r in RECORD['logits_by_cpu_kind']}
  assert len(digests) == len(RECORD['logits_by_cpu_kind']) >= 2


@pytest.mark.real_model
def test_real_model_fresh_and_grafted_are_byte_equal(real_model):
  ids = RECORD['token_ids']
  prefix, chunk, capacity = RECORD['prefix_tokens'], RECORD['chunk_size'], RECORD['capacity']
  _, cache = real_model.prefill(
    ids[:prefix], cache=real_model.init_cache(capacity=capacity), chunk_size=chunk, logits='none'
  )
  block = blocks.capture(
    cache,
    blocks.Span(0, prefix),
    token_ids=ids[:prefix],
    model_fingerprint=real_model.fingerprint,
    position_scheme=real_model.position_scheme,
  )
  fresh, _ = real_model.prefill(
    ids[prefix:], cache=cache, chunk_size=chunk, start_position=prefix, logits='all'
  )
  grafted_cache = blocks.graft(
    real_model.init_cache(capacity=capacity),
    block,
    model_fingerprint=real_model.fingerprint,
    position_scheme=real_model.position_scheme,
  )
  grafted, _ = real_model.prefill(
    ids[prefix:], cache=grafted_cache, chunk_size=chunk, start_position=prefix, logits='all'
  )
  assert np.asarray(fresh).tobytes() == np.asarray(grafted).tobytes()
