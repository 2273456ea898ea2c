"""Our float32 gemma-3-270m against HF transformers and llama.cpp.

The fixtures (tests/fixtures/{hf,llamacpp}_reference.json) hold real text
from files on the build machine, its llama.cpp token ids, HF's float32 logits
(top-20 ids and values, full-vocabulary log-sum-exp, argmax, a 32-token
greedy continuation with its margins) and llama.cpp's logits for the same
GGUF; scripts/reference/ makes them, with torch and llama.cpp that these
tests do not need.

Running all 24 fixture prompts (13,437 tokens plus 24 x 32 greedy steps)
takes ~12 minutes on two CPU cores, so pytest runs the deterministic subset
`SUBSET` (612 tokens: a one-chunk prompt and one of five chunks beyond the
512-token sliding window), once for all its checks; `experiments/reference_agreement.py`
runs the full set and commits its figures to
experiments/results/reference_agreement/reference_agreement.json.

The negative tests check that the comparison has teeth: adding the RMSNorm
+1 a second time (max |Δ| ~53), dropping the sliding window (~9.9) or letting
it see one key too many (~0.27) must break the 2e-3 tolerance.
"""

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from graftjax.studies.model import reference_agreement

_ROOT = pathlib.Path(__file__).resolve().parents[3]
_FIXTURES = _ROOT / 'tests' / 'fixtures'

# Deterministic subset for pytest; the experiment script runs all prompts.
SUBSET = (
  'bsd_license_word',  # 2 tokens: BOS and one word
  'fractions_module',  # 610: past the sliding window
)
_SLIDING_WINDOW_PROMPT = 'fractions_module'
_NORM_PROMPT = 'apache2_head'

_NORM_KEYS = ('attn_norm', 'post_attn_norm', 'ffn_norm', 'post_ffn_norm', 'q_norm', 'k_norm')


def _load_json(name):
  return json.loads((_FIXTURES / name).read_text(encoding='utf-8'))


@pytest.fixture(scope='module')
def hf_fixture():
  return _load_json('hf_reference.json')


@pytest.fixture(scope='module')
def llamacpp_fixture():
  return _load_json('llamacpp_reference.json')


@pytest.fixture(scope='module')
def agreement():
  """The library behind experiments/reference_agreement.py."""
  return reference_agreement


def _record(fixture, name):
  (record,) = [p for p in fixture['prompts'] if p['name'] == name]
  return record


def test_fixtures_hold_the_same_prompts(hf_fixture, llamacpp_fixture):
  hf_names = [p['name'] for p in hf_fixture['prompts']]
  assert hf_names == [p['name'] for p in llamacpp_fixture['prompts']]
  assert len(hf_names) >= 20
  assert hf_fixture['gguf']['sha256'] == llamacpp_fixture['gguf']['sha256']
  lengths = []
  for hf, llama in zip(hf_fixture['prompts'], llamacpp_fixture['prompts']):
    ids = hf['token_ids']
    assert ids == llama['token_ids']
    assert ids[0] == 2  # BOS
    assert len(hf['argmax']) == len(hf['lse']) == len(llama['top1']) == len(ids)
    assert len(hf['greedy']['token_ids']) == len(hf['greedy']['margins']) == 32
    assert hf['topk']['positions'] == llama['topk']['positions']
    assert np.shape(hf['topk']['ids']) == (len(hf['topk']['positions']), 20)
    lengths.append(len(ids))
  assert min(lengths) <= 2 and max(lengths) >= 1400
  assert sum(n > 600 for n in lengths) >= 5


def test_subset_reaches_beyond_the_sliding_window(hf_fixture):
  window = 512
  lengths = [len(_record(hf_fixture, name)['token_ids']) for name in SUBSET]
  assert max(lengths) > 600 > window
  assert len(_record(hf_fixture, _SLIDING_WINDOW_PROMPT)['token_ids']) > window


@pytest.mark.slow
@pytest.mark.real_model
def test_subset_matches_hf_logits_and_greedy_and_llamacpp_top1(
  real_model, agreement, hf_fixture, llamacpp_fixture
):
  """One run of `SUBSET` (one test, so that two workers do not each run it): HF's logits
  and greedy continuations, and llama.cpp's top-1."""
  figures = agreement.compare(
    real_model, hf_fixture=hf_fixture, llamacpp_fixture=llamacpp_fixture, prompt_names=SUBSET
  )
  tolerance = agreement.LOGIT_TOLERANCE
  for name, row in figures['prompts'].items():
    hf = row['hf']
    assert hf['topk_max_abs_diff'] <= tolerance, (name, hf)
    assert hf['lse_max_abs_diff'] <= tolerance, (name, hf)
    assert hf['greedy_ok'], (name, hf)
  llama = figures['overall']['llamacpp']
  print(
    f'llama.cpp on {llama["tokens"]} positions: top-1 {100 * llama["top1_agreement"]:.2f}%,'
    f' |Δlogit| mean {llama["topk_mean_abs_diff"]:.4f} p99 {llama["topk_p99_abs_diff"]:.4f}'
  )
  assert llama['top1_agreement'] >= agreement.LLAMACPP_TOP1_MIN, llama


def _hf_max_abs_diff(agreement, model, record, *, from_position=0):
  """Max |Δlogit| against HF's top-20 at positions >= from_position (a cache of the prompt's
  padded length: attention walks no empty slots)."""
  positions = np.asarray(record['topk']['positions'])
  keep = positions >= from_position
  ids = np.asarray(record['topk']['ids'])[keep]
  chunk_size = 128
  run = agreement.run_prompt(
    model,
    record['token_ids'],
    requests={'hf': (positions[keep], ids)},
    chunk_size=chunk_size,
    greedy_steps=0,
    capacity=-(-len(record['token_ids']) // chunk_size) * chunk_size,
  )
  theirs = np.asarray(record['topk']['logits'], np.float32)[keep]
  return float(np.abs(run.gathered['hf'].astype(np.float64) - theirs).max())


@pytest.mark.slow
@pytest.mark.real_model
def test_norm_plus_one_twice_is_caught(real_model, agreement, hf_fixture):
  def plus_one(layer):
    return {k: (v + 1.0 if k in _NORM_KEYS else v) for k, v in layer.items()}

  params = dict(real_model.params)
  params['layers'] = tuple(plus_one(layer) for layer in params['layers'])
  params['final_norm'] = params['final_norm'] + 1.0
  broken = dataclasses.replace(real_model, params=params)
  diff = _hf_max_abs_diff(agreement, broken, _record(hf_fixture, _NORM_PROMPT))
  assert diff > agreement.LOGIT_TOLERANCE


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.parametrize('wrong_window', [1 << 30, 513], ids=['no_window', 'off_by_one'])
def test_a_wrong_sliding_window_is_caught(real_model, agreement, hf_fixture, wrong_window):
  """No window at all, or one key too many (distance <= 512 instead of < 512)."""
  window = real_model.config.sliding_window
  broken = dataclasses.replace(
    real_model, config=real_model.config.replace(sliding_window=wrong_window)
  )
  record = _record(hf_fixture, _SLIDING_WINDOW_PROMPT)
  diff = _hf_max_abs_diff(agreement, broken, record, from_position=window)
  assert diff > agreement.LOGIT_TOLERANCE
