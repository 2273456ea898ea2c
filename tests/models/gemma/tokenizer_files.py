"""Writes a tokenizer.json and a tokenizer.model from a sentencepiece-style vocabulary.

For tests: the 270M's own vocabulary (from its GGUF) exported as a Hugging Face folder has
both files, written here as transformers' Gemma converter and sentencepiece lay them out
(BPE over pieces scored by priority, byte fallback, ' ' written as U+2581, no dummy prefix;
control pieces special added tokens, user-defined pieces added tokens not special).
Nothing is downloaded and no large file is committed.
"""

import json
import pathlib

import numpy as np
from sentencepiece import sentencepiece_model_pb2 as spm_pb2
import tokenizers
from tokenizers import decoders
from tokenizers import models
from tokenizers import normalizers

from graftjax.models.gemma import tokenizer as tokenizer_lib

SPACE = tokenizer_lib.SPACE_MARK
T = tokenizer_lib.TokenType


def _merges(pieces, scores, types) -> list[tuple[str, str]]:
  """Every split (left, right) of a mergeable piece into two pieces, the best-scored piece
  first (transformers' Gemma converter orders them so)."""
  index = {p: i for i, p in enumerate(pieces)}
  found = []
  for i, piece in enumerate(pieces):
    if types[i] in (T.BYTE,) or len(piece) < 2:
      continue
    local = [
      (index[piece[:k]], index[piece[k:]])
      for k in range(1, len(piece))
      if piece[:k] in index and piece[k:] in index
    ]
    found += [(-float(scores[i]), left, right) for left, right in sorted(local)]
  found.sort(key=lambda m: m[0])
  return [(pieces[left], pieces[right]) for _, left, right in found]


def write_tokenizer_json(path, vocab: tokenizer_lib.Tokenizer) -> pathlib.Path:
  pieces, types = vocab.pieces, vocab.types.tolist()
  model = models.BPE(
    {p: i for i, p in enumerate(pieces)},
    _merges(pieces, vocab.scores, types),
    unk_token=pieces[vocab.unk_id],
    fuse_unk=True,
    byte_fallback=True,
  )
  tok = tokenizers.Tokenizer(model)
  tok.normalizer = normalizers.Replace(' ', SPACE)
  tok.decoder = decoders.Sequence(
    [decoders.Replace(SPACE, ' '), decoders.ByteFallback(), decoders.Fuse()]
  )
  tok.add_tokens(
    [
      tokenizers.AddedToken(p, normalized=False, special=t != T.USER_DEFINED)
      for p, t in zip(pieces, types)
      if t in (T.CONTROL, T.USER_DEFINED, T.UNKNOWN)
    ]
  )
  path = pathlib.Path(path)
  tok.save(str(path))
  return path


def write_tokenizer_model(path, vocab: tokenizer_lib.Tokenizer) -> pathlib.Path:
  proto = spm_pb2.ModelProto()
  spec = proto.trainer_spec
  spec.model_type = spm_pb2.TrainerSpec.BPE
  spec.vocab_size = vocab.vocab_size
  spec.byte_fallback = True
  spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = (
    vocab.unk_id,
    vocab.bos_id,
    vocab.eos_id,
    vocab.pad_id,
  )
  spec.unk_piece, spec.bos_piece, spec.eos_piece, spec.pad_piece = (
    vocab.pieces[vocab.unk_id],
    vocab.pieces[vocab.bos_id],
    vocab.pieces[vocab.eos_id],
    vocab.pieces[vocab.pad_id],
  )
  norm = proto.normalizer_spec
  norm.name = 'identity'
  norm.add_dummy_prefix = False
  norm.remove_extra_whitespaces = False
  norm.escape_whitespaces = True
  for i, (piece, score, kind) in enumerate(zip(vocab.pieces, vocab.scores.tolist(), vocab.types)):
    kind = T.UNKNOWN if i == vocab.unk_id else int(kind)  # sentencepiece needs one unknown piece
    if kind == T.USER_DEFINED:  # matched after normalization, where ' ' is already U+2581
      piece = piece.replace(' ', SPACE)
    proto.pieces.add(piece=piece, score=score, type=kind)
  path = pathlib.Path(path)
  path.write_bytes(proto.SerializeToString())
  return path


def write_tokenizer_config(folder, vocab: tokenizer_lib.Tokenizer, **extra) -> pathlib.Path:
  """tokenizer_config.json naming the special tokens (and `extra` fields, e.g. a chat_template)."""
  names = {
    f'{role}_token': vocab.pieces[getattr(vocab, f'{role}_id')]
    for role in ('bos', 'eos', 'pad', 'unk')
  }
  path = pathlib.Path(folder) / 'tokenizer_config.json'
  path.write_text(json.dumps({**names, **extra}, ensure_ascii=False, indent=1))
  return path


def write_all(folder, vocab: tokenizer_lib.Tokenizer, **config) -> pathlib.Path:
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  write_tokenizer_json(folder / 'tokenizer.json', vocab)
  write_tokenizer_model(folder / 'tokenizer.model', vocab)
  write_tokenizer_config(folder, vocab, **config)
  return folder


GEMMA3_TURNS = ('<start_of_turn>', '<end_of_turn>')
GEMMA4_TURNS = ('<|turn>', '<turn|>')  # ids 105 and 106 in both (the gemma library's tokenizers)


def small_vocabulary(
  size: int = 400, turns: tuple[str, str] = GEMMA3_TURNS
) -> tokenizer_lib.Tokenizer:
  """A sentencepiece-style vocabulary of `size` ids for tiny exports, laid out as Gemma's:
  <pad> <eos> <bos> <unk> <mask> (0-4), unused control pieces up to the turn tokens at 105
  and 106, then '\\n', the one-token blank line and fence, the 256 bytes and a few merged
  pieces (the words of a chat turn among them)."""
  head = ['<pad>', '<eos>', '<bos>', '<unk>', '<mask>'] + [f'<unused{i}>' for i in range(100)]
  head += [*turns, '\n', '\n\n', '```']
  kinds = [T.CONTROL] * 107 + [T.NORMAL, T.USER_DEFINED, T.USER_DEFINED]
  letters = [SPACE, 'a', 'd', 'e', 'h', 'i', 'l', 'm', 'n', 'o', 'r', 's', 't', 'u']
  words = ['th', 'the', SPACE + 't', SPACE + 'the', 'in', 'an', 'er', 'us', 'user', 'mo', 'model']
  pieces = head + [f'<0x{b:02X}>' for b in range(256)] + letters + words
  kinds += [T.BYTE] * 256 + [T.NORMAL] * (len(letters) + len(words))
  pieces += [f'<unused{100 + i}>' for i in range(size - len(pieces))]
  kinds += [T.CONTROL] * (size - len(kinds))
  scores = np.zeros(size, np.float32)
  for rank, piece in enumerate(words):  # every character of a word is a piece: BPE reaches it
    scores[pieces.index(piece)] = -float(rank)
  return tokenizer_lib.Tokenizer(
    pieces, scores, np.asarray(kinds, np.int32), bos_id=2, eos_id=1, pad_id=0, unk_id=3
  )
