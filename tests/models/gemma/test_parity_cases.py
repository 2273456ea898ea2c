"""The parity fixture scripts' shared steps regenerate what the committed fixtures hold.

Without torch: each committed case's tokens, positions and vocabulary subset come again from
`scripts/reference/parity_cases.py` and the case tables of the two scripts, and a fixture
recorded from logits holds their argmax and top ids.
"""

import importlib
import json
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / 'tests' / 'fixtures'
SCRIPTS = {
  'gemma3_parity': 'make_gemma3_parity_fixture',
  'gemma4_parity': 'make_gemma4_parity_fixture',
}


@pytest.fixture
def scripts(monkeypatch):
  monkeypatch.syspath_prepend(str(ROOT / 'scripts' / 'reference'))
  return {kind: importlib.import_module(name) for kind, name in SCRIPTS.items()}


def _fixtures():
  return [(kind, path) for kind in SCRIPTS for path in sorted((FIXTURES / kind).glob('*.json'))]


@pytest.mark.parametrize('kind, path', _fixtures(), ids=lambda x: getattr(x, 'stem', x))
def test_a_committed_case_has_the_tokens_positions_and_subset_the_steps_make(scripts, kind, path):
  script = scripts[kind]
  fixture = json.loads(path.read_text())
  _, _, length = script.CASES[path.stem]
  vocab = fixture['meta']['config_json']['vocab_size']
  cases = script.parity_cases
  tokens = cases.case_tokens(length, vocab, script.SEED)
  assert tokens.tolist() == fixture['tokens']
  assert cases.case_positions(length).tolist() == fixture['positions']
  subset = np.sort(
    np.random.default_rng(script.SEED).choice(vocab, cases.VOCAB_SUBSET, replace=False)
  )
  assert subset.tolist() == fixture['subset_ids']


def test_every_case_has_a_committed_fixture(scripts):
  for kind, script in scripts.items():
    assert sorted(p.stem for p in (FIXTURES / kind).glob('*.json')) == sorted(script.CASES)


def test_a_record_holds_the_logits_top_ids_and_argmax(scripts, tmp_path):
  cases = scripts['gemma4_parity'].parity_cases
  tokens = cases.case_tokens(300, 64, seed=1)
  (tmp_path / 'case.json').write_text(json.dumps({'tokens': tokens.tolist(), 'params_digest': 'd'}))
  (tmp_path / 'config.json').write_text(json.dumps({'vocab_size': 64}))
  logits = np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32)
  recorded = cases.record('case', tmp_path, logits, seed=1, versions={'torch': 'x'})
  positions = cases.case_positions(300)
  assert recorded['positions'] == positions.tolist() and len(positions) == cases.NUM_POSITIONS
  assert recorded['argmax'] == logits[positions].argmax(-1).tolist()
  top = np.asarray(recorded['top_ids'])
  assert top.shape == (len(positions), cases.TOP_K)
  np.testing.assert_array_equal(
    recorded['top_logits'], -np.sort(-logits[positions], axis=-1)[:, : cases.TOP_K]
  )
  np.testing.assert_array_equal(
    recorded['subset_logits'], logits[positions][:, recorded['subset_ids']]
  )
  assert recorded['meta']['torch'] == 'x' and recorded['meta']['params_digest'] == 'd'
  cases.write(tmp_path / 'out', 'case', recorded)
  assert json.loads((tmp_path / 'out' / 'case.json').read_text()) == recorded
