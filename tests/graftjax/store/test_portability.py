"""Blocks move between machines byte for byte; logits, between CPUs of one kind.

The fixture (scripts/make_portable_block_fixture.py) holds a real-model block
written on an earlier development machine, and the logit digests its grafted
continuation gave on each kind of CPU it was recorded on. XLA's CPU code
depends on the processor: its matmuls (YNNPACK fusions) choose kernels from
the CPU at run time, and no XLA flag tried removes the dependence
(`--xla_cpu_max_isa`, `--xla_cpu_use_xnnpack=false`,
`--xla_cpu_enable_platform_dependent_math=false`, YNNPACK fusions off: each
still gave other bits on an AMD Zen 5 and on emulated AVX2 EPYCs).

So, on every machine, the block's files must be identical to the committed
ones. The grafted logits must be identical to the recording made on another
machine of this `determinism.cpu_kind()` and jax version; on a kind with no
recording the claim cannot be checked, and that test is skipped, naming the
kind and how to record it (pytest prints skip reasons: `-rs` in setup.cfg).
The comparison itself is shown to fail on this machine when the recorded bits
differ from the computed ones, so a pass is never vacuous.
"""

import json
import pathlib

import numpy as np
import pytest

from graftjax import blocks
from graftjax import determinism
from graftjax import ledger
from graftjax import store as store_lib

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'fixtures'
RECORD = json.loads((FIXTURES / 'portable_block.json').read_text())
RECORD_SCRIPT = 'scripts/make_portable_block_fixture.py'


def test_block_files_are_byte_identical_when_written_again(tmp_path):
  """Runs on every machine: the block's bytes do not depend on the CPU."""
  store = store_lib.BlockStore(FIXTURES / 'portable_store')
  block = store.get(RECORD['key'])
  again = store_lib.BlockStore(tmp_path)
  assert again.put(block) == RECORD['key']
  assert store_lib.digest_tree(tmp_path / RECORD['key']) == RECORD['block_tree_sha256']
  assert (
    store_lib.digest_tree(FIXTURES / 'portable_store' / RECORD['key'])
    == RECORD['block_tree_sha256']
  )


def _bits_fields(record: dict) -> dict:
  return {field: record.get(field) for field in determinism.CPU_BITS_FIELDS}


def recording_for(here: dict, recordings: list[dict]) -> dict | None:
  """The recording made on `here`'s CPU kind and jax version, or None."""
  matches = [r for r in recordings if _bits_fields(r) == _bits_fields(here)]
  if len(matches) > 1:
    raise ValueError(f'{len(matches)} logits recordings for one CPU kind: {_bits_fields(here)}')
  return matches[0] if matches else None


def no_recording_reason(here: dict, recordings: list[dict]) -> str:
  return (
    'no logits recording for this CPU kind and jax version in'
    ' tests/fixtures/portable_block.json, so the grafted logits cannot be checked here:'
    ' logit bits are a function of the CPU kind (see the module docstring). Here:'
    f' {json.dumps(_bits_fields(here), sort_keys=True)}; recorded:'
    f' {json.dumps([_bits_fields(r) for r in recordings], sort_keys=True)}. To add this kind,'
    f' run `.venv/bin/python {RECORD_SCRIPT}` (without --rewrite_block) on a machine of this'
    ' kind and commit tests/fixtures/portable_block.json.'
  )


def grafted_logits(model) -> np.ndarray:
  """float32 logits of the continuation after grafting the committed block."""
  assert model.fingerprint == RECORD['model_fingerprint']
  store = store_lib.BlockStore(FIXTURES / 'portable_store')
  block = store.get(RECORD['key'])
  assert block.meta.layout_version == 2 and block.meta.chunk_size == 0  # stored before chunks
  cache = blocks.graft(
    model.init_cache(capacity=RECORD['capacity']),
    block,
    target=model.graft_target,
    # The block records no chunk size; the fixture's record names the one it was made with.
    chunk_size=RECORD['chunk_size'],
    allow_other_shape=True,
  )
  ids = RECORD['token_ids']
  prefix = RECORD['prefix_tokens']
  logits, _ = model.prefill(
    ids[prefix:], cache=cache, chunk_size=RECORD['chunk_size'], start_position=prefix, logits='all'
  )
  return np.asarray(logits)


def assert_matches_recording(logits: np.ndarray, recording: dict) -> None:
  found = ledger.sha256_array(logits)
  assert found == recording['logits_sha256'], (
    f'grafted logits {found} != {recording["logits_sha256"]} recorded on this CPU kind'
    f' ({json.dumps(_bits_fields(recording), sort_keys=True)})'
  )


def check_against_this_machines_recording(request) -> None:
  """Skips where this kind has no recording; else grafts and compares the bytes."""
  here = determinism.record()
  recording = recording_for(here, RECORD['logits_by_cpu_kind'])
  if recording is None:
    pytest.skip(no_recording_reason(here, RECORD['logits_by_cpu_kind']))
  assert_matches_recording(grafted_logits(request.getfixturevalue('real_model')), recording)


@pytest.mark.slow
@pytest.mark.real_model
def test_block_from_another_machine_gives_the_recorded_logit_bytes(request):
  check_against_this_machines_recording(request)


def _recordings_with_this_kind_as(digest: str) -> list[dict]:
  """The recordings, with this kind's (if any) replaced by one of `digest`."""
  here = _bits_fields(determinism.record())
  others = [r for r in RECORD['logits_by_cpu_kind'] if _bits_fields(r) != here]
  return others + [{**here, 'logits_sha256': digest}]


@pytest.mark.real_model
def test_comparison_fails_where_a_recording_of_this_kind_differs(request, monkeypatch, real_model):
  """Where this kind is recorded, other bits fail the test: it neither skips nor passes."""
  logits = grafted_logits(real_model)
  flipped = logits.copy()
  flipped.view(np.uint32).flat[12345] ^= 1  # one bit of one logit
  for recorded in (flipped, np.zeros_like(logits)):
    monkeypatch.setitem(
      RECORD, 'logits_by_cpu_kind', _recordings_with_this_kind_as(ledger.sha256_array(recorded))
    )
    with pytest.raises(AssertionError, match='recorded on this CPU kind'):
      check_against_this_machines_recording(request)
    monkeypatch.undo()
  # ... and the very bits computed here pass: the comparison can succeed.
  monkeypatch.setitem(
    RECORD, 'logits_by_cpu_kind', _recordings_with_this_kind_as(ledger.sha256_array(logits))
  )
  check_against_this_machines_recording(request)


def test_recording_is_chosen_by_every_cpu_bits_field():
  recordings = [r for r in RECORD['logits_by_cpu_kind'] if r['cpu_kind']]
  assert recordings, 'the fixture holds no recording with a cpu_kind'
  recorded = recordings[0]
  assert recording_for(_bits_fields(recorded), RECORD['logits_by_cpu_kind']) is recorded
  other_l3 = {**recorded['cpu_kind'], 'L3': '1K'}
  for field, other in (('cpu_kind', other_l3), ('jax_version', '0.0.0'), ('jaxlib_version', '0')):
    here = {**_bits_fields(recorded), field: other}
    assert recording_for(here, RECORD['logits_by_cpu_kind']) is None, field


def test_a_kind_with_no_recording_is_skipped_with_its_reason(request, monkeypatch):
  """Skips (not fails) before loading the model, naming the kind and the script."""
  kind = {'vendor_id': 'NoSuchVendor', 'cpu_family': '0', 'model': '0'}
  monkeypatch.setattr(determinism, 'cpu_kind', lambda: kind)
  with pytest.raises(pytest.skip.Exception) as skipped:
    check_against_this_machines_recording(request)
  reason = str(skipped.value)
  assert 'NoSuchVendor' in reason and RECORD_SCRIPT in reason
  assert 'AuthenticAMD' in reason  # the kinds that are recorded


def test_the_fixture_records_logits_from_more_than_one_kind_of_cpu():
  """The recordings differ between kinds of CPU, which is why they are kept per kind (not
  between every two kinds: two kinds may run the same kernels)."""
  digests = {r['logits_sha256'] for r in RECORD['logits_by_cpu_kind']}
  assert len(digests) >= 2


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
    target=real_model.graft_target,
    chunk_size=chunk,
  )
  fresh, _ = real_model.prefill(
    ids[prefix:], cache=cache, chunk_size=chunk, start_position=prefix, logits='all'
  )
  grafted_cache = blocks.graft(
    real_model.init_cache(capacity=capacity),
    block,
    target=real_model.graft_target,
    chunk_size=chunk,
  )
  grafted, _ = real_model.prefill(
    ids[prefix:], cache=grafted_cache, chunk_size=chunk, start_position=prefix, logits='all'
  )
  assert np.asarray(fresh).tobytes() == np.asarray(grafted).tobytes()
