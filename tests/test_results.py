"""Every committed result file still matches its own digest, and its headline holds."""

import json
import pathlib

import pytest

from graftjax.studies import invariance
from graftjax import ledger

RESULTS = pathlib.Path(__file__).resolve().parents[1] / 'experiments' / 'results'


@pytest.mark.parametrize(
  'path', sorted(RESULTS.glob('**/*.json')), ids=lambda p: str(p.relative_to(RESULTS))
)
def test_result_file_verifies(path):
  ledger.verify_result(path)


def test_h200_gate_summary_matches_its_samples():
  result = json.loads((RESULTS / 'exactness_h200.json').read_text())
  for run in result['runs']:
    samples = run['samples']
    byte_equal = sum(s['fresh_vs_grafted']['logits']['byte_equal'] for s in samples)
    assert byte_equal == run['summary']['fresh_vs_grafted']['byte_equal'] == len(samples)
    assert all(
      s['fresh_vs_grafted']['logits']['sha256_reference']
      == s['fresh_vs_grafted']['logits']['sha256_candidate']
      for s in samples
    )


def _runs_by_digest():
  return {
    ledger.verify_result(p)['result_sha256']: ledger.verify_result(p)
    for p in (RESULTS / 'runs').glob('*.json')
  }


# The current kernels (S split in parallel) and the earlier ones that walked
# the whole cache in one program per query block.
KERNEL_GENERATIONS = ('', '_sequential_kernels')
# The current kernels over a 1,024-slot cache (several splits), both dtypes.
LONG_RUNS = ('_long_float32', '_long_bfloat16')


@pytest.mark.parametrize('suffix', KERNEL_GENERATIONS + LONG_RUNS)
def test_h200_invariance_table_follows_from_its_committed_shards(suffix):
  result = ledger.verify_result(RESULTS / f'invariance_h200{suffix}.json')
  runs = _runs_by_digest()
  shards = [runs[s['result_sha256']] for s in result['shards']]  # every shard is committed
  samples = [record for shard in shards for record in shard['samples']]
  assert samples == result['samples']
  assert invariance.merge_cells(samples) == result['cells']
  assert result['samples_run'] == len(samples)
  for record in samples:
    for cell in record['cells']:
      if cell['rows_byte_equal'] == cell['rows']:
        assert cell['sha256_rows'] == [record['sha256_single_pass']]


@pytest.mark.parametrize('suffix', KERNEL_GENERATIONS)
def test_h200_kernel_determinism_follows_from_its_committed_runs(suffix):
  result = ledger.verify_result(RESULTS / f'kernel_determinism_h200{suffix}.json')
  runs = _runs_by_digest()
  found = [runs[r['result_sha256']] for r in result['runs']]
  assert len({r['process']['pid'] for r in found}) == len(found) >= 2
  for name, digests in result['digests'].items():
    assert digests == sorted({r['digests'][name] for r in found})
  assert result['identical'] == all(len(d) == 1 for d in result['digests'].values())


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_h200_per_op_costs_follow_from_their_rows(dtype):
  result = ledger.verify_result(RESULTS / f'bench_model_per_op_h200_{dtype}.json')
  assert result['determinism']['device_kind'] == 'NVIDIA H200'
  rows = result['rows']
  xla = rows[f'graftjax_{dtype}_xla']
  for name, cost in [
    ('pallas', result['invariance_cost'][dtype]),
    *[(f'xla+{op}=pallas', c) for op, c in result['per_op_cost'][dtype].items()],
  ]:
    other = rows[f'graftjax_{dtype}_{name}']
    assert cost == {k: xla[k] / other[k] - 1 for k in xla}
