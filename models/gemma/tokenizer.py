"""Gemma 3 tokenizer built from a GGUF vocabulary, token-for-token with llama.cpp.

The GGUF stores a sentencepiece vocabulary (`tokenizer.ggml.model == 'llama'`):
pieces, scores and token types, no merge list. llama.cpp tokenizes it in two
steps, and so does this module:

1. Special-token partition. Every user-defined token (newline, tab and
   space runs, `<table>`-style tags, `<start_of_image>`, ...) and, when
   `parse_special` is on, every control token (`<bos>`, `<start_of_turn>`,
   `<unused0>`, ...) is cut out of the text where it occurs literally. Tokens
   are taken longest text first; each one splits every remaining stretch of
   plain text at its leftmost non-overlapping occurrences. (No two special
   tokens of equal length can overlap in this vocabulary, so the order among
   equal lengths does not matter.)
2. Score-driven BPE on each remaining stretch, with ' ' written as U+2581 and
   no dummy prefix: start from single characters, repeatedly merge the
   adjacent pair whose concatenation is the vocabulary piece with the highest
   score (ties: leftmost pair first), until no adjacent pair forms a piece.
   Any piece of the vocabulary may be formed this way, whatever its type. A
   leftover character that is not a piece becomes its UTF-8 bytes as
   `<0xNN>` byte tokens.

`encode(..., parse_special=True)` matches llama.cpp's
`llama_tokenize(..., parse_special=true)` (llama-cpp-python's
`tokenize(..., special=True)`), the mode llama.cpp's own tools use for
prompts, so a chat template written as text yields the real
`<start_of_turn>` / `<end_of_turn>` ids. With `parse_special=False` a literal
`<start_of_turn>` is tokenized as plain text, but user-defined tokens are still
cut out, as in llama.cpp.

One deliberate difference: llama.cpp recognises end-of-generation tokens by
name and turns any it finds into control tokens; for Gemma 3 that includes the
user-defined HTML token '</s>' (id 212). This module keeps the types the GGUF
gives, so '</s>' is cut out in both modes; only `parse_special=False` on text
containing '</s>' differs from llama.cpp.

`ByteTokenizer` is the tiny and random-weight models' own: one id per byte, with
Gemma's control ids and its one-token blank line and code fence.
"""

from __future__ import annotations

import enum
import hashlib
import heapq
import os
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from graftjax.models.gemma import gguf

SPACE_MARK = '\u2581'  # '▁': how the vocabulary writes a space.


class TokenType(enum.IntEnum):
  """Sentencepiece token types, as stored in `tokenizer.ggml.token_type`."""

  NORMAL = 1
  UNKNOWN = 2
  CONTROL = 3
  USER_DEFINED = 4
  UNUSED = 5
  BYTE = 6


def _byte_piece(value: int) -> str:
  return f'<0x{value:02X}>'


class Tokenizer:
  """Sentencepiece-style BPE with byte fallback over a GGUF vocabulary.

  `chat_template` is None: the 270M's GGUF ships none (a checkpoint's is read beside its
  tokenizer file, `hf_tokenizer`).

  Attributes:
    pieces: the vocabulary, one string per id.
    scores: float32 [vocab_size], merge priority of each piece (higher first).
    types: int32 [vocab_size], a `TokenType` per id.
  """

  def __init__(
    self,
    pieces: Sequence[str],
    scores: np.ndarray,
    types: np.ndarray,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    unk_id: int,
  ):
    if not len(pieces) == len(scores) == len(types):
      raise ValueError(
        f'vocabulary arrays disagree: {len(pieces)} pieces, {len(scores)} scores, {len(types)} types'
      )
    self.pieces = list(pieces)
    self.scores = np.asarray(scores, np.float32)
    self.types = np.asarray(types, np.int32)
    self._bos_id, self._eos_id, self._pad_id, self._unk_id = bos_id, eos_id, pad_id, unk_id
    self._piece_to_id = dict(zip(self.pieces, range(len(self.pieces))))
    if len(self._piece_to_id) != len(self.pieces):
      raise ValueError('vocabulary has duplicate pieces')
    self._score_list = self.scores.tolist()
    self._type_list = self.types.tolist()
    self._byte_ids = [self._piece_to_id[_byte_piece(b)] for b in range(256)]
    self._specials = self._specials_longest_first()
    self.chat_template = None

  @classmethod
  def from_gguf(cls, path_or_metadata: str | os.PathLike | Mapping[str, Any]) -> Tokenizer:
    """Builds the tokenizer from a GGUF file or its parsed metadata dict."""
    if isinstance(path_or_metadata, Mapping):
      metadata = path_or_metadata
    else:
      metadata = gguf.open_gguf(path_or_metadata).metadata
    model = metadata.get('tokenizer.ggml.model')
    if model != 'llama':
      raise ValueError(
        f"tokenizer.ggml.model is {model!r}; this tokenizer reads 'llama' (sentencepiece)"
      )
    if metadata.get('tokenizer.ggml.add_space_prefix', True):
      raise ValueError(
        'tokenizer.ggml.add_space_prefix is set; this tokenizer adds no dummy prefix'
      )
    return cls(
      metadata['tokenizer.ggml.tokens'],
      metadata['tokenizer.ggml.scores'],
      metadata['tokenizer.ggml.token_type'],
      bos_id=int(metadata['tokenizer.ggml.bos_token_id']),
      eos_id=int(metadata['tokenizer.ggml.eos_token_id']),
      pad_id=int(metadata['tokenizer.ggml.padding_token_id']),
      unk_id=int(metadata['tokenizer.ggml.unknown_token_id']),
    )

  @property
  def vocab_size(self) -> int:
    return len(self.pieces)

  @property
  def bos_id(self) -> int:
    return self._bos_id

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def unk_id(self) -> int:
    return self._unk_id

  def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = True) -> list[int]:
    """Token ids of `text`, as llama.cpp's `llama_tokenize` gives them.

    Args:
      text: any string without lone surrogates.
      add_bos: put `bos_id` first.
      parse_special: cut literal control-token text (e.g. '<start_of_turn>')
        out as that token; user-defined tokens are cut out either way.

    Returns:
      list[int] of ids in [0, vocab_size).
    """
    ids = [self._bos_id] if add_bos else []
    for fragment in self._partition(text, parse_special):
      if isinstance(fragment, int):
        ids.append(fragment)
      else:
        ids.extend(self._bpe(fragment.replace(' ', SPACE_MARK)))
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """The text of `ids`: `decode(encode(text, add_bos=False)) == text` without U+2581.

    One rule for every token, by its type (llama.cpp's `llama_token_to_piece`
    for sentencepiece vocabularies, with `special=not skip_special`):

    * normal pieces read as written, U+2581 as a space (so text holding a
      literal U+2581 does not come back unchanged);
    * byte tokens are joined into UTF-8 (invalid sequences become U+FFFD);
    * user-defined tokens ('\\n\\n', '<b>', '</s>', ...) read as their text;
    * control tokens (`<bos>`, `<eos>`, `<pad>`, `<start_of_turn>`,
      `<end_of_turn>`, `<unk>`, `<mask>`, `<unusedN>`, ...) and unknown-type
      tokens read as their text, like llama.cpp's `common_token_to_piece`
      (special=true) and transformers' `decode` (skip_special_tokens=False);
      with `skip_special=True` they read as nothing (llama.cpp special=false,
      transformers skip_special_tokens=True), which is what generated text
      for a reader wants;
    * unused-type tokens read as nothing (as in llama.cpp; Gemma 3 has none).

    One difference from llama.cpp: it retypes '</s>' (id 212, user-defined in
    the GGUF) as control, so with special=false it drops it; here it is
    user-defined and always read (see the module docstring).

    Args:
      ids: token ids, e.g. a list[int] or an int array [T].
      skip_special: read control and unknown-type tokens as nothing.

    Raises:
      ValueError: if an id is not in [0, vocab_size).
    """
    return b''.join(
      self._piece_bytes(self._checked_id(i), skip_special=skip_special) for i in ids
    ).decode('utf-8', errors='replace')

  def digest(self) -> str:
    """Hex SHA-256 of the vocabulary: pieces, scores, types and special ids."""
    h = hashlib.sha256(b'graftjax.tokenizer.v1\0')
    h.update(
      struct.pack('<QQQQQ', self.vocab_size, self._bos_id, self._eos_id, self._pad_id, self._unk_id)
    )
    for piece in self.pieces:
      raw = piece.encode('utf-8', errors='surrogateescape')
      h.update(struct.pack('<Q', len(raw)))
      h.update(raw)
    h.update(self.scores.astype('<f4').tobytes())
    h.update(self.types.astype('<i4').tobytes())
    return h.hexdigest()

  def _specials_longest_first(self) -> list[tuple[str, int, bool]]:
    """(piece, id, is_user_defined) for every piece cut out before BPE, longest first."""
    cut_types = [TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN]
    ids = np.flatnonzero(np.isin(self.types, cut_types))
    is_user_defined = self.types[ids] == TokenType.USER_DEFINED
    specials = [
      (self.pieces[i], i, user) for i, user in zip(ids.tolist(), is_user_defined.tolist())
    ]
    specials.sort(key=lambda special: -len(special[0].encode('utf-8')))
    return specials

  def _partition(self, text: str, parse_special: bool) -> list[str | int]:
    """Splits `text` into plain-text stretches (str) and special-token ids (int)."""
    fragments: list[str | int] = [text] if text else []
    for piece, token_id, is_user_defined in self._specials:
      if not (parse_special or is_user_defined) or piece not in text:
        continue
      fragments = [
        part
        for fragment in fragments
        for part in (
          _split_around(fragment, piece, token_id) if isinstance(fragment, str) else (fragment,)
        )
      ]
    return fragments

  def _bpe(self, text: str) -> list[int]:
    """Score-ordered BPE over the characters of `text` (spaces already U+2581)."""
    n = len(text)
    if not n:
      return []
    # Symbol i covers text[i : i + size[i]]; size 0 once merged into its left neighbour.
    size = [1] * n
    prev = list(range(-1, n - 1))
    next_ = list(range(1, n)) + [-1]
    queue: list[tuple[float, int, int, int]] = []

    def push_pair(left: int, right: int) -> None:
      if left < 0 or right < 0:
        return
      token_id = self._piece_to_id.get(text[left : right + size[right]])
      if token_id is not None:
        heapq.heappush(queue, (-self._score_list[token_id], left, right, size[left] + size[right]))

    for i in range(n - 1):
      push_pair(i, i + 1)
    while queue:
      _, left, right, pair_size = heapq.heappop(queue)
      if not size[left] or not size[right] or size[left] + size[right] != pair_size:
        continue  # Stale: one side has merged with something else since.
      size[left] = pair_size
      size[right] = 0
      next_[left] = next_[right]
      if next_[right] >= 0:
        prev[next_[right]] = left
      push_pair(prev[left], left)
      push_pair(left, next_[left])

    ids = []
    i = 0
    while i >= 0:
      symbol = text[i : i + size[i]]
      token_id = self._piece_to_id.get(symbol)
      if token_id is None:
        ids.extend(self._byte_ids[b] for b in symbol.encode('utf-8'))
      else:
        ids.append(token_id)
      i = next_[i]
    return ids

  def _checked_id(self, token_id) -> int:
    value = int(token_id)
    if value != token_id or not 0 <= value < len(self.pieces):
      raise ValueError(f'token id {token_id!r} is not an integer in [0, {len(self.pieces)})')
    return value

  def _piece_bytes(self, token_id: int, *, skip_special: bool) -> bytes:
    piece = self.pieces[token_id]
    token_type = self._type_list[token_id]
    if token_type == TokenType.BYTE:
      return bytes([int(piece[3:5], 16)])
    if token_type == TokenType.NORMAL:
      piece = piece.replace(SPACE_MARK, ' ')
    elif token_type in (TokenType.CONTROL, TokenType.UNKNOWN):
      if skip_special:
        return b''
    elif token_type != TokenType.USER_DEFINED:  # UNUSED, or a type sentencepiece lacks
      return b''
    return piece.encode('utf-8', errors='surrogateescape')


class ByteTokenizer:
  """The tiny and random-weight models' tokenizer: one id per UTF-8 byte, and a few specials.

  Ids 0-2 are `<pad>`, `<eos>` and `<bos>` (control, as in Gemma's vocabulary); 3 is a blank
  line '\\n\\n' and 4 the fence '```' (user-defined: one token each, as in Gemma's vocabulary,
  so the flywheel's stop tokens exist); every other byte b < 256 is id b. Ids from 256 to
  `vocab_size` are unused and read as nothing. Text holding a byte below 5 (control characters
  NUL to EOT) has no ids and is refused.
  """

  SPECIALS = ('<pad>', '<eos>', '<bos>', '\n\n', '```')
  chat_template = None
  _USER_DEFINED = ('\n\n', '```')

  def __init__(self, vocab_size: int = 256):
    if vocab_size < 256:
      raise ValueError(f'a byte tokenizer needs a vocabulary of at least 256 ids, got {vocab_size}')
    self._vocab_size = vocab_size
    self._splitter = re.compile('|'.join(re.escape(s) for s in self._USER_DEFINED))

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  @property
  def pad_id(self) -> int:
    return 0

  @property
  def eos_id(self) -> int:
    return 1

  @property
  def bos_id(self) -> int:
    return 2

  def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = True) -> list[int]:
    """Ids of `text`: '\\n\\n' and '```' one id each (leftmost first), every other byte its value.

    `parse_special=True` also reads literal '<pad>', '<eos>', '<bos>' as their ids.

    Raises:
      ValueError: if the text holds a byte below 5 (named, with its offset).
    """
    ids = [self.bos_id] if add_bos else []
    pattern = self._splitter
    if parse_special:
      pattern = re.compile('|'.join(re.escape(s) for s in self.SPECIALS))
    begin = 0
    for match in pattern.finditer(text):
      ids += self._bytes(text[begin : match.start()])
      ids.append(self.SPECIALS.index(match.group()))
      begin = match.end()
    return ids + self._bytes(text[begin:])

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """The text of `ids`; control tokens read as their names unless `skip_special`.

    Raises:
      ValueError: if an id is not in [0, vocab_size).
    """
    out = bytearray()
    for token_id in ids:
      value = int(token_id)
      if value != token_id or not 0 <= value < self._vocab_size:
        raise ValueError(f'token id {token_id!r} is not an integer in [0, {self._vocab_size})')
      if value < len(self.SPECIALS):
        piece = self.SPECIALS[value]
        if not (skip_special and piece not in self._USER_DEFINED):
          out += piece.encode()
      elif value < 256:
        out.append(value)
    return out.decode('utf-8', errors='replace')

  def digest(self) -> str:
    """Hex SHA-256 naming this tokenizer: its kind, specials and vocabulary size."""
    h = hashlib.sha256(b'graftjax.byte_tokenizer.v1\0')
    h.update(struct.pack('<Q', self._vocab_size))
    h.update('\0'.join(self.SPECIALS).encode())
    return h.hexdigest()

  def _bytes(self, text: str) -> list[int]:
    raw = text.encode('utf-8', errors='surrogateescape')
    low = next((i for i, b in enumerate(raw) if b < len(self.SPECIALS)), None)
    if low is not None:
      raise ValueError(
        f'byte {raw[low]:#04x} at byte offset {low} has no id in the byte tokenizer'
        f' (ids 0-{len(self.SPECIALS) - 1} are {list(self.SPECIALS)})'
      )
    return list(raw)


def _split_around(text: str, piece: str, token_id: int) -> list[str | int]:
  """`text` with each leftmost non-overlapping `piece` replaced by `token_id`.

  Empty stretches between or around matches are dropped.
  """
  parts: list[str | int] = []
  for i, stretch in enumerate(text.split(piece)):
    if i:
      parts.append(token_id)
    if stretch:
      parts.append(stretch)
  return parts
