"""Chunk- and batch-invariance of the whole model with the Pallas kernels.

With impl='pallas' (interpret mode on CPU), a grafted continuation equals a
single-pass prefill byte for byte at every chunk and batch size; with
impl='xla' the same comparison fails, so the test can fail.
"""

import dataclasses
import pathlib
import sys

import numpy as np
import pytest

from graftjax.studies.common import corpus
from graftjax.studies.kernels import invariance
from graftjax import ledger
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

RNG = np.random.default_rng(21)
SAMPLE = corpus.TextSample(
  source='random',
  prefix_ids=tuple(int(t) for t in RNG.integers(3, 256, 17)),
  continuation_ids=tuple(int(t) for t in RNG.integers(3, 256, 6)),
)
# Compiling the model for the Pallas interpreter is what costs (each chunk and batch shape
# is one program, about linear in the layers): a shorter sample that still spans two chunks
# of 7 and, one token at a time, a dozen calls.
SHORT = dataclasses.replace(
  SAMPLE, prefix_ids=SAMPLE.prefix_ids[:10], continuation_ids=SAMPLE.continuation_ids[:3]
)
# The tiny model cut to one sliding-window layer and one global one: both kinds of attention,
# a third of the six layers' programs to compile.
LAYERS = (config_lib.AttentionType.LOCAL_SLIDING, config_lib.AttentionType.GLOBAL)


def cells(impl, tmp_path, dot_precision='highest', sample=SHORT, chunk_sizes=(1, 7)):
  model = gemma_model.tiny(impl=impl, attention_types=LAYERS).with_dot_precision(dot_precision)
  return invariance.run_invariance(
    model=model,
    samples=[sample],
    chunk_sizes=chunk_sizes,
    batch_sizes=(1, 3),
    capacity=64,
    store_root=tmp_path / impl,
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  ('dot_precision', 'chunk_sizes'),
  # One-token chunks (the decode path's shapes) under the default precision; bf16x3 changes
  # the dots, not the chunking, so it runs the two-chunks-and-a-partial schedule only.
  [('highest', (1, 7)), ('bf16x3', (7,))],
)
def test_pallas_grafted_equals_single_pass(tmp_path, dot_precision, chunk_sizes):
  for cell in cells('pallas', tmp_path, dot_precision, chunk_sizes=chunk_sizes)['cells']:
    assert cell['samples_byte_equal'] == 1, cell
    assert cell['rows_kl_max'] == 0.0


@pytest.mark.slow
def test_xla_grafted_differs_from_single_pass(tmp_path):
  found = cells('xla', tmp_path)['cells']
  assert any(cell['samples_byte_equal'] == 0 for cell in found)
  assert all(cell['rows_argmax_agreement'] == 1.0 for cell in found)


@pytest.mark.slow
def test_per_sample_records_carry_the_single_pass_digest(tmp_path):
  # The programs of the Pallas test's chunks of 7: compiled once where both run in one process.
  (record,) = cells('pallas', tmp_path, chunk_sizes=(7,))['samples']
  for cell, batch_size in zip(record['cells'], (1, 3), strict=True):
    assert cell['rows'] == batch_size and cell['rows_byte_equal'] == batch_size
    assert cell['sha256_rows'] == [record['sha256_single_pass']]


def _command(*flags):
  script = pathlib.Path(__file__).parents[4] / 'experiments' / 'invariance.py'
  return [sys.executable, str(script), '--model=tiny', '--impl=xla', *flags]


@pytest.mark.slow
def test_shards_merge_into_the_unsharded_table(tmp_path, run_together):
  common = [
    '--samples=3',
    '--prefix_tokens=8',
    '--continuation_tokens=2',
    '--chunk_sizes=1,4',
    '--batch_sizes=1,2',
  ]
  paths = [tmp_path / f'{name}.json' for name in ('whole', 'a', 'b', 'merged')]
  # The whole run first, then the two shards together: where the run has a persistent
  # compilation cache (`make test`), the shards read the whole run's programs from it.
  runs = run_together(_command(*common, f'--out={paths[0]}'))
  runs += run_together(
    _command(*common, '--shard=0', '--num_shards=2', f'--out={paths[1]}'),
    _command(*common, '--shard=1', '--num_shards=2', f'--out={paths[2]}'),
  )
  for proc in runs:
    assert proc.returncode == 0, proc.stderr[-2000:]
  (proc,) = run_together(_command(f'--merge={paths[2]},{paths[1]}', f'--out={paths[3]}'))
  assert proc.returncode == 0, proc.stderr[-2000:]
  whole, a, b, merged = (ledger.verify_result(p) for p in paths)
  assert merged['cells'] == whole['cells']
  assert [s['sha256_single_pass'] for s in merged['samples']] == [
    s['sha256_single_pass'] for s in whole['samples']
  ]
  assert [s['samples'] for s in merged['shards']] == [[0, 2], [2, 3]]
  assert merged['complete'] and merged['samples_run'] == 3

  partial = invariance.merge_shards([a], 'partial')
  assert not partial['complete'] and partial['samples_run'] == 2
  assert all(cell['samples'] == 2 for cell in partial['cells'])
  with pytest.raises(ValueError, match='cover samples'):
    invariance.merge_shards([b], 'gap')
  with pytest.raises(ValueError, match='cover samples'):
    invariance.merge_shards([a, a, b], 'overlap')
  with pytest.raises(ValueError, match='dtype'):
    invariance.merge_shards([a, {**b, 'dtype': 'bfloat16'}], 'other run')
  b['determinism']['jax_version'] = 'other'
  with pytest.raises(ValueError, match='jax_version'):
    invariance.merge_shards([a, b], 'other jax')


def test_shard_ranges_tile_the_samples():
  ranges = [invariance.shard_range(50, i, 10) for i in range(10)]
  assert [i for r in ranges for i in r] == list(range(50))
  assert invariance.shard_range(50, 0, 5) == range(0, 10)
  with pytest.raises(ValueError):
    invariance.shard_range(50, 5, 5)
