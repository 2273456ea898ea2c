"""Tests for models/gemma/tokenizer.py.

Reference ids come from llama.cpp, stored in tests/fixtures/tokenizer_llamacpp.json
by scripts/make_tokenizer_fixture.py; llama.cpp is not needed here.
"""

import heapq
import json
import pathlib
import types

import numpy as np
import pytest

from graftjax.models.gemma import gguf
from graftjax.models.gemma import tokenizer as tokenizer_lib

_FIXTURE_PATH = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'tokenizer_llamacpp.json'

# (text, parse_special) of fixture cases where this tokenizer knowingly differs from llama.cpp.
_KNOWN_DIFFERENCES: dict[tuple[str, bool], str] = {
  ('<b>bold</b> <i>it</i> <u>u</u> <s>strike</s>', False): (
    "'</s>' (id 212) is a user-defined token in the GGUF, so it is cut out of the text in either "
    'mode. llama.cpp (llama-cpp-python 0.3.36) overrides its type to control, by name, because it '
    "lists '</s>' as an end-of-generation spelling (for another model, PaddleOCR); with "
    'parse_special=False it then tokenizes the text as </ s >. We keep the type the vocabulary gives.'
  ),
}

_GEMMA3_VOCAB_DIGEST = 'bc9f5616aeb3698b0d4456a1e9f9e6a0f0b9d7f92f52b8b8d4b981ee40c03cac'

# Text that decode(encode(text)) cannot give back: see Tokenizer.decode.
_NOT_ROUND_TRIPPED = ('\u2581',)


@pytest.fixture(scope='module')
def tokenizer() -> tokenizer_lib.Tokenizer:
  return tokenizer_lib.Tokenizer.from_gguf(gguf.locate_gguf())


@pytest.fixture(scope='module')
def reference() -> dict:
  return json.loads(_FIXTURE_PATH.read_text(encoding='utf-8'))


def _encode_case(tok: tokenizer_lib.Tokenizer, case: dict) -> list[int]:
  return tok.encode(case['text'], add_bos=case['add_bos'], parse_special=case['special'])


def _is_known_difference(case: dict) -> bool:
  return (case['text'], case['special']) in _KNOWN_DIFFERENCES


def _disagreements(tok: tokenizer_lib.Tokenizer, cases: list[dict]) -> list[dict]:
  return [case for case in cases if _encode_case(tok, case) != case['ids']]


def test_fixture_is_for_this_gguf(reference):
  assert reference['gguf_sha256'] == gguf.expected_sha256()


def test_fixture_is_broad(reference):
  cases = reference['cases']
  assert len(cases) >= 500
  categories = {case['category'] for case in cases}
  for category in (
    'code',
    'docstring',
    'document',
    'unicode',
    'whitespace',
    'number',
    'special',
    'empty',
    'single_character',
    'vocabulary',
    'random_codepoints',
  ):
    assert category in categories
  assert sum(len(case['text']) for case in cases) > 100_000


def test_metadata(tokenizer):
  assert tokenizer.vocab_size == 262144
  assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (2, 1, 0)


def test_agrees_with_llamacpp(tokenizer, reference):
  cases = [case for case in reference['cases'] if not _is_known_difference(case)]
  wrong = _disagreements(tokenizer, cases)
  details = [(case['category'], case['text'][:60], case['special']) for case in wrong[:5]]
  assert not wrong, f'{len(wrong)}/{len(cases)} cases differ from llama.cpp, e.g. {details}'


def test_known_differences_still_differ(tokenizer, reference):
  """Keeps _KNOWN_DIFFERENCES honest: an entry that now agrees must go."""
  cases = [case for case in reference['cases'] if _is_known_difference(case)]
  assert {(case['text'], case['special']) for case in cases} == set(_KNOWN_DIFFERENCES)
  assert len(_disagreements(tokenizer, cases)) == len(cases)


def test_round_trip(tokenizer, reference):
  """Control tokens read as their text by default, BOS included, in either parse mode."""
  cases = [
    case for case in reference['cases'] if not any(s in case['text'] for s in _NOT_ROUND_TRIPPED)
  ]
  assert len(cases) > 790
  assert any('<bos>' in case['text'] or '<eos>' in case['text'] for case in cases)
  for case in cases:
    bos = '<bos>' if case['add_bos'] else ''
    assert tokenizer.decode(case['ids']) == bos + case['text'], case['text'][:60]


def _without_control_pieces(tok: tokenizer_lib.Tokenizer, text: str, ids: list[int]) -> str:
  """`text` less the control tokens that `ids` cut out of it, longest first (as encode)."""
  control = {tok.pieces[i] for i in ids if tok.types[i] == tokenizer_lib.TokenType.CONTROL}
  for piece in sorted(control, key=len, reverse=True):
    text = text.replace(piece, '')
  return text


def test_skip_special_drops_exactly_the_control_tokens(tokenizer, reference):
  """llama.cpp's ids, parsed with special=True: skipping control tokens leaves the rest."""
  cases = [
    case
    for case in reference['cases']
    if case['special'] and not any(s in case['text'] for s in _NOT_ROUND_TRIPPED)
  ]
  with_control = [
    case
    for case in cases
    if any(tokenizer.types[i] == tokenizer_lib.TokenType.CONTROL for i in case['ids'][1:])
  ]
  assert len(with_control) >= 15
  for case in cases:
    want = _without_control_pieces(tokenizer, case['text'], case['ids'])
    assert tokenizer.decode(case['ids'], skip_special=True) == want, case['text'][:60]


def test_every_control_token_reads_as_its_text_unless_skipped(tokenizer):
  control = np.flatnonzero(tokenizer.types == tokenizer_lib.TokenType.CONTROL).tolist()
  assert len(control) > 6000 and {0, 1, 2, 3, 105, 106} <= set(control)
  for i in control:
    piece = tokenizer.pieces[i]
    assert tokenizer.decode([i]) == piece
    assert tokenizer.decode([i], skip_special=True) == ''
    # llama.cpp's tokenize(special=True) cuts the same text back out as the same id.
    assert tokenizer.encode(piece, add_bos=False) == [i], piece
  user = np.flatnonzero(tokenizer.types == tokenizer_lib.TokenType.USER_DEFINED).tolist()
  assert user
  for i in user:
    assert tokenizer.decode([i]) == tokenizer.decode([i], skip_special=True) == tokenizer.pieces[i]


def test_user_defined_end_of_strikethrough_is_cut_in_both_modes(tokenizer):
  """Pins the choice documented in _KNOWN_DIFFERENCES."""
  for parse_special in (True, False):
    assert tokenizer.encode('a</s>b', add_bos=False, parse_special=parse_special) == [
      236746,
      212,
      236763,
    ]


def test_decode_reads_special_tokens(tokenizer):
  ids = tokenizer.encode('<start_of_turn>user\n<b>hi</b><end_of_turn>', add_bos=True)
  ids += [tokenizer.eos_id, tokenizer.pad_id]
  assert tokenizer.decode(ids) == '<bos><start_of_turn>user\n<b>hi</b><end_of_turn><eos><pad>'
  assert tokenizer.decode(ids, skip_special=True) == 'user\n<b>hi</b>'  # <b> is user-defined


@pytest.mark.parametrize('bad', [-1, 262144, 2.5, '7'], ids=repr)
def test_decode_refuses_ids_outside_the_vocabulary(tokenizer, bad):
  with pytest.raises(ValueError, match='not an integer in'):
    tokenizer.decode([2, bad])


def test_decode_joins_byte_tokens(tokenizer):
  byte_ids = tokenizer.encode('\U000f0000', add_bos=False)
  assert len(byte_ids) == 4  # A private-use code point outside the vocabulary: 4 UTF-8 bytes.
  assert tokenizer.decode(np.array(byte_ids)) == '\U000f0000'
  assert tokenizer.decode(byte_ids[:2]) == '\ufffd'


def test_empty_text(tokenizer):
  assert tokenizer.encode('') == [tokenizer.bos_id]
  assert tokenizer.encode('', add_bos=False) == []
  assert tokenizer.decode([]) == ''


def _variant(tok: tokenizer_lib.Tokenizer, scores: np.ndarray) -> tokenizer_lib.Tokenizer:
  return tokenizer_lib.Tokenizer(
    tok.pieces,
    scores,
    tok.types,
    bos_id=tok.bos_id,
    eos_id=tok.eos_id,
    pad_id=tok.pad_id,
    unk_id=tok.unk_id,
  )


def test_fixture_catches_lowest_score_first(tokenizer, reference):
  lowest_first = _variant(tokenizer, -tokenizer.scores)
  prose = [
    case for case in reference['cases'] if case['category'] in ('code', 'docstring', 'document')
  ]
  assert len(_disagreements(lowest_first, prose)) > 0.5 * len(prose)


def test_fixture_catches_leftmost_first(tokenizer, reference):
  """Merging leftmost pairs first, whatever their score, must fail too."""
  leftmost_first = _variant(tokenizer, np.zeros_like(tokenizer.scores))
  prose = [
    case for case in reference['cases'] if case['category'] in ('code', 'docstring', 'document')
  ]
  assert len(_disagreements(leftmost_first, prose)) > 0.5 * len(prose)


def test_fixture_catches_ignoring_special_tokens(reference):
  """The same text under special=True and special=False must often differ in the fixture."""
  by_mode = {}
  for case in reference['cases']:
    if case['category'] == 'special':
      by_mode.setdefault(case['text'], {})[case['special']] = case['ids']
  differing = [text for text, ids in by_mode.items() if ids[True] != ids[False]]
  assert len(differing) >= 15


def test_digest(tokenizer):
  digest = tokenizer.digest()
  assert digest == _GEMMA3_VOCAB_DIGEST  # Changing it changes every model fingerprint.
  assert (
    digest
    == tokenizer_lib.Tokenizer.from_gguf(gguf.open_gguf(gguf.locate_gguf()).metadata).digest()
  )
  scores = tokenizer.scores.copy()
  scores[1000] += 1
  assert _variant(tokenizer, scores).digest() != digest


def test_encode_work_grows_linearly(tokenizer, reference, monkeypatch):
  """BPE pushes at most 3 pairs per character (n - 1 at first, 2 per merge), so
  encoding is O(n log n) however long a stretch of plain text is. Counted, not
  timed: a wall-clock bound would depend on the machine and its load."""
  pushes = []
  counting_heapq = types.SimpleNamespace(
    heappush=lambda queue, item: (pushes.append(1), heapq.heappush(queue, item))[1],
    heappop=heapq.heappop,
  )
  monkeypatch.setattr(tokenizer_lib, 'heapq', counting_heapq)
  code = ''.join(case['text'] for case in reference['cases'] if case['category'] == 'code')
  for text in ((code * (10_000 // len(code) + 1))[:10_000], 'ab' * 5_000, 'a' * 10_000):
    pushes.clear()
    assert tokenizer.decode(tokenizer.encode(text, add_bos=False)) == text
    assert 0 < len(pushes) <= 3 * len(text)
