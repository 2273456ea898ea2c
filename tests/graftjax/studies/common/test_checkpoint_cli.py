"""A checkpoint folder of one's own through the experiments' CLI: `--model=FOLDER`.

A tiny Gemma 3 exported as a Hugging Face folder (config.json, model.safetensors,
tokenizer.json, tokenizer.model, tokenizer_config.json) runs the flywheel, the needles and
the graft gate's generation; each result records the checkpoint's weights digest and its
tokenizer's.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import hf_tokenizer
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import safetensors_io
from tests.models.gemma import tokenizer_files

REPO = pathlib.Path(__file__).resolve().parents[4]


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  vocab = tokenizer_files.small_vocabulary()
  folder = tmp_path_factory.mktemp('my-gemma')
  source = gemma_model.random(config_lib.tiny(vocab_size=vocab.vocab_size), seed=5)
  safetensors_io.save(source.params, source.config, folder)
  tokenizer_files.write_all(folder, vocab)
  return folder


def _run(script, *flags, env=None):
  proc = subprocess.run(
    [sys.executable, str(REPO / 'experiments' / script), *flags],
    cwd=REPO,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu', **(env or {})},
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]


def _records_the_checkpoint(result, folder):
  loaded = gemma_model.load(weights=folder)
  assert isinstance(loaded.tokenizer, hf_tokenizer.HFTokenizer)  # tokenizer.json first
  inputs = result['inputs']
  assert inputs['params_sha256'] == loaded.params_digest
  assert inputs['tokenizer_sha256'] == loaded.tokenizer.digest()
  assert inputs['model_fingerprint'] == loaded.fingerprint
  assert 'gguf_sha256' not in inputs
  return result


@pytest.mark.slow  # three experiment processes on the tiny export
def test_the_flywheel_needles_and_generation_run_on_a_checkpoint_folder(checkpoint, tmp_path):
  out = tmp_path / 'flywheel.json'
  _run(
    'flywheel.py',
    '--task=my_task:TASK',
    f'--model={checkpoint}',
    '--max_new_tokens=4',
    '--recall_tokens=4',
    '--capacity=256',
    f'--out={out}',
    env={'PYTHONPATH': str(REPO / 'docs' / 'examples')},
  )
  result = json.loads(out.read_text())
  assert _records_the_checkpoint(result, checkpoint)['model'] == str(checkpoint)
  out = tmp_path / 'needle.json'
  _run(
    'needle.py',
    f'--model={checkpoint}',
    '--needles=2',
    '--page_tokens=128',
    '--pages_per_window=2',
    '--margin=16',
    '--answer_tokens=1',
    '--chunk_size=64',
    f'--store={tmp_path / "pages"}',
    f'--out={out}',
  )
  _records_the_checkpoint(json.loads(out.read_text()), checkpoint)
  out = tmp_path / 'exactness.json'
  _run(
    'exactness.py',
    f'--model={checkpoint}',
    '--samples=1',
    '--prefix_tokens=16',
    '--continuation_tokens=4',
    '--rollout_tokens=4',
    '--chunk_size=8',
    '--other_process=false',
    f'--out={out}',
  )
  (run,) = json.loads(out.read_text())['runs']  # one per dtype
  result = _records_the_checkpoint(run, checkpoint)
  assert result['summary']['rollout_fresh_vs_grafted']['samples'] == 1


def test_a_folder_that_is_not_there_is_refused_by_the_flag(tmp_path):
  proc = subprocess.run(
    [sys.executable, str(REPO / 'experiments' / 'flywheel.py'), f'--model={tmp_path / "nope"}'],
    cwd=REPO,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode != 0
  assert 'an existing checkpoint folder' in proc.stderr
