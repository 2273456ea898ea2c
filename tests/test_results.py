"""Every committed result file still matches its own digest, and its headline holds."""

import json
import pathlib

import pytest

from graftjax import ledger

RESULTS = pathlib.Path(__file__).resolve().parents[1] / 'experiments' / 'results'


@pytest.mark.parametrize('path', sorted(RESULTS.glob('*.json')), ids=lambda p: p.name)
def test_result_file_verifies(path):
  ledger.verify_result(path)


def test_h200_gate_summary_matches_its_samples():
  result = json.loads((RESULTS / 'exactness_h200.json').read_text())
  for run in result['runs']:
    samples = run['samples']
    byte_equal = sum(s['fresh_vs_grafted']['logits']['byte_equal'] for s in samples)
    assert byte_equal == run['summary']['fresh_vs_grafted']['byte_equal'] == len(samples)
    assert all(s['fresh_vs_grafted']['logits']['sha256_reference']
               == s['fresh_vs_grafted']['logits']['sha256_candidate'] for s in samples)
