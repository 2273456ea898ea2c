"""A tokenizer larger than the model's vocabulary is refused at load, and token ids outside
[0, vocab_size) at every entry point (prefill, forward, generate), before anything runs."""

import dataclasses

import numpy as np
import pytest
from graftjax.errors import GraftjaxError
from graftjax.models.gemma import model, safetensors_io, sampler
from graftjax.models.gemma import tokenizer as tokenizer_lib

from tests.models.gemma import tokenizer_files


@pytest.fixture(scope='module')
def tiny():
  return model.tiny(vocab_size=400)  # room for `small_vocabulary`'s pieces


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_at_load(tiny, tmp_path):
  """A checkpoint folder whose tokenizer.json has 8 ids more than its embedding table."""
  vocab = tiny.config.vocab_size
  folder = safetensors_io.save(tiny.params, tiny.config, tmp_path / 'ckpt')
  tokenizer_files.write_all(folder, tokenizer_files.small_vocabulary(vocab + 8))
  with pytest.raises(model.VocabularyError) as e:
    model.load(weights=folder)
  assert f'{vocab + 8} ids' in str(e.value) and f'only {vocab}' in str(e.value)
  assert isinstance(e.value, GraftjaxError)
  with pytest.raises(model.VocabularyError):  # one passed in place of the weights' own
    model.load(weights=folder, tokenizer=folder / 'tokenizer.model')
  with pytest.raises(model.VocabularyError):
    dataclasses.replace(tiny, tokenizer=tokenizer_lib.ByteTokenizer(vocab + 1))


def test_a_tokenizer_no_larger_than_the_vocabulary_loads(tiny, tmp_path):
  folder = tokenizer_files.write_all(tmp_path, tokenizer_files.small_vocabulary(392))
  smaller = dataclasses.replace(tiny, tokenizer=model.hf_tokenizer.load(folder))
  assert smaller.tokenizer.vocab_size == 392 < tiny.config.vocab_size


@pytest.mark.parametrize('bad', [-1, 'vocab', 'vocab+5'])
def test_out_of_range_ids_are_refused_at_prefill_forward_and_generate(tiny, bad):
  vocab = tiny.config.vocab_size
  bad = {'vocab': vocab, 'vocab+5': vocab + 5}.get(bad, bad)
  ids = [2, 10, bad, 11]
  cache = tiny.init_cache(capacity=16)
  with pytest.raises(model.TokenIdError, match=rf'token id {bad} at index \(2,\)'):
    tiny.prefill(ids, cache=cache, chunk_size=2)
  assert int(cache.length) == 0  # refused before the first chunk ran
  with pytest.raises(model.TokenIdError, match=f'not in \\[0, {vocab}\\)'):
    tiny.forward([ids], [[0, 1, 2, 3]], cache)
  with pytest.raises(model.TokenIdError):
    sampler.generate(tiny, ids, max_new_tokens=2)


def test_ids_that_are_not_integers_or_overflow_int32_are_refused(tiny):
  cache = tiny.init_cache(capacity=16)
  with pytest.raises(model.TokenIdError, match='integers'):
    tiny.prefill(np.asarray([2.0, 3.0]), cache=cache, chunk_size=2)
  with pytest.raises(model.TokenIdError, match=str(2**40)):
    tiny.prefill([2, 2**40], cache=cache, chunk_size=2)


def test_ids_in_range_run(tiny):
  logits, _ = tiny.prefill(
    [0, tiny.config.vocab_size - 1], cache=tiny.init_cache(capacity=16), chunk_size=2
  )
  assert np.isfinite(np.asarray(logits)).all()
