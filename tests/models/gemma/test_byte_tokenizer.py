"""The tiny and random-weight models' byte tokenizer (models/gemma/tokenizer.py)."""

import dataclasses

import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import tokenizer as tokenizer_lib


def test_bytes_round_trip_with_one_token_blank_lines_and_fences():
  tok = tokenizer_lib.ByteTokenizer()
  text = 'Question: f\u00fcr x?\n\nFinal answer:\n```python\nx = 1\n```\n\n\n'
  ids = tok.encode(text)
  assert ids[0] == tok.bos_id == 2
  assert ids.count(3) == 2 and ids.count(4) == 2  # '\n\n' (the third newline a byte), '```'
  assert tok.decode(ids, skip_special=True) == text
  assert tok.decode(ids).startswith('<bos>Question')
  assert tok.encode('ab', add_bos=False) == [97, 98]


def test_control_text_is_read_only_when_asked():
  tok = tokenizer_lib.ByteTokenizer()
  assert tok.encode('<eos>', add_bos=False) == [1]
  assert tok.encode('<eos>', add_bos=False, parse_special=False) == list(b'<eos>')


def test_bytes_without_an_id_and_ids_out_of_range_are_refused():
  tok = tokenizer_lib.ByteTokenizer()
  with pytest.raises(ValueError, match=r'byte 0x01 at byte offset 2'):
    tok.encode('ab\x01', add_bos=False)
  with pytest.raises(ValueError, match=r'not an integer in \[0, 256\)'):
    tok.decode([256])
  with pytest.raises(ValueError, match='at least 256'):
    tokenizer_lib.ByteTokenizer(100)
  assert tokenizer_lib.ByteTokenizer(300).decode([299, 104]) == 'h'  # unused ids read as nothing


def test_tiny_and_random_models_carry_it_and_keep_their_fingerprints():
  """The built-in byte tokenizer enters the fingerprint as no tokenizer did, so blocks and
  results recorded before models carried it keep naming them; another tokenizer changes it."""
  tiny = gemma_model.tiny()
  assert isinstance(tiny.tokenizer, tokenizer_lib.ByteTokenizer)
  assert tiny.tokenizer.vocab_size == tiny.config.vocab_size
  assert tokenizer_lib.ByteTokenizer(256).digest() != tokenizer_lib.ByteTokenizer(300).digest()
  assert gemma_model.random(config_lib.tiny(vocab_size=300)).tokenizer.vocab_size == 300
  bare = gemma_model.from_params(tiny.config, tiny.params, params_digest=tiny.params_digest)
  assert bare.tokenizer is None and bare.fingerprint == tiny.fingerprint

  class Other(tokenizer_lib.ByteTokenizer):
    def digest(self):
      return 'f' * 64

  other = dataclasses.replace(tiny, tokenizer=Other(tiny.config.vocab_size))
  assert other.fingerprint != tiny.fingerprint
