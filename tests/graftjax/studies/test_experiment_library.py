"""The work of the experiment scripts, called as library functions.

Each experiments/*.py is a thin absl main over a function in graftjax.studies
(tests/test_experiments.py checks the shape); here the pieces a main relies on:
the tables it prints reproduce the committed ones, and bad settings are refused
before anything runs.
"""

import pathlib

import pytest

from graftjax import ledger
from graftjax.studies.kernels import bench_attention_tiles
from graftjax.studies.kernels import bench_kernels
from graftjax.studies.graft import bench_graft
from graftjax.studies.model import bench_model
from graftjax.studies.graft import graft_gate
from graftjax.studies.kernels import invariance
from graftjax.studies.position import position_findings
from graftjax.studies.position import position_sweep

RESULTS = pathlib.Path(__file__).resolve().parents[3] / 'experiments' / 'results'


@pytest.mark.parametrize('stem', ['exactness_cpu', 'exactness_cpu_bfloat16', 'exactness_h200'])
def test_exactness_table_is_the_committed_one(stem):
  result = ledger.verify_result(RESULTS / 'exactness' / f'{stem}.json')
  table = '\n\n'.join(graft_gate.format_table(run) for run in result['runs']) + '\n'
  assert table == (RESULTS / 'exactness' / f'{stem}.txt').read_text()


def test_tables_of_committed_results_name_every_row():
  inv = ledger.verify_result(RESULTS / 'invariance' / 'invariance_h200.json')
  assert len(invariance.format_table(inv).splitlines()) == 3 + len(inv['cells'])
  reloc = ledger.verify_result(RESULTS / 'relocation' / 'relocation_270m_cpu.json')
  lines = position_sweep.format_table(reloc).splitlines()
  assert len(lines) == 2 + len(reloc['cells']) + len(reloc['composition'])
  graft = ledger.verify_result(RESULTS / 'graft_speed' / 'bench_graft_cpu.json')
  assert len(bench_graft.format_rows(graft).splitlines()) == len(graft['rows'])


def test_position_findings_cite_each_file_digest():
  reloc, trained = (
    RESULTS / 'relocation' / 'relocation_trained_tiny_alibi.json',
    RESULTS / 'relocation' / 'trained_tiny_alibi_model.json',
  )
  text = position_findings.findings(relocation_paths=[reloc], training_paths=[trained])
  for path in (reloc, trained):
    assert ledger.verify_result(path)['result_sha256'] in text


def test_bad_settings_are_refused_before_anything_runs():
  with pytest.raises(ValueError, match='A:B'):
    position_sweep.parse_pairs(['64'])
  assert position_sweep.parse_pairs(['64:4096']) == [(64, 4096)]
  with pytest.raises(ValueError, match='block_q,block_k'):
    bench_attention_tiles.sweep(
      bench_attention_tiles.Settings(
        candidates={'float32': ['4,32,256,4', '4,32']},
        decode_lengths=[64],
        prefill_lengths=[],
        iters=1,
        time_budget_s=1.0,
        interpret=True,
      )
    )
  with pytest.raises(ValueError, match='unknown kernels'):
    bench_kernels.run_benchmarks(
      bench_kernels.Settings(lengths=[64], aux_lengths=[1], kernels=['rms_norm', 'softmax'])
    )
  with pytest.raises(ValueError, match='--impl=xla'):
    bench_model.experiment(
      bench_model.Settings(
        dtypes=['float32'],
        impls=['pallas'],
        per_op=True,
        weights='random',
        model_name='tiny',
        prompt_tokens=8,
        decode_tokens=1,
        chunk_size=8,
      )
    )
