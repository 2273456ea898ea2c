"""Routing a query to stored blocks: exact recurrence, BM25, the model's own embedding.

Details: docs/flywheel.md, section `graftjax/routing/route.py`.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import hashlib
import json
import math
import numbers
import pathlib
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, ClassVar

import bm25s
import bm25s.stopwords
import numpy as np

from graftjax import stats
from graftjax.errors import GraftjaxError
from graftjax.models.gemma import ops

_STOPWORDS = frozenset(bm25s.stopwords.STOPWORDS_EN)  # what `BM25Router` leaves out


def normalize(text: str) -> str:
  """NFKC, casefolded, whitespace collapsed, surrounding punctuation stripped."""
  text = unicodedata.normalize('NFKC', unicodedata.normalize('NFKC', text).casefold())
  is_edge = lambda c: c.isspace() or unicodedata.category(c).startswith('P')
  begin, end = 0, len(text)
  while begin < end and is_edge(text[begin]):
    begin += 1
  while end > begin and is_edge(text[end - 1]):
    end -= 1
  return ' '.join(text[begin:end].split())


_WORD = re.compile(r'(?u)\b\w+\b')


def span_room(query: str, text: str) -> tuple[int, int]:
  """(words after, words before) the span of `query` in `text`.

  The span is the shortest run of `text`'s words (`normalize`d, split as BM25 splits them)
  holding every query word that `text` holds, stopwords aside; the first such run if several.
  (0, 0) when `text` holds no query word.
  """
  wanted = set(_WORD.findall(normalize(query))) - _STOPWORDS
  words = _WORD.findall(normalize(text))
  present = wanted.intersection(words)
  if not present:
    return 0, 0
  counts: dict[str, int] = collections.Counter()
  best, begin, covered = (0, len(words)), 0, 0
  for end, word in enumerate(words):
    if word in present:
      counts[word] += 1
      covered += counts[word] == 1
    while covered == len(present):
      if end - begin < best[1] - best[0]:
        best = (begin, end)
      first = words[begin]
      if first in present:
        counts[first] -= 1
        covered -= counts[first] == 0
      begin += 1
  return len(words) - 1 - best[1], best[0]


def tie_order(query: str, key: str, text: str) -> tuple[int, int, str, str]:
  """The sort key of an entry among entries of equal score for `query` (lower first).

  More words after the query's span first (`span_room`), then more words before it, then
  by key, then by text: a total order on entries that does not depend on the order they
  were added in. A page that a boundary cut right after the question's words holds fewer
  words after the span than the overlapping page holding the whole fact (its answer
  included), so of two such pages tied on score the latter comes first.
  """
  after, before = span_room(query, text)
  return -after, -before, key, text


class RouterFileError(GraftjaxError, ValueError):
  """A saved router file cannot be read: missing, malformed, of another kind, or altered."""


def _real(value: Any) -> bool:
  """A number (numpy's too), not a bool, not NaN."""
  ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
  return ok and not math.isnan(value)


def _count(least: int) -> tuple[Callable[[Any], bool], str]:
  ok = lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= least
  return ok, f'an integer >= {least}'


# A router setting's name -> (whether a value is valid, what a valid value is).
SETTINGS: dict[str, tuple[Callable[[Any], bool], str]] = {
  'threshold': (lambda v: v is None or _real(v), 'a number (not NaN), or null before calibrate'),
  'k1': (lambda v: _real(v) and 0 <= v < math.inf, 'a finite number >= 0'),
  'b': (lambda v: _real(v) and 0 <= v <= 1, 'a number in [0, 1]'),
  'weight': (lambda v: _real(v) and 0 <= v <= 1, 'a number in [0, 1]'),
  'rerank': _count(0),
  'unit_words': _count(1),
  'stride_words': _count(1),
  'chunk_size': _count(1),
  'batch_size': _count(1),
  'fingerprint': (lambda v: isinstance(v, str), 'a string'),
}


def check_settings(**settings: Any) -> None:
  """Raises ValueError naming the first setting outside its type or range (`SETTINGS`), or
  a stride_words above unit_words."""
  for name, value in settings.items():
    ok, want = SETTINGS[name]
    if not ok(value):
      raise ValueError(f'{name} must be {want}, got {value!r}')
  stride, unit = settings.get('stride_words'), settings.get('unit_words')
  if stride is not None and unit is not None and stride > unit:
    raise ValueError(f'stride_words must be at most unit_words {unit}, got {stride}')


@dataclasses.dataclass(frozen=True)
class Hit:
  """A routed entry: its block key and score (see the module docstring)."""

  key: str
  score: float


class Router(abc.ABC):
  """Entries (key, text) and a ranking of them for a query text.

  Adding the same (key, text) twice is a no-op; a key may carry several
  texts, and a text several keys (`route` returns distinct keys). The ranking
  is a total order (entries of equal rank by `tie_order`), the same whatever
  order the entries were added in and however many queries are routed at once.
  """

  kind: ClassVar[str]
  _file_fields: ClassVar[tuple[str, ...]] = ('threshold', 'entries')

  def __init__(self, *, threshold: float | None):
    check_settings(threshold=threshold)
    self.threshold = threshold  # None: not fitted yet (`calibrate`); route refuses
    self._entries: list[tuple[str, str]] = []
    self._seen: set[tuple[str, str]] = set()

  @property
  def entries(self) -> list[tuple[str, str]]:
    return list(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def add(self, key: str, text: str) -> bool:
    """Stores (key, text); returns False if it was stored already.

    Raises:
      TypeError: if the key or text is not a string.
      ValueError: if the text is empty once normalised.
    """
    if not isinstance(key, str) or not isinstance(text, str):
      raise TypeError(
        f'key and text must be strings, got {type(key).__name__}, {type(text).__name__}'
      )
    if not normalize(text):
      raise ValueError(f'nothing to route on: text {text!r} of key {key!r} normalises to empty')
    if (key, text) in self._seen:
      return False
    self._seen.add((key, text))
    self._entries.append((key, text))
    self._added(len(self._entries) - 1)
    return True

  def add_many(self, pairs: Iterable[tuple[str, str]]) -> int:
    """Stores every (key, text); returns how many were new."""
    return sum(self.add(key, text) for key, text in pairs)

  def route(self, query: str, k: int = 1, *, threshold: float | None = None) -> list[Hit]:
    """The k best distinct keys for the query, less those scoring below threshold.

    `threshold` None uses the router's; -inf keeps every ranked hit.

    Raises:
      ValueError: neither this call nor the router has a threshold (fit one
        with `calibrate`).
    """
    return self.route_many([query], k, threshold=threshold)[0]

  def route_many(
    self, queries: Sequence[str], k: int = 1, *, threshold: float | None = None
  ) -> list[list[Hit]]:
    """`route` for each query."""
    if k < 1:
      raise ValueError(f'k must be at least 1, got {k}')
    threshold = self.threshold if threshold is None else threshold
    if threshold is None:
      raise ValueError(
        f'{type(self).__name__} has no threshold: fit one on labelled queries (calibrate)'
        ' or pass one'
      )
    ranked = self._rank_many(queries)
    return [self._top(self._ordered(q, r), k, threshold) for q, r in zip(queries, ranked)]

  def _top(self, ranked: Iterator[tuple[int, float]], k: int, threshold: float) -> list[Hit]:
    hits, keys = [], set()
    for index, score in ranked:
      key = self._entries[index][0]
      if key not in keys:
        keys.add(key)
        hits.append(Hit(key, score))
        if len(hits) == k:
          break
    return [hit for hit in hits if hit.score >= threshold]

  def _ordered(self, query: str, ranked: Iterable[tuple]) -> Iterator[tuple[int, float]]:
    """(entry index, score) of `ranked` (best first), each run of entries of equal rank in
    the tie order (`tie_order`)."""
    run: list[tuple] = []
    for hit in ranked:
      if run and hit[-1] != run[0][-1]:
        yield from self._tied(query, run)
        run = []
      run.append(hit)
    yield from self._tied(query, run)

  def _tied(self, query: str, run: list[tuple]) -> list[tuple[int, float]]:
    if len(run) > 1:
      run = sorted(run, key=lambda hit: tie_order(query, *self._entries[hit[0]]))
    return [(hit[0], hit[1]) for hit in run]

  @abc.abstractmethod
  def _rank_many(self, queries: Sequence[str]) -> list[Iterator[tuple]]:
    """Per query, (entry index, score) by falling score, or (entry index, score, rank) by
    falling rank where the ranking is by another value; only entries that may be hits.

    Entries of equal rank may come in any order: `route_many` puts them in the tie order.
    """

  def _added(self, index: int) -> None:
    """Hook: entry `index` was just stored."""

  def _state(self) -> dict[str, Any]:
    return {'router': self.kind, 'threshold': self.threshold, 'entries': self._entries}

  def save(self, path: str | pathlib.Path) -> None:
    """Writes the entries and threshold as JSON with their SHA-256 (the index is rebuilt on load)."""
    _write_json(path, self._state())

  @classmethod
  def _read(cls, path: str | pathlib.Path, extra: bytes = b'') -> dict[str, Any]:
    """The saved state of a `cls` router, its SHA-256 checked over the body and `extra`.

    Raises:
      RouterFileError: the file is unreadable, not a router file of this kind, or does not
        match its recorded SHA-256.
    """
    try:
      body = json.loads(pathlib.Path(path).read_bytes())
    except OSError as e:
      raise RouterFileError(f'{path}: cannot read the router file: {e.strerror or e}') from e
    except (ValueError, RecursionError) as e:
      raise RouterFileError(f'{path}: not a router file (not JSON: {e})') from e
    if not isinstance(body, dict):
      raise RouterFileError(f'{path}: not a router file (a JSON {type(body).__name__})')
    if body.get('router') != cls.kind:
      raise RouterFileError(f'{path} holds a {body.get("router")!r} router, not {cls.kind!r}')
    recorded = body.pop('sha256', None)
    if recorded is None:
      raise RouterFileError(f'{path}: no sha256 recorded (save the router again)')
    if _sha256(body, extra) != recorded:
      raise RouterFileError(
        f'{path} does not match its recorded SHA-256 {str(recorded)[:16]}…: its entries,'
        ' settings or embeddings were altered'
      )
    missing = sorted(set(cls._file_fields) - set(body))
    if missing:
      raise RouterFileError(f'{path}: no {", ".join(missing)} recorded')
    entries = body['entries']
    if not isinstance(entries, list) or not all(
      isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in entries
    ):
      raise RouterFileError(f'{path}: entries must be a list of [key, text] strings')
    try:
      check_settings(**{name: body[name] for name in cls._file_fields if name in SETTINGS})
    except ValueError as e:
      raise RouterFileError(f'{path}: {e}') from e
    return body


def _sha256(body: dict[str, Any], extra: bytes = b'') -> str:
  """SHA-256 hex of a router file's canonical JSON (sorted keys, ASCII) followed by `extra`."""
  canonical = json.dumps(body, sort_keys=True, separators=(',', ':'), ensure_ascii=True)
  return hashlib.sha256(canonical.encode('ascii') + extra).hexdigest()


def _write_json(path: str | pathlib.Path, body: dict[str, Any], extra: bytes = b'') -> None:
  """Writes `body` and its `sha256` (over it and `extra`) to `path`, replacing it whole."""
  body = {**body, 'entries': [list(e) for e in body['entries']]}
  body['sha256'] = _sha256(body, extra)
  path = pathlib.Path(path)
  partial = path.with_name(f'.{path.name}.partial')
  partial.write_text(json.dumps(body, indent=1, ensure_ascii=True) + '\n')
  partial.replace(path)


def _entries_of(body: dict[str, Any]) -> list[tuple[str, str]]:
  return [(key, text) for key, text in body['entries']]


class ExactRouter(Router):
  """Exact recurrence: the query's `normalize`d text equals a stored text's (score 1.0)."""

  kind = 'exact'

  def __init__(self, *, threshold: float = 1.0):
    super().__init__(threshold=threshold)
    self._by_text: dict[str, list[int]] = collections.defaultdict(list)

  def _added(self, index: int) -> None:
    self._by_text[normalize(self._entries[index][1])].append(index)

  def _rank_many(self, queries: Sequence[str]) -> list[Iterator[tuple[int, float]]]:
    return [((i, 1.0) for i in self._by_text.get(normalize(query), ())) for query in queries]

  @classmethod
  def load(cls, path: str | pathlib.Path) -> ExactRouter:
    body = cls._read(path)
    router = cls(threshold=body['threshold'])
    router.add_many(_entries_of(body))
    return router


class BM25Router(Router):
  """BM25 (`bm25s`) over the stored texts; scores are fractions of the hit's self-score."""

  kind = 'bm25'
  _file_fields = (*Router._file_fields, 'k1', 'b')
  TOKEN_PATTERN = r'(?u)\b\w+\b'

  def __init__(self, *, threshold: float | None = None, k1: float = 1.5, b: float = 0.75):
    super().__init__(threshold=threshold)
    check_settings(k1=k1, b=b)
    self.k1, self.b = k1, b
    self._index: bm25s.BM25 | None = None
    self._self_scores: np.ndarray | None = None  # [N] float64

  def _tokens(self, texts: Sequence[str]) -> list[list[str]]:
    return bm25s.tokenize(
      [normalize(text) for text in texts],
      stopwords='en',
      token_pattern=self.TOKEN_PATTERN,
      return_ids=False,
      show_progress=False,
    )

  def _added(self, index: int) -> None:
    self._index = None

  def _build(self) -> bm25s.BM25:
    if self._index is None:
      tokens = self._tokens([text for _, text in self._entries])
      # Term ids in sorted order: the same ids, so the same sums, whatever order the
      # entries were added in (a catalog adds them in key order when reopened).
      vocab = {term: i for i, term in enumerate(sorted({t for terms in tokens for t in terms}))}
      ids = [[vocab[term] for term in terms] for terms in tokens]
      self._index = bm25s.BM25(k1=self.k1, b=self.b, method='lucene', dtype='float64')
      self._index.index((ids, vocab), show_progress=False)
      # One weight per (entry, term), summed in term-id order as `get_scores` sums
      # them, so a query holding every term of an entry scores it exactly 1.0.
      sparse = self._index.scores
      self._self_scores = np.bincount(sparse['indices'], sparse['data'], minlength=len(self))
    return self._index

  def _rank_many(self, queries: Sequence[str]) -> list[Iterator[tuple]]:
    """Per query, (entry index, score, raw BM25) by falling raw BM25."""
    if not self._entries:
      return [iter(()) for _ in queries]
    index = self._build()
    return [self._ranked(index, terms) for terms in self._tokens(queries)]

  def _ranked(self, index: bm25s.BM25, terms: list[str]) -> Iterator[tuple]:
    ids = sorted({index.vocab_dict[t] for t in terms if t and t in index.vocab_dict})
    if not ids:
      return iter(())
    raw = index.get_scores(ids)
    order = np.argsort(-raw, kind='stable')
    order = order[raw[order] > 0]
    return ((int(i), float(raw[i] / self._self_scores[i]), float(raw[i])) for i in order)

  def _state(self) -> dict[str, Any]:
    return {**super()._state(), 'k1': self.k1, 'b': self.b}

  @classmethod
  def load(cls, path: str | pathlib.Path) -> BM25Router:
    body = cls._read(path)
    router = cls(threshold=body['threshold'], k1=body['k1'], b=body['b'])
    router.add_many(_entries_of(body))
    return router


Encode = Callable[[str], Sequence[int]]


def _token_ids(model, text: str | Sequence[int], encode: Encode | None) -> list[int]:
  """BOS, then the text's tokens (a str is encoded; ids are taken as they are)."""
  if isinstance(text, str):
    if encode is None and model.tokenizer is None:
      raise ValueError('this model has no tokenizer: pass token id lists or an encode function')
    encode = encode or (lambda t: model.tokenizer.encode(t, add_bos=False, parse_special=False))
    ids = [int(i) for i in encode(text)]
  else:
    ids = [int(i) for i in text]
  if not ids:
    raise ValueError(f'nothing to embed: {text!r} has no tokens')
  return [model.config.bos_id] + ids


def embed_texts(
  model,
  texts: Sequence[str | Sequence[int]],
  *,
  chunk_size: int = 64,
  batch_size: int = 8,
  encode: Encode | None = None,
) -> np.ndarray:
  """L2-normalised mean of the final-norm hidden state over each text's tokens.

  Each text runs after a BOS (not pooled), right-padded to a multiple of
  chunk_size, in batches of exactly batch_size rows, so a text's embedding
  bits depend on (model, chunk_size, batch_size) and the text alone, never on
  the texts batched with it (rows are independent; padding comes after).

  Args:
    model: a `Gemma` (`graftjax.models.gemma.model`).
    texts: strings or token id lists without BOS.
    chunk_size: tokens per forward call.
    batch_size: rows per forward call (short batches are padded).
    encode: str -> token ids without BOS; default the model's tokenizer.
  Returns:
    [len(texts), D] float32, each row of unit norm.
  """
  rows = [_token_ids(model, text, encode) for text in texts]
  out = np.zeros((len(rows), model.config.embed_dim), np.float32)
  by_length = collections.defaultdict(list)
  for i, ids in enumerate(rows):
    by_length[-(-len(ids) // chunk_size) * chunk_size].append(i)
  for length, members in sorted(by_length.items()):
    for begin in range(0, len(members), batch_size):
      batch = members[begin : begin + batch_size]
      out[batch] = _embed_batch(model, [rows[i] for i in batch], length, chunk_size, batch_size)
  return out


def _embed_batch(model, rows, length: int, chunk_size: int, batch_size: int) -> np.ndarray:
  """Pooled embeddings [len(rows), D] of id lists no longer than length."""
  tokens = np.full((batch_size, length), model.config.pad_id, np.int32)
  mask = np.zeros((batch_size, length), np.float64)
  for r, ids in enumerate(rows):
    tokens[r, : len(ids)] = ids
    mask[r, 1 : len(ids)] = 1.0
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)
  capacity = -(-length // ops.CAPACITY_MULTIPLE) * ops.CAPACITY_MULTIPLE
  cache = model.init_cache(batch_size=batch_size, capacity=capacity)
  sums = np.zeros((batch_size, model.config.embed_dim), np.float64)
  for begin in range(0, length, chunk_size):
    span = slice(begin, begin + chunk_size)
    hidden, cache = model.forward(tokens[:, span], positions[:, span], cache, logits='hidden')
    sums += (np.asarray(hidden, np.float64) * mask[:, span, None]).sum(axis=1)
  means = sums[: len(rows)] / mask[: len(rows)].sum(axis=1, keepdims=True)
  return (means / np.linalg.norm(means, axis=1, keepdims=True)).astype(np.float32)


class EmbeddingRouter(Router):
  """Cosine similarity of the model's own embeddings (`embed_texts`), brute force.

  Stored texts are embedded lazily, in batches, on the next route. `encode`
  (str -> token ids without BOS) defaults to the model's tokenizer.
  """

  kind = 'embedding'
  _file_fields = (*Router._file_fields, 'chunk_size', 'batch_size', 'fingerprint')

  def __init__(
    self,
    model,
    *,
    threshold: float | None = None,
    chunk_size: int = 64,
    batch_size: int = 8,
    encode: Encode | None = None,
  ):
    super().__init__(threshold=threshold)
    check_settings(chunk_size=chunk_size, batch_size=batch_size)
    self.model, self.chunk_size, self.batch_size = model, chunk_size, batch_size
    self.encode = encode
    self._matrix = np.zeros((0, model.config.embed_dim), np.float32)

  def embed(self, texts: Sequence[str | Sequence[int]]) -> np.ndarray:
    """`embed_texts` with this router's chunk and batch sizes: [N, D] float32."""
    return embed_texts(
      self.model,
      texts,
      chunk_size=self.chunk_size,
      batch_size=self.batch_size,
      encode=self.encode,
    )

  @property
  def matrix(self) -> np.ndarray:
    """[N, D] float32 embeddings of every stored text, in entry order."""
    pending = self._entries[len(self._matrix) :]
    if pending:
      self._matrix = np.concatenate([self._matrix, self.embed([text for _, text in pending])])
    return self._matrix

  def _rank_many(self, queries: Sequence[str]) -> list[Iterator[tuple[int, float]]]:
    if not self._entries:
      return [iter(()) for _ in queries]
    return [_by_similarity(row) for row in similarities(self.embed(queries), self.matrix)]

  def _state(self) -> dict[str, Any]:
    return {
      **super()._state(),
      'chunk_size': self.chunk_size,
      'batch_size': self.batch_size,
      'fingerprint': self.model.fingerprint,
    }

  def save(self, path: str | pathlib.Path) -> None:
    """JSON as `Router.save` plus the embeddings in `<path>.npy`.

    The recorded SHA-256 covers the entries and the embeddings' bytes together, so entries
    reordered against their rows are refused on load.
    """
    matrix = self.matrix
    partial = pathlib.Path(f'{path}.partial.npy')
    np.save(partial, matrix, allow_pickle=False)
    partial.replace(pathlib.Path(f'{path}.npy'))
    _write_json(path, self._state(), _matrix_bytes(matrix))

  @classmethod
  def load(
    cls, path: str | pathlib.Path, model, *, encode: Encode | None = None
  ) -> EmbeddingRouter:
    """Restores a saved router; re-embeds (lazily) if `model` is not the one it was saved with.

    Raises:
      RouterFileError: if the file or its embeddings are unreadable, or do not match the
        recorded SHA-256 (entries, settings and embeddings, in their pairing).
    """
    try:
      matrix = np.load(pathlib.Path(f'{path}.npy'), allow_pickle=False)
    except (OSError, ValueError) as e:
      raise RouterFileError(f'{path}.npy: cannot read the embeddings: {e}') from e
    body = cls._read(path, _matrix_bytes(matrix))
    if len(matrix) != len(body['entries']):
      raise RouterFileError(f'{path}: {len(body["entries"])} entries but {len(matrix)} embeddings')
    router = cls(
      model,
      threshold=body['threshold'],
      chunk_size=body['chunk_size'],
      batch_size=body['batch_size'],
      encode=encode,
    )
    router.add_many(_entries_of(body))
    if body['fingerprint'] == model.fingerprint:
      router._matrix = matrix
    return router


def similarities(queries: np.ndarray, matrix: np.ndarray) -> np.ndarray:
  """Cosine similarity of each query row [Q, D] with each stored row [N, D], as float32: [Q, N].

  Dot products and squared norms are summed in float64 over D in ascending order, one
  product (exact for float32 operands) and one addition at a time; the cosine
  dot / sqrt(|q|^2 |m|^2) is rounded to float32. So a score's bits depend on its two rows
  alone: not on Q (how many queries are scored together), on N, or on the rows beside them
  (a BLAS matmul picks its kernel and summation order by shape); and a row scores exactly
  1.0 with itself (sqrt(s * s) == s in IEEE arithmetic).
  """
  queries, matrix = np.asarray(queries, np.float32), np.asarray(matrix, np.float32)
  if queries.ndim != 2 or matrix.ndim != 2 or queries.shape[1] != matrix.shape[1]:
    raise ValueError(f'need [Q, D] and [N, D] rows, got {queries.shape} and {matrix.shape}')
  columns = np.ascontiguousarray(matrix.T)  # [D, N] float32, one row of it widened at a time
  column_norms = np.zeros(len(matrix))
  for column in columns:
    wide = column.astype(np.float64)
    column_norms += wide * wide
  out = np.zeros((len(queries), len(matrix)), np.float32)
  for begin in range(0, len(queries), _QUERY_BLOCK):  # bounds the [block, N] temporaries
    rows = queries[begin : begin + _QUERY_BLOCK].astype(np.float64)
    dots = np.zeros((len(rows), len(matrix)))
    row_norms = np.zeros(len(rows))
    for d, column in enumerate(columns):
      dots += rows[:, d, None] * column.astype(np.float64)
      row_norms += rows[:, d] * rows[:, d]
    with np.errstate(invalid='ignore', divide='ignore'):
      cosines = dots / np.sqrt(row_norms[:, None] * column_norms)
    out[begin : begin + len(rows)] = np.nan_to_num(cosines, nan=0.0)
  return out


_QUERY_BLOCK = 64  # queries per block of `similarities` (no effect on any score's bits)


def _by_similarity(row: np.ndarray) -> Iterator[tuple[int, float]]:
  """(entry index, similarity) by falling similarity, for one query's row [N]."""
  return ((int(i), float(row[i])) for i in np.argsort(-row, kind='stable'))


def _matrix_bytes(matrix: np.ndarray) -> bytes:
  """What the router file's SHA-256 covers of the embeddings: dtype, shape, then the bytes."""
  head = f'{matrix.dtype.name}{list(matrix.shape)}\n'.encode()
  return head + np.ascontiguousarray(matrix).tobytes()


class FitError(GraftjaxError, ValueError):
  """No threshold keeps the false-hit rate within the bound on the queries given."""


class BoundError(FitError):
  """The queries given are too few to bound a false-hit rate by its Wilson upper limit."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """A router's top-1 routing at one threshold, over labelled queries.

  Attributes:
    threshold: hits score >= threshold.
    accuracy: hits to the true key, among queries that have one (None if none).
    false_hit: hits to a wrong key (any key, for a query that should abstain),
      among all queries.
    false_hit_abstain: hits among queries that should abstain (None if none).
    abstain: queries with no hit, among all queries.
  """

  threshold: float
  accuracy: stats.Rate | None
  false_hit: stats.Rate
  false_hit_abstain: stats.Rate | None
  abstain: stats.Rate

  def to_json(self) -> dict[str, Any]:
    rates = ('accuracy', 'false_hit', 'false_hit_abstain', 'abstain')
    out = {name: getattr(self, name) for name in rates}
    return {
      'threshold': self.threshold if math.isfinite(self.threshold) else str(self.threshold),
      **{name: rate.to_json() if rate else None for name, rate in out.items()},
    }


Labelled = Sequence[tuple[str, str | None]]


def _top1(router: Router, labelled: Labelled) -> list[Hit | None]:
  routed = router.route_many([query for query, _ in labelled], 1, threshold=-math.inf)
  return [hits[0] if hits else None for hits in routed]


def _evaluation(top1, labelled: Labelled, threshold: float, confidence: float) -> Evaluation:
  truths = [key for _, key in labelled]
  hits = [hit if hit is not None and hit.score >= threshold else None for hit in top1]
  correct = sum(h is not None and h.key == t for h, t in zip(hits, truths) if t is not None)
  wrong = sum(h is not None and h.key != t for h, t in zip(hits, truths))
  abstain_hits = sum(h is not None for h, t in zip(hits, truths) if t is None)
  with_key = sum(t is not None for t in truths)
  n = len(truths)
  rate = lambda s, trials: stats.rate(s, trials, confidence=confidence) if trials else None
  return Evaluation(
    threshold=threshold,
    accuracy=rate(correct, with_key),
    false_hit=rate(wrong, n),
    false_hit_abstain=rate(abstain_hits, n - with_key),
    abstain=rate(sum(h is None for h in hits), n),
  )


def evaluate(
  router: Router, labelled: Labelled, threshold: float, *, confidence: float = 0.95
) -> Evaluation:
  """Top-1 routing of (query, true key or None to abstain) pairs at threshold.

  Raises:
    ValueError: if `labelled` is empty.
  """
  if not labelled:
    raise ValueError('nothing to evaluate: no labelled queries')
  return _evaluation(_top1(router, labelled), labelled, threshold, confidence)


def sweep(
  router: Router,
  labelled: Labelled,
  *,
  max_false_hit: float,
  abstain_only: bool = False,
  conservative: bool = False,
  confidence: float = 0.95,
) -> tuple[Evaluation, list[Evaluation]]:
  """The threshold of best accuracy whose false-hit rate is at most max_false_hit.

  Candidates are every distinct top-1 score and +inf (always abstain). Ties in accuracy go to the fewer false hits, then
  the higher threshold.

  Args:
    router: the router (its own threshold is ignored).
    labelled: (query, true key or None to abstain) pairs.
    max_false_hit: the bound on the false-hit rate.
    abstain_only: bound `false_hit_abstain` (among queries that should
      abstain) instead of `false_hit` (among all queries).
    conservative: bound the Wilson upper limit, not the point estimate.
    confidence: of the Wilson intervals.
  Returns:
    (the chosen evaluation, every candidate's evaluation by rising threshold).
  Raises:
    ValueError: if `labelled` is empty.
    FitError: no threshold meets the bound (with `conservative`, even 0 false hits
      has a Wilson upper limit above 0).
  """
  if not labelled:
    raise ValueError('nothing to evaluate: no labelled queries')
  top1 = _top1(router, labelled)
  thresholds = sorted({hit.score for hit in top1 if hit is not None}) + [math.inf]
  curve = [_evaluation(top1, labelled, t, confidence) for t in thresholds]

  def false_hit(e: Evaluation) -> float:
    rate = e.false_hit_abstain if abstain_only else e.false_hit
    if rate is None:
      raise ValueError('abstain_only needs queries that should abstain')
    return rate.high if conservative else rate.value

  accuracy = lambda e: e.accuracy.value if e.accuracy else 0.0
  feasible = [e for e in curve if false_hit(e) <= max_false_hit]
  if not feasible:
    raise FitError(
      f'no threshold keeps the false-hit rate <= {max_false_hit} on {len(top1)} queries'
    )
  best = max(feasible, key=lambda e: (accuracy(e), -false_hit(e), e.threshold))
  return best, curve


# Calibrated thresholds: fitted on one labelled split, reported on a disjoint one ------------


@dataclasses.dataclass(frozen=True)
class Queries:
  """Labelled routing queries, in three groups.

  Attributes:
    deposited: (query, key): the text a block was deposited under, and that block.
    reworded: (query, key): another wording of a deposited question, and its block.
    unrelated: queries no block answers (a router should abstain).
  """

  deposited: Sequence[tuple[str, str]] = ()
  reworded: Sequence[tuple[str, str]] = ()
  unrelated: Sequence[str] = ()

  def labelled(self) -> list[tuple[str, str | None]]:
    """Every query with its true key (None: should abstain)."""
    return [*self.deposited, *self.reworded, *((q, None) for q in self.unrelated)]

  def counts(self) -> dict[str, int]:
    return {
      'deposited': len(self.deposited),
      'reworded': len(self.reworded),
      'unrelated': len(self.unrelated),
    }


def split(queries: Queries, *, seed: int = 0) -> tuple[Queries, Queries, dict[str, Any]]:
  """(calibration, report, the split): each group shuffled by `seed` and halved.

  The calibration half of a group of n is its first n // 2 after the shuffle;
  the split records, per group, the calibration indices into the group.
  """
  halves, chosen = ({}, {}), {}
  for name in ('deposited', 'reworded', 'unrelated'):
    group = list(getattr(queries, name))
    order = list(range(len(group)))
    random.Random(f'{seed}/{name}').shuffle(order)
    first = sorted(order[: len(group) // 2])
    chosen[name] = first
    halves[0][name] = [group[i] for i in first]
    halves[1][name] = [group[i] for i in sorted(order[len(group) // 2 :])]
  return Queries(**halves[0]), Queries(**halves[1]), {'seed': seed, 'calibration': chosen}


@dataclasses.dataclass(frozen=True)
class Report:
  """A router at one threshold, on labelled queries it was not fitted on.

  Attributes:
    threshold: hits score >= threshold.
    deposited: hits to the true block among deposited queries (None if none).
    reworded: hits to the true block among reworded queries (None if none).
    false_hit: hits of any block among unrelated queries (None if none).
  """

  threshold: float
  deposited: stats.Rate | None
  reworded: stats.Rate | None
  false_hit: stats.Rate | None

  def to_json(self) -> dict[str, Any]:
    rates = {n: getattr(self, n) for n in ('deposited', 'reworded', 'false_hit')}
    threshold = self.threshold if math.isfinite(self.threshold) else str(self.threshold)
    return {'threshold': threshold, **{n: r.to_json() if r else None for n, r in rates.items()}}


def report(
  router: Router, queries: Queries, threshold: float, *, confidence: float = 0.95
) -> Report:
  """Hit rates on deposited and reworded queries, false-hit rate on unrelated ones."""
  labelled = queries.labelled()
  if not labelled:
    raise ValueError('nothing to report: no labelled queries')
  top1 = _top1(router, labelled)
  hits = [h if h is not None and h.score >= threshold else None for h in top1]
  n_dep, n_rew = len(queries.deposited), len(queries.reworded)

  def rate(found, truths, right):
    count = sum(right(h, t) for h, (_, t) in zip(found, truths))
    return stats.rate(count, len(truths), confidence=confidence) if truths else None

  to_key = lambda h, t: h is not None and h.key == t
  return Report(
    threshold=threshold,
    deposited=rate(hits[:n_dep], labelled[:n_dep], to_key),
    reworded=rate(hits[n_dep : n_dep + n_rew], labelled[n_dep : n_dep + n_rew], to_key),
    false_hit=rate(hits[n_dep + n_rew :], labelled[n_dep + n_rew :], lambda h, t: h is not None),
  )


@dataclasses.dataclass(frozen=True)
class Bound:
  """Whether the false-hit rate on held-out unrelated queries is bounded at `max_false_hit`:
  its Wilson upper limit (at the rate's confidence) at most the bound.

  Attributes:
    max_false_hit: the bound.
    upper: the Wilson upper limit of the held-out false-hit rate (None: no unrelated
      queries held out).
    met: upper <= max_false_hit.
    needed: held-out unrelated queries at which 0 false hits would meet the bound
      (`stats.trials_to_bound`): with fewer, no result can (None for a bound of 0).
    why: why the bound is not met (None when it is).
  """

  max_false_hit: float
  upper: float | None
  met: bool
  needed: int | None
  why: str | None

  @classmethod
  def of(cls, false_hit: stats.Rate | None, max_false_hit: float, confidence: float) -> Bound:
    needed = None  # a bound of 0 (or 1) no Wilson upper limit meets (or misses)
    if 0 < max_false_hit < 1:
      needed = stats.trials_to_bound(max_false_hit, confidence=confidence)
    if false_hit is None:
      return cls(max_false_hit, None, False, needed, 'no unrelated queries held out')
    met, n = false_hit.high <= max_false_hit, false_hit.trials
    why = None
    if not met and needed is not None and n < needed:
      why = (
        f'{n} unrelated queries held out: even 0 false hits has a Wilson upper limit of'
        f' {stats.wilson(0, n, confidence=confidence)[1]:.1%} > {max_false_hit:.1%};'
        f' at least {needed} are needed'
      )
    elif not met:
      why = (
        f'{false_hit.successes}/{n} false hits held out: Wilson upper limit'
        f' {false_hit.high:.1%} > {max_false_hit:.1%}'
      )
    return cls(max_false_hit, false_hit.high, met, needed, why)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A router's threshold fitted on a calibration split, reported on a disjoint one.

  Attributes:
    router: the router's class name.
    threshold: the fitted threshold (`sweep`'s choice on the calibration split).
    max_false_hit: the bound the fit kept.
    bounded: what the bound was on: 'unrelated' (hits among unrelated queries)
      or 'all' (wrong hits among all queries, where there are no unrelated ones).
    conservative: the fit bounded the Wilson upper limit (True) or the point estimate.
    split: the seed and, per group, the calibration indices (`split`).
    fitted: the calibration split's evaluation at the fitted threshold.
    report: the report split's rates at the fitted threshold.
    held_out: whether the report split's false-hit rate is bounded (`Bound`).
    sizes: queries per group in each split.
  """

  router: str
  threshold: float
  max_false_hit: float
  bounded: str
  conservative: bool
  split: dict[str, Any]
  fitted: Evaluation
  report: Report
  held_out: Bound
  sizes: dict[str, dict[str, int]]

  def to_json(self) -> dict[str, Any]:
    return {
      'router': self.router,
      'threshold': self.threshold if math.isfinite(self.threshold) else str(self.threshold),
      'max_false_hit': self.max_false_hit,
      'bounded': self.bounded,
      'conservative': self.conservative,
      'split': self.split,
      'sizes': self.sizes,
      'fitted': self.fitted.to_json(),
      'report': self.report.to_json(),
      'held_out': self.held_out.to_json(),
    }


def calibrate(
  router: Router,
  queries: Queries,
  *,
  seed: int = 0,
  max_false_hit: float = 0.05,
  conservative: bool = False,
  confidence: float = 0.95,
) -> Calibration:
  """Fits `router.threshold` on half of `queries` and reports it on the other half.

  Sets `router.threshold` to the fitted value. With unrelated queries the fit
  bounds the false-hit rate among them; without, the rate of wrong hits among
  all queries. `conservative` bounds the rate's Wilson upper limit, not its point
  estimate: the fit then needs at least `stats.trials_to_bound(max_false_hit)` bounded
  queries in its half. The report half's false-hit rate, with its interval, is checked
  against the bound too (`Calibration.held_out`).

  Raises:
    BoundError: `conservative`, and the calibration half has too few queries to bound.
    FitError: no threshold meets the bound (`sweep`).
    ValueError: a split is empty, or a query text is in both splits.
  """
  fit_on, report_on, chosen = split(queries, seed=seed)
  if not fit_on.labelled() or not report_on.labelled():
    raise ValueError(f'too few queries to split for calibration: {queries.counts()}')
  both = {normalize(q) for q, _ in fit_on.labelled()} & {
    normalize(q) for q, _ in report_on.labelled()
  }
  if both:
    raise ValueError(
      f'{len(both)} query texts are in both the calibration and the report split,'
      f' e.g. {min(both)!r}: the splits must be disjoint'
    )
  bounded = 'unrelated' if fit_on.unrelated else 'all'
  if conservative:
    check_bound(queries, max_false_hit=max_false_hit, confidence=confidence)
  fitted, _ = sweep(
    router,
    fit_on.labelled(),
    max_false_hit=max_false_hit,
    abstain_only=bounded == 'unrelated',
    conservative=conservative,
    confidence=confidence,
  )
  router.threshold = fitted.threshold
  reported = report(router, report_on, fitted.threshold, confidence=confidence)
  return Calibration(
    router=type(router).__name__,
    threshold=fitted.threshold,
    max_false_hit=max_false_hit,
    bounded=bounded,
    conservative=conservative,
    split=chosen,
    fitted=fitted,
    report=reported,
    held_out=Bound.of(reported.false_hit, max_false_hit, confidence),
    sizes={'calibration': fit_on.counts(), 'report': report_on.counts()},
  )


def check_bound(queries: Queries, *, max_false_hit: float, confidence: float = 0.95) -> None:
  """Raises `BoundError` unless `calibrate(..., conservative=True)` has enough queries to
  bound: each half of the unrelated queries (of all queries, without unrelated ones) at
  least `stats.trials_to_bound(max_false_hit)`."""
  if not 0 < max_false_hit < 1:
    raise BoundError(f'the bound must lie in (0, 1), got {max_false_hit}')
  needed = stats.trials_to_bound(max_false_hit, confidence=confidence)
  groups = [queries.unrelated] if queries.unrelated else [queries.deposited, queries.reworded]
  what = 'unrelated' if queries.unrelated else 'labelled'
  n, fit = sum(map(len, groups)), sum(len(g) // 2 for g in groups)  # `split`'s first half
  if fit < needed:
    raise BoundError(
      f'cannot bound false hits at {max_false_hit:.1%} (Wilson {confidence:.0%} upper limit)'
      f' with {n} {what} queries: the calibration half holds {fit}, and even 0 false hits of'
      f' {fit} has an upper limit of {stats.wilson(0, max(fit, 1), confidence=confidence)[1]:.1%};'
      f' it needs at least {needed} ({2 * needed} {what} queries in all)'
    )
