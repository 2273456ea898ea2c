"""A checkpoint's own tokenizer, read by the library made for its file.

    tok = hf_tokenizer.beside('/ckpt/gemma-3-1b-pt')   # tokenizer.json, else tokenizer.model
    tok = hf_tokenizer.load('/ckpt/tokenizer.model')    # one file, by its name
    ids = tok.encode('def f():')                        # BOS first, as `tokenizer.Tokenizer`

`tokenizer.json` (a Hugging Face folder; Gemma 3's and Gemma 4's are BPE with byte
fallback) is read by `tokenizers`; `tokenizer.model` (the gemma library's checkpoints,
and most Hugging Face folders beside tokenizer.json) by `sentencepiece`. A folder with
both is read from tokenizer.json, the file transformers' fast tokenizer reads.

Both give the interface of the GGUF tokenizer (`tokenizer.Tokenizer`): `encode(text, *,
add_bos, parse_special)`, `decode(ids, *, skip_special)`, `digest()` and the special ids.

* BOS is put first by `encode` itself (`add_bos`), never by the file's post-processor, so
  a file that adds BOS and one that does not encode alike.
* `parse_special=True` cuts literal control-token text ('<start_of_turn>') out as that
  token; with False only user-defined tokens (tokenizers: added tokens not marked special;
  sentencepiece: user-defined pieces) are cut out, as in the GGUF tokenizer.
* `decode` reads control tokens as their text unless `skip_special`.
* `digest()` is the SHA-256 of the file's bytes under its kind: it enters the model's
  fingerprint as the GGUF vocabulary's digest does, so a block made under one tokenizer
  file is refused by a model carrying another, even of the same vocabulary.

The special ids are those of `<bos>`, `<eos>`, `<pad>` and `<unk>`, or of the tokens
tokenizer_config.json names (`bos_token`, ...) when it sits beside the file. The folder's
chat template, if it ships one, is `chat_template` (`chat_template.ChatTemplate`, else None).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
from collections.abc import Iterable

from graftjax.models.gemma import chat_template as chat_template_lib
from graftjax.models.gemma import params as params_lib

TOKENIZER_JSON = 'tokenizer.json'
TOKENIZER_MODEL = 'tokenizer.model'
TOKENIZER_CONFIG = 'tokenizer_config.json'
FILES = (TOKENIZER_JSON, TOKENIZER_MODEL)  # in the order `beside` looks for them
_SPECIAL_NAMES = {'bos': '<bos>', 'eos': '<eos>', 'pad': '<pad>', 'unk': '<unk>'}


class TokenizerFileError(params_lib.CheckpointError):
  """A tokenizer file that is missing, of an unknown kind, or that its library cannot read."""


def beside(weights: str | os.PathLike) -> HFTokenizer | SentencePieceTokenizer | None:
  """The tokenizer in the checkpoint folder `weights` (or beside the file `weights`), or None."""
  folder = pathlib.Path(weights)
  folder = folder if folder.is_dir() else folder.parent
  for name in FILES:
    if (folder / name).is_file():
      return load(folder / name)
  return None


def load(path: str | os.PathLike) -> HFTokenizer | SentencePieceTokenizer:
  """The tokenizer of `path`: a tokenizer.json or tokenizer.model file, or a folder holding one.

  Raises:
    TokenizerFileError: no such file, a folder holding neither, or another file name.
  """
  path = pathlib.Path(path)
  if path.is_dir():
    found = beside(path)
    if found is None:
      raise TokenizerFileError(f'{path} holds no tokenizer: neither of {list(FILES)}')
    return found
  if not path.is_file():
    raise TokenizerFileError(f'{path}: no such tokenizer file')
  if path.suffix == '.json':
    return HFTokenizer(path)
  if path.suffix == '.model':
    return SentencePieceTokenizer(path)
  raise TokenizerFileError(f'{path}: a tokenizer is a .json (tokenizers) or .model (sentencepiece)')


def _file_digest(kind: str, path: pathlib.Path) -> str:
  h = hashlib.sha256(f'graftjax.{kind}.v1\0'.encode())
  h.update(path.read_bytes())
  return h.hexdigest()


def _special_pieces(folder: pathlib.Path) -> dict[str, str]:
  """{'bos': piece, ...}: tokenizer_config.json's names where it gives them, else Gemma's."""
  pieces = dict(_SPECIAL_NAMES)
  config = folder / TOKENIZER_CONFIG
  if config.is_file():
    raw = json.loads(config.read_text(encoding='utf-8'))
    for role in pieces:
      value = raw.get(f'{role}_token')
      value = value.get('content') if isinstance(value, dict) else value
      if isinstance(value, str):
        pieces[role] = value
  return pieces


class _Specials:
  """The special ids and the checks both kinds share."""

  path: pathlib.Path
  _ids: dict[str, int]
  _size: int

  def _read_beside(self, piece_to_id) -> None:
    """The special ids and the chat template (`chat_template.beside`) of the file's folder."""
    self.chat_template = chat_template_lib.beside(self.path.parent)
    self._resolve_specials(piece_to_id)

  def _resolve_specials(self, piece_to_id) -> None:
    self._ids = {}
    for role, piece in _special_pieces(self.path.parent).items():
      token_id = piece_to_id(piece)
      if token_id is None:
        raise TokenizerFileError(
          f'{self.path}: its {role} token {piece!r} is not in its vocabulary'
        )
      self._ids[role] = token_id

  @property
  def vocab_size(self) -> int:
    return self._size

  @property
  def bos_id(self) -> int:
    return self._ids['bos']

  @property
  def eos_id(self) -> int:
    return self._ids['eos']

  @property
  def pad_id(self) -> int:
    return self._ids['pad']

  @property
  def unk_id(self) -> int:
    return self._ids['unk']

  def _checked(self, ids: Iterable[int]) -> list[int]:
    out = []
    for token_id in ids:
      value = int(token_id)
      if value != token_id or not 0 <= value < self._size:
        raise ValueError(f'token id {token_id!r} is not an integer in [0, {self._size})')
      out.append(value)
    return out


class HFTokenizer(_Specials):
  """tokenizer.json, read by the `tokenizers` library."""

  def __init__(self, path: str | os.PathLike):
    import tokenizers

    self.path = pathlib.Path(path)
    try:
      self._tok = tokenizers.Tokenizer.from_file(str(self.path))
    except Exception as e:  # tokenizers raises plain Exceptions for a file it cannot read
      raise TokenizerFileError(f'{self.path}: tokenizers cannot read it: {e}') from e
    self._size = self._tok.get_vocab_size(with_added_tokens=True)
    self._read_beside(self._tok.token_to_id)
    self._digest = _file_digest('tokenizer_json', self.path)

  def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = True) -> list[int]:
    """Token ids of `text` (see the module docstring for `parse_special`)."""
    self._tok.encode_special_tokens = not parse_special
    ids = self._tok.encode(text, add_special_tokens=False).ids
    return ([self.bos_id] if add_bos else []) + ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """The text of `ids`; control tokens as their text unless `skip_special`."""
    return self._tok.decode(self._checked(ids), skip_special_tokens=skip_special)

  def digest(self) -> str:
    return self._digest


class SentencePieceTokenizer(_Specials):
  """tokenizer.model, read by the `sentencepiece` library.

  sentencepiece never reads control pieces from text, so `encode(parse_special=True)` first
  cuts them out (leftmost occurrence first, the longest piece where several start there)
  and hands the text between them to sentencepiece.
  """

  def __init__(self, path: str | os.PathLike):
    import sentencepiece

    self.path = pathlib.Path(path)
    self._sp = sentencepiece.SentencePieceProcessor()
    try:
      self._sp.Load(str(self.path))
    except (OSError, RuntimeError) as e:
      raise TokenizerFileError(f'{self.path}: sentencepiece cannot read it: {e}') from e
    self._size = self._sp.GetPieceSize()
    unknown = self._sp.unk_id()
    self._read_beside(lambda piece: self._id_of(piece, unknown))
    self._control = {
      i: self._sp.IdToPiece(i)
      for i in range(self._size)
      if self._sp.IsControl(i) or self._sp.IsUnknown(i)
    }
    self._control_ids = {piece: i for i, piece in self._control.items() if piece}
    longest_first = sorted(self._control_ids, key=len, reverse=True)
    self._control_pattern = re.compile('|'.join(map(re.escape, longest_first)) or '(?!)')
    self._digest = _file_digest('tokenizer_model', self.path)

  def _id_of(self, piece: str, unknown: int) -> int | None:
    token_id = self._sp.PieceToId(piece)
    return None if token_id == unknown and piece != self._sp.IdToPiece(unknown) else token_id

  def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = True) -> list[int]:
    """Token ids of `text` (see the module docstring for `parse_special`)."""
    ids = [self.bos_id] if add_bos else []
    if not parse_special:
      return ids + self._sp.EncodeAsIds(text)
    begin = 0
    for match in self._control_pattern.finditer(text):
      ids += self._sp.EncodeAsIds(text[begin : match.start()]) if match.start() > begin else []
      ids.append(self._control_ids[match.group()])
      begin = match.end()
    return ids + (self._sp.EncodeAsIds(text[begin:]) if begin < len(text) else [])

  def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
    """The text of `ids`; control tokens as their text unless `skip_special`."""
    ids = self._checked(ids)
    if skip_special:
      return self._sp.DecodeIds([i for i in ids if i not in self._control])
    parts: list[str] = []
    run: list[int] = []
    for token_id in ids:
      if token_id in self._control:
        parts += [self._sp.DecodeIds(run), self._control[token_id]]
        run = []
      else:
        run.append(token_id)
    return ''.join(parts + [self._sp.DecodeIds(run)])

  def digest(self) -> str:
    return self._digest
