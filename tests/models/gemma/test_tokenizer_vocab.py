"""A tokenizer larger than the model's vocabulary is refused at load, and token ids outside
[0, vocab_size) at every entry point (prefill, forward, generate), before anything runs."""

import dataclasses

import numpy as np
import pytest
from graftjax.errors import GraftjaxError
from graftjax.models.gemma import model, safetensors_io, sampler

from tests.models.gemma import tokenizer_files


@pytest.fixture(scope='module')
def tiny():
  return model.tiny(vocab_size=400)  # room for `small_vocabulary`'s pieces


def test_a_tokenizer_with_text_past_the_vocabulary_is_refused_at_load(tmp_path):
  """A checkpoint folder whose tokenizer.json has text pieces past its embedding table."""
  small = model.tiny(vocab_size=384)  # the vocabulary's words sit at 380-390
  folder = safetensors_io.save(small.params, small.config, tmp_path / 'ckpt')
  tokenizer_files.write_all(folder, tokenizer_files.small_vocabulary(400))
  with pytest.raises(model.VocabularyError) as e:
    model.load(weights=folder)
  assert '400 ids but the model only 384' in str(e.value) and "id 384 ('in')" in str(e.value)
  assert isinstance(e.value, GraftjaxError)
  with pytest.raises(model.VocabularyError):  # one passed in place of the weights' own
    model.load(weights=folder, tokenizer=folder / 'tokenizer.model')


def test_a_tokenizer_no_larger_than_the_vocabulary_loads(tiny, tmp_path):
  folder = tokenizer_files.write_all(tmp_path, tokenizer_files.small_vocabulary(392))
  smaller = dataclasses.replace(tiny, tokenizer=model.hf_tokenizer.load(folder))
  assert smaller.tokenizer.vocab_size == 392 < tiny.config.vocab_size


def test_special_ids_past_the_vocabulary_load_and_are_refused_when_used(tiny, tmp_path):
  """As Gemma 3's tokenizer lists '<image_soft_token>' past the 1B's table: its control
  pieces past the table load; text that spells one is refused at the entry points."""
  folder = tokenizer_files.write_all(tmp_path, tokenizer_files.small_vocabulary(408))
  for name in ('tokenizer.json', 'tokenizer.model'):
    m = dataclasses.replace(tiny, tokenizer=model.hf_tokenizer.load(folder / name))
    ids = m.tokenizer.encode('the <unused112>')
    assert ids[-1] == 403  # '<unused112>'
    with pytest.raises(model.TokenIdError, match='token id 403'):
      m.prefill(ids, cache=m.init_cache(capacity=16), chunk_size=4)


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
