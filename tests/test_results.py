"""Every committed result file still matches its own digest, and its headline holds."""

import json
import pathlib

import pytest

from graftjax import ledger
from graftjax.studies.kernels import invariance
from graftjax.studies.common import results_page

RESULTS = pathlib.Path(__file__).resolve().parents[1] / 'experiments' / 'results'


@pytest.mark.parametrize(
  'path', sorted(RESULTS.glob('**/*.json')), ids=lambda p: str(p.relative_to(RESULTS))
)
def test_result_file_verifies(path):
  ledger.verify_result(path)


def test_h200_gate_summary_matches_its_samples():
  result = json.loads((RESULTS / 'exactness' / 'exactness_h200.json').read_text())
  for run in result['runs']:
    samples = run['samples']
    byte_equal = sum(s['fresh_vs_grafted']['logits']['byte_equal'] for s in samples)
    assert byte_equal == run['summary']['fresh_vs_grafted']['byte_equal'] == len(samples)
    assert all(
      s['fresh_vs_grafted']['logits']['sha256_reference']
      == s['fresh_vs_grafted']['logits']['sha256_candidate']
      for s in samples
    )


def _runs_by_digest(study):
  return {
    ledger.verify_result(p)['result_sha256']: ledger.verify_result(p)
    for p in (RESULTS / study / 'runs').glob('*.json')
  }


# The current kernels (S split in parallel) and the earlier ones that walked
# the whole cache in one program per query block.
KERNEL_GENERATIONS = ('', '_sequential_kernels')
# The current kernels over a 1,024-slot cache (several splits), both dtypes.
LONG_RUNS = ('_long_float32', '_long_bfloat16')


@pytest.mark.parametrize('suffix', KERNEL_GENERATIONS + LONG_RUNS)
def test_h200_invariance_table_follows_from_its_committed_shards(suffix):
  result = ledger.verify_result(RESULTS / 'invariance' / f'invariance_h200{suffix}.json')
  runs = _runs_by_digest('invariance')
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
  result = ledger.verify_result(
    RESULTS / 'kernel_determinism' / f'kernel_determinism_h200{suffix}.json'
  )
  runs = _runs_by_digest('kernel_determinism')
  found = [runs[r['result_sha256']] for r in result['runs']]
  assert len({r['process']['pid'] for r in found}) == len(found) >= 2
  for name, digests in result['digests'].items():
    assert digests == sorted({r['digests'][name] for r in found})
  assert result['identical'] == all(len(d) == 1 for d in result['digests'].values())


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_h200_per_op_costs_follow_from_their_rows(dtype):
  result = ledger.verify_result(
    RESULTS / 'invariance_cost' / f'bench_model_per_op_h200_{dtype}.json'
  )
  assert result['determinism']['device_kind'] == 'NVIDIA H200'
  rows = result['rows']
  xla = rows[f'graftjax_{dtype}_xla']
  for name, cost in [
    ('pallas', result['invariance_cost'][dtype]),
    *[(f'xla+{op}=pallas', c) for op, c in result['per_op_cost'][dtype].items()],
  ]:
    other = rows[f'graftjax_{dtype}_{name}']
    assert cost == {k: xla[k] / other[k] - 1 for k in xla}


def _named_outputs():
  """(result, recorded path, digest) of every file a committed result says it wrote."""
  for study in results_page.studies(RESULTS):
    for r in study.results + study.runs:
      outputs = r.data.get('outputs')
      for recorded, digest in outputs.items() if isinstance(outputs, dict) else ():
        yield r, recorded, digest


@pytest.mark.parametrize('found', list(_named_outputs()), ids=lambda f: f'{f[0].name}:{f[1]}')
def test_every_output_a_result_names_is_committed_in_its_study(found):
  """`outputs` keep the path the run wrote to; the committed copy has the recorded bytes."""
  result, recorded, digest = found
  assert ledger.sha256_file(results_page.resolve(RESULTS, result, recorded)) == digest


def test_every_merged_run_is_committed_in_the_same_study():
  for study in results_page.studies(RESULTS):
    runs = {r.data['result_sha256'] for r in study.runs}
    for r in study.results:
      named = [s['result_sha256'] for s in r.data.get('shards', [])]
      named += [
        x['result_sha256']
        for x in r.data.get('runs', [])
        if isinstance(x, dict) and 'result_sha256' in x
      ]
      assert set(named) <= runs, (r.name, sorted(set(named) - runs))
