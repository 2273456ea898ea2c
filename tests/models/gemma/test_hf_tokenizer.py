"""A checkpoint's own tokenizer (models/gemma/hf_tokenizer.py): tokenizer.json and tokenizer.model.

The files are written by tests/models/gemma/tokenizer_files.py from a vocabulary: a small one
for tiny exports, and the 270M's own (its GGUF's) for the real-model tests, which show ids,
text and experiment results equal to the GGUF path.
"""

import json
import os
import pathlib

import numpy as np
import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import gguf
from graftjax.models.gemma import hf_tokenizer
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import safetensors_io
from graftjax.models.gemma import tokenizer as tokenizer_lib
from tests.models.gemma import tokenizer_files

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'tokenizer_llamacpp.json'
TEXTS = [
  'the thin ant ran in there',
  '<start_of_turn>user\nthe <bos>\n\n```x``` \u00e9\u4e2d<end_of_turn>',
  '  the\t\tend  ',
  '',
]
# (file, fixture category): where a file's own library knowingly differs from the GGUF path.
KNOWN_DIFFERENCES = {
  ('tokenizer.model', 'literal_space_mark'): (
    'sentencepiece writes a space as U+2581 before it matches pieces, so a literal U+2581 in '
    'the text is read as a space and joins runs of spaces (user-defined pieces); the GGUF '
    'tokenizer and tokenizers cut user-defined pieces from the text before that replacement.'
  ),
}


@pytest.fixture(scope='module')
def small(tmp_path_factory):
  """(the vocabulary as a GGUF-style tokenizer, the folder of its two files)."""
  vocab = tokenizer_files.small_vocabulary()
  return vocab, tokenizer_files.write_all(tmp_path_factory.mktemp('small'), vocab)


@pytest.fixture(scope='module')
def tiny_export(small, tmp_path_factory):
  """A tiny Gemma 3 exported as a Hugging Face folder with both tokenizer files."""
  vocab, files = small
  source = gemma_model.random(config_lib.tiny(vocab_size=vocab.vocab_size), seed=3)
  folder = tmp_path_factory.mktemp('tiny_export')
  safetensors_io.save(source.params, source.config, folder)
  for name in (*hf_tokenizer.FILES, hf_tokenizer.TOKENIZER_CONFIG):
    (folder / name).write_bytes((files / name).read_bytes())
  return source, folder


@pytest.mark.parametrize('name', hf_tokenizer.FILES)
def test_both_files_give_the_vocabularys_ids_and_text(small, name):
  vocab, folder = small
  tok = hf_tokenizer.load(folder / name)
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id, tok.vocab_size) == (2, 1, 0, 3, 400)
  for text in TEXTS:
    for add_bos in (True, False):
      for special in (True, False):
        want = vocab.encode(text, add_bos=add_bos, parse_special=special)
        assert tok.encode(text, add_bos=add_bos, parse_special=special) == want, (text, special)
    ids = vocab.encode(text)
    for skip in (False, True):
      assert tok.decode(ids, skip_special=skip) == vocab.decode(ids, skip_special=skip)
  assert tok.encode('<start_of_turn>', add_bos=False) == [105]
  assert tok.encode('<start_of_turn>', add_bos=False, parse_special=False) != [105]
  with pytest.raises(ValueError, match=r'not an integer in \[0, 400\)'):
    tok.decode([400])


def test_a_folder_is_read_from_tokenizer_json_and_names_its_kind(small, tmp_path):
  _, folder = small
  assert isinstance(hf_tokenizer.load(folder), hf_tokenizer.HFTokenizer)
  (tmp_path / 'tokenizer.model').write_bytes((folder / 'tokenizer.model').read_bytes())
  assert isinstance(hf_tokenizer.beside(tmp_path), hf_tokenizer.SentencePieceTokenizer)
  json_digest = hf_tokenizer.load(folder / 'tokenizer.json').digest()
  assert json_digest != hf_tokenizer.load(tmp_path).digest()


def test_unreadable_missing_or_unknown_files_are_refused(tmp_path):
  assert hf_tokenizer.beside(tmp_path) is None
  with pytest.raises(hf_tokenizer.TokenizerFileError, match='holds no tokenizer'):
    hf_tokenizer.load(tmp_path)
  with pytest.raises(hf_tokenizer.TokenizerFileError, match='no such tokenizer file'):
    hf_tokenizer.load(tmp_path / 'tokenizer.json')
  (tmp_path / 'vocab.txt').write_text('a\n')
  with pytest.raises(hf_tokenizer.TokenizerFileError, match=r'a \.json \(tokenizers\)'):
    hf_tokenizer.load(tmp_path / 'vocab.txt')
  (tmp_path / 'tokenizer.json').write_text('{"not": "a tokenizer"}')
  with pytest.raises(hf_tokenizer.TokenizerFileError, match='tokenizers cannot read it'):
    hf_tokenizer.load(tmp_path / 'tokenizer.json')
  (tmp_path / 'tokenizer.model').write_bytes(b'\xff' * 64)
  with pytest.raises(hf_tokenizer.TokenizerFileError, match='sentencepiece cannot read it'):
    hf_tokenizer.load(tmp_path / 'tokenizer.model')


def test_tokenizer_config_names_the_special_tokens(small, tmp_path):
  vocab, folder = small
  for name in hf_tokenizer.FILES:
    (tmp_path / name).write_bytes((folder / name).read_bytes())
  tokenizer_files.write_tokenizer_config(tmp_path, vocab, eos_token='<end_of_turn>')
  assert hf_tokenizer.load(tmp_path / 'tokenizer.model').eos_id == 106
  tokenizer_files.write_tokenizer_config(tmp_path, vocab, eos_token={'content': '<nope>'})
  with pytest.raises(hf_tokenizer.TokenizerFileError, match="eos token '<nope>' is not"):
    hf_tokenizer.load(tmp_path / 'tokenizer.json')


def test_load_finds_the_tokenizer_beside_the_weights_and_fingerprints_it(tiny_export, tmp_path):
  source, folder = tiny_export
  found = gemma_model.load(weights=folder)
  assert isinstance(found.tokenizer, hf_tokenizer.HFTokenizer)
  chosen = gemma_model.load(weights=folder, tokenizer=folder / 'tokenizer.model')
  assert isinstance(chosen.tokenizer, hf_tokenizer.SentencePieceTokenizer)
  assert chosen.fingerprint != found.fingerprint  # the tokenizer's digest is in it
  bare = tmp_path / 'bare'
  safetensors_io.save(source.params, source.config, bare)
  assert gemma_model.load(weights=bare).tokenizer is None
  assert gemma_model.load(weights=bare, tokenizer=folder).fingerprint == found.fingerprint
  by_name = gemma_model.load_named(str(folder))  # what the experiments' --model takes
  assert by_name.fingerprint == found.fingerprint
  with pytest.raises(gemma_model.VocabularyError, match='400 ids but the model only 256'):
    gemma_model.load('tiny', weights='random', tokenizer=folder / 'tokenizer.json')


# ---------------------------------------------------------------- the 270M's own vocabulary


@pytest.fixture(scope='module')
def gguf_vocab():
  return tokenizer_lib.Tokenizer.from_gguf(gguf.locate_gguf())


@pytest.fixture(scope='module')
def vocab_files(gguf_vocab, tmp_path_factory):
  """tokenizer.json, tokenizer.model and tokenizer_config.json of the 270M's vocabulary."""
  return tokenizer_files.write_all(tmp_path_factory.mktemp('gemma3_vocab'), gguf_vocab)


@pytest.mark.slow  # about two minutes: the merges of 262,144 pieces, then 805 texts per file
@pytest.mark.real_model
@pytest.mark.parametrize('name', hf_tokenizer.FILES)
def test_the_270m_vocabulary_gives_the_gguf_ids_and_text(gguf_vocab, vocab_files, name):
  tok = hf_tokenizer.load(vocab_files / name)
  assert tok.vocab_size == gguf_vocab.vocab_size and tok.bos_id == gguf_vocab.bos_id
  cases = json.loads(FIXTURE.read_text(encoding='utf-8'))['cases']
  differ = {}
  for case in cases:
    args = dict(add_bos=case['add_bos'], parse_special=case['special'])
    want = gguf_vocab.encode(case['text'], **args)
    if tok.encode(case['text'], **args) != want:
      differ.setdefault(case['category'], []).append(case['text'])
    for skip in (False, True):
      assert tok.decode(want, skip_special=skip) == gguf_vocab.decode(want, skip_special=skip)
  known = {c for f, c in KNOWN_DIFFERENCES if f == name}
  assert set(differ) <= known, {c: t[:3] for c, t in differ.items() if c not in known}
  assert sum(map(len, differ.values())) <= 3  # only the literal-U+2581 texts
  assert len(cases) - sum(map(len, differ.values())) >= 800


@pytest.fixture(scope='module')
def exported_270m(real_model, vocab_files, tmp_path_factory):
  """{tokenizer file: a Hugging Face folder of the 270M's float32 weights with that file of its
  vocabulary beside them} (the weights written once, linked into the second folder)."""
  folders = {}
  for name in hf_tokenizer.FILES:
    folder = folders[name] = tmp_path_factory.mktemp(f'gemma3_270m_{name.replace(".", "_")}')
    if len(folders) == 1:
      safetensors_io.save(real_model.params, real_model.config, folder)
    else:
      first = next(iter(folders.values()))
      for f in first.iterdir():
        if f.name not in hf_tokenizer.FILES:
          os.link(f, folder / f.name)
    (folder / name).write_bytes((vocab_files / name).read_bytes())
    (folder / hf_tokenizer.TOKENIZER_CONFIG).write_bytes(
      (vocab_files / hf_tokenizer.TOKENIZER_CONFIG).read_bytes()
    )
  return folders


@pytest.mark.slow  # the 270M exported, then the graft gate twice
@pytest.mark.real_model
def test_the_exported_270m_runs_byte_equal_to_the_gguf_path(real_model, exported_270m):
  """Both folders load the GGUF's weights and give its ids, logits and gate samples (the one
  input of the graft gate a tokenizer makes); the gate run from the tokenizer.json folder
  gives the GGUF path's results (from the tokenizer.model folder it would repeat that run)."""
  from graftjax.studies.common import corpus
  from graftjax.studies.graft import graft_gate

  text = 'def fibonacci(n):\n  """The n-th Fibonacci number."""\n'
  ids = real_model.tokenizer.encode(text)
  cache = real_model.init_cache(capacity=64)
  want, _ = real_model.prefill(ids, cache=cache, chunk_size=16, logits='all')
  sizes = dict(prefix_tokens=24, continuation_tokens=4)
  gate_samples = corpus.text_samples(real_model.tokenizer, count=1, **sizes)
  kwargs = dict(sizes, samples=1, rollout_tokens=4, chunk_size=8)
  kwargs.update(dtype='float32', other_process=False, store_dir=None, command='test')
  for name, folder in exported_270m.items():
    mine = gemma_model.load_named(str(folder))  # as the experiments' --model loads it
    assert mine.params_digest == real_model.params_digest and mine.config == real_model.config
    assert mine.tokenizer.digest() == hf_tokenizer.load(folder / name).digest()
    assert mine.tokenizer.encode(text) == ids
    assert corpus.text_samples(mine.tokenizer, count=1, **sizes) == gate_samples
    got, _ = mine.prefill(ids, cache=mine.init_cache(capacity=64), chunk_size=16, logits='all')
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
  folder = exported_270m['tokenizer.json']
  gguf_run = graft_gate.experiment(model_name='gemma3-270m', **kwargs)
  run = graft_gate.experiment(model_name=str(folder), **kwargs)
  assert run['inputs']['tokenizer_sha256'] == hf_tokenizer.load(folder).digest()
  # Token ids, logit digests, generated tokens and verdicts byte-equal; block keys name each
  # model (its fingerprint holds its tokenizer file's digest), so they differ.
  keys = [[r.pop('block_key') for r in one['samples']] for one in (run, gguf_run)]
  assert run['samples'] == gguf_run['samples']
  assert run['summary'] == gguf_run['summary']
  assert keys[0] != keys[1]
