"""The position sweep on the tiny model: structure, and which arms are byte-exact.

Block 12 + continuation 4 tokens in chunks of 4 over 16 slots: the shapes
test_relocation.py compiles, so the two files share compiled programs.
"""

import dataclasses
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from graftjax.studies.common import corpus
from graftjax import exactness
from graftjax import ledger
from graftjax.studies.position import position_sweep
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import schemes

SCHEMES = schemes.names()
OFFSETS = (0, 7, 4096)
PAIR = (16, 900)
RELATIVE = tuple(s.name for s in schemes.registered() if s.relocation_exact)
REPO = pathlib.Path(__file__).resolve().parents[4]
LAYOUT = position_sweep.layout_for(block_tokens=12, continuation_tokens=4, chunk_size=4)


def _samples():
  rng = np.random.default_rng(5)
  ids = [int(t) for t in rng.integers(3, 256, 16)]
  return [
    corpus.TextSample(source='random', prefix_ids=tuple(ids[:12]), continuation_ids=tuple(ids[12:]))
  ]


@pytest.fixture(scope='module')
def result():
  seen = []
  out = position_sweep.run_sweep(
    model_factory=lambda scheme, dtype: gemma_model.tiny().with_position_scheme(scheme),
    schemes=SCHEMES,
    dtypes=('float32',),
    offsets=OFFSETS,
    samples=_samples(),
    layout=LAYOUT,
    composition_offsets=(PAIR,),
    progress=lambda it: seen.append(len(it)) or it,
  )
  out['progress_total'] = seen[0]
  return out


@pytest.mark.slow
def test_result_structure(result):
  assert result['progress_total'] == len(SCHEMES) * (len(OFFSETS) + 1)
  assert len(result['cells']) == len(SCHEMES) * len(OFFSETS)
  assert [c['offsets'] for c in result['composition']] == [list(PAIR)] * len(SCHEMES)
  assert {m['scheme'] for m in result['models']} == set(SCHEMES)
  assert len({m['fingerprint'] for m in result['models']}) == len(SCHEMES)
  assert result['layout'] == {'capacity': 16, 'chunk_size': 4}
  assert len(result['samples'][0]['block_sha256']) == 64
  for c in result['cells']:
    for arm in position_sweep.ARMS:
      assert c[arm]['samples'] == 1 and c[arm]['rows'] == 4
      assert len(c[arm]['per_sample']) == 1


@pytest.mark.slow
def test_own_position_is_byte_equal_everywhere(result):
  assert all(c['own_position']['byte_equal'] == 1 for c in result['cells'])
  assert all(c['own_position']['kl_max'] == 0.0 for c in result['cells'])


@pytest.mark.slow
def test_relocation_is_exact_only_without_absolute_positions(result):
  for c in result['cells']:
    exact = c['scheme'] in RELATIVE or c['offset'] == 0
    assert c['relocated']['byte_equal'] == int(exact), c
    assert (c['relocated']['kl_max'] == 0.0) == exact
    assert c['relocated']['max_abs_diff'] < 1e-3


@pytest.mark.slow
def test_graft_free_control_is_exact_only_without_absolute_positions(result):
  for c in result['cells']:
    assert c['control']['byte_equal'] == int(c['scheme'] in RELATIVE or c['offset'] == 0), c


@pytest.mark.slow
def test_composition_is_exact_only_without_absolute_positions(result):
  for c in result['composition']:
    assert c['byte_equal'] == int(c['scheme'] in RELATIVE), c


@pytest.mark.slow
def test_cell_lookup(result):
  assert position_sweep.cell(result, scheme='alibi', dtype='float32', offset=7)['offset'] == 7
  with pytest.raises(KeyError):
    position_sweep.cell(result, scheme='alibi', dtype='bfloat16', offset=7)


def test_figures_count_argmax_flips():
  ref = np.array([[0.0, 1.0], [2.0, 0.0], [0.0, 1.0]], np.float32)
  cand = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]], np.float32)
  f = position_sweep.figures(ref, cand)
  assert f['argmax_flips'] == 1 and not f['byte_equal'] and f['max_abs_diff'] == 1.0


def test_figures_of_equal_logits_match_the_gate():
  ref = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
  f = position_sweep.figures(ref, ref.copy())
  c = exactness.compare(ref, ref.copy())
  assert f['byte_equal'] and f['rows'] == c.rows == 3
  assert (f['kl_mean'], f['kl_max'], f['max_abs_diff']) == (c.kl_mean, c.kl_max, c.max_abs_diff)
  assert f['sha256_reference'] == f['sha256_candidate'] == c.sha256_reference


def test_refuses_offsets_beyond_the_position_table():
  model = dataclasses.replace(gemma_model.tiny(position_scheme='rope_f64'), table_size=64)
  with pytest.raises(ValueError, match='position table'):
    position_sweep.run_sweep(
      model_factory=lambda scheme, dtype: model,
      schemes=('rope_f64',),
      dtypes=('float32',),
      offsets=(64,),
      samples=_samples(),
      layout=LAYOUT,
    )


def test_refuses_overlapping_composition():
  with pytest.raises(ValueError, match='B must start after A'):
    position_sweep.run_sweep(
      model_factory=None,
      schemes=('nope',),
      dtypes=('float32',),
      offsets=(0,),
      samples=_samples(),
      composition_offsets=((10, 12),),
      layout=LAYOUT,
    )


def test_findings_cite_the_result_digest(result, tmp_path):
  path = tmp_path / 'relocation.json'
  digest = ledger.write_result(
    path,
    {
      **result,
      'command': 'test',
      'model': 'tiny',
      'device': 'cpu',
      'inputs': {},
      'determinism': {
        'jax_version': 'x',
        'backend': 'cpu',
        'jax_default_matmul_precision': 'highest',
      },
    },
  )
  out = subprocess.run(
    [sys.executable, str(REPO / 'experiments' / 'position_findings.py'), f'--relocation={path}'],
    check=True,
    capture_output=True,
    text=True,
    timeout=120,
  ).stdout
  assert f'result_sha256 `{digest}`' in out
  assert '| alibi | float32 | 4096 | 1/1 | 0 | 0 | 0 | 0/4 |' in out
  assert '| rope | float32 | 4096 | 0/1 |' in out
