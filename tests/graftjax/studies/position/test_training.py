"""Training a tiny byte-level model: the loss goes down, checkpoints round-trip bit-exactly."""

import json

import jax
import numpy as np
import pytest

from graftjax.studies.position import training
from graftjax.models.gemma import checkpoint

SETTINGS = training.Settings(
  steps=20, batch=8, seq_len=32, learning_rate=1e-2, warmup_steps=2, eval_every=10, eval_batches=1
)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  data = training.load_corpus(held_out_every=4, max_files=12)
  config = training.small_config('tiny', scheme='alibi')
  result = training.train(config=config, settings=SETTINGS, data=data)
  path = tmp_path_factory.mktemp('ckpt') / 'tiny_alibi'
  training.save(path, config=config, result=result, settings=SETTINGS, data=data)
  return config, result, path


def test_split_is_by_file_and_deterministic():
  data = training.load_corpus(held_out_every=4, max_files=12)
  assert data.held_out_files and data.train_files
  assert not set(data.held_out_files) & set(data.train_files)
  assert all(training.is_held_out(f, 4) for f in data.held_out_files)
  assert data.train[0] == data.held_out[0] == 2  # every file starts with BOS
  assert training.load_corpus(held_out_every=4, max_files=12).to_json() == data.to_json()


@pytest.mark.slow
def test_loss_goes_down(trained):
  _, result, _ = trained
  assert result.train_loss.shape == (SETTINGS.steps,)
  assert result.train_loss[-5:].mean() < result.train_loss[:5].mean() - 0.5
  assert [step for step, _ in result.held_out] == [10, 20]
  assert result.held_out[-1][1] < result.held_out[0][1]


def test_checkpoint_round_trip_is_bit_exact(trained):
  config, result, path = trained
  model = training.load_trained(path)
  assert model.config == config
  for a, b in zip(jax.tree.leaves(result.params), jax.tree.leaves(model.params)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  assert model.params_digest == checkpoint.params_digest(result.params)


def test_loaded_fingerprint_is_stable_and_recorded(trained):
  _, _, path = trained
  record = training.load_record(path)
  assert training.load_trained(path).fingerprint == record['model_fingerprint']
  assert training.load_trained(path).fingerprint == record['model_fingerprint']
  assert record['held_out_loss'] == pytest.approx(record['history']['held_out'][-1][1])


def test_edited_record_is_refused(trained, tmp_path):
  _, _, path = trained
  record = json.loads((path / training.MODEL_JSON).read_text())
  record['held_out_loss'] = 0.0
  (tmp_path / training.MODEL_JSON).write_text(json.dumps(record))
  with pytest.raises(ValueError, match='result digest'):
    training.load_trained(tmp_path)


def test_save_refuses_an_existing_folder(trained):
  config, result, path = trained
  with pytest.raises(FileExistsError):
    training.save(path, config=config, result=result, settings=SETTINGS, data=None)
