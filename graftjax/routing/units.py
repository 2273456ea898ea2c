"""Routing units: BM25 over fixed-size windows of each page's text, a page scored by its best;
the same units fused with the model's own embedding, the top pages reranked by the model.

    router = UnitRouter(threshold=None, unit_words=64)
    catalog = Catalog(path, router=router, store=store)   # routes pages of any mix of sizes
    route.calibrate(router, route.Queries(deposited=asked, unrelated=absent))  # its threshold
    router = HybridRouter(model, threshold=None, rerank=4, rerank_rare=4)   # + 4 by rare words

A threshold is fitted on labelled questions (`route.calibrate`); 0.0 abstains on nothing.

Details and why: docs/paging.md, section `graftjax/routing/units.py`.
"""

from __future__ import annotations

import collections
import functools
import math
import numbers
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

import bm25s
import jax
import jax.numpy as jnp
import numpy as np

from graftjax.models.gemma import ops
from graftjax.routing import route as route_lib


def units(text: str, unit_words: int, stride_words: int) -> list[str]:
  """`text` as windows of `unit_words` whitespace-separated words, one every `stride_words`.

  A text of at most `unit_words` words is one unit; the last window ends at the text's
  last word, so every word is in some unit, and any run of at most
  `unit_words - stride_words + 1` consecutive words lies whole inside one unit.
  """
  if not 0 < stride_words <= unit_words:
    raise ValueError(f'need 0 < stride_words <= unit_words, got {stride_words}, {unit_words}')
  words = text.split()
  if len(words) <= unit_words:
    return [' '.join(words)]
  starts = list(range(0, len(words) - unit_words, stride_words)) + [len(words) - unit_words]
  return [' '.join(words[begin : begin + unit_words]) for begin in starts]


class UnitRouter(route_lib.BM25Router):
  """BM25 over routing units of one size, distinct from the pages installed.

  Each page's text is cut into `units` of `unit_words` words (overlapping by
  `unit_words - stride_words`); BM25 ranks the units without length
  normalisation (`b=0` by default: every unit but a short page's single one has
  the same length, and a short one earns no bonus for being short) and a page
  takes its best unit's rank and score (a fraction of that unit's self-score,
  as `BM25Router`). `entries` lists the units.
  """

  kind: ClassVar[str] = 'bm25-units'
  _file_fields = (*route_lib.BM25Router._file_fields, 'unit_words', 'stride_words')

  def __init__(
    self,
    *,
    threshold: float | None,
    unit_words: int = 64,
    stride_words: int | None = None,
    k1: float = 1.5,
    b: float = 0.0,
  ):
    super().__init__(threshold=threshold, k1=k1, b=b)
    stride_words = unit_words // 2 if stride_words is None else stride_words
    route_lib.check_settings(unit_words=unit_words, stride_words=stride_words)
    self.unit_words, self.stride_words = unit_words, stride_words
    self._idf: np.ndarray | None = None  # [terms] float64, lucene IDF over the units
    self._idf_unseen = 0.0

  def add(self, key: str, text: str) -> bool:
    """Stores the units of `text` under `key`; False if every one was stored already."""
    if not isinstance(text, str):
      return super().add(key, text)  # raises the TypeError
    if not route_lib.normalize(text):
      return super().add(key, text)  # raises the ValueError
    return any([super(UnitRouter, self).add(key, u) for u in self.units_of(text)])  # noqa: C419 (add all)

  def units_of(self, text: str) -> list[str]:
    """The routing units of `text` (those with something to route by)."""
    return [u for u in units(text, self.unit_words, self.stride_words) if route_lib.normalize(u)]

  def _build(self) -> bm25s.BM25:
    index = super()._build()
    if self._idf is None:
      n = len(self)
      df = np.diff(index.scores['indptr'])  # units holding each term
      self._idf = np.log1p((n - df + 0.5) / (df + 0.5))
      self._idf_unseen = float(np.log1p((n - 1 + 0.5) / 1.5))
    return index

  def _added(self, index: int) -> None:
    super()._added(index)
    self._idf = None

  def _ranked(self, index: bm25s.BM25, terms: list[str]) -> Iterator[tuple[int, float]]:
    terms = {t for t in terms if t}
    ids = sorted(index.vocab_dict[t] for t in terms if t in index.vocab_dict)
    if not ids:
      return iter(())
    raw = index.get_scores(ids)
    unseen = len(terms) - len(ids)
    ideal = (self._idf[ids].sum() + unseen * self._idf_unseen) / (1 + self.k1)
    order = np.argsort(-raw, kind='stable')
    order = order[raw[order] > 0]
    return ((int(i), float(raw[i] / ideal)) for i in order)

  def rare_words(self, query: str) -> list[str]:
    """The query's terms the units hold whose IDF is at least the mean over those terms (a
    name rather than the words a template repeats), in sorted order; [] if none is held."""
    if not self._entries:
      return []
    index = self._build()
    (terms,) = self._tokens([query])
    held = sorted({t for t in terms if t in index.vocab_dict})
    idf = np.asarray([self._idf[index.vocab_dict[t]] for t in held])
    return [t for t, w in zip(held, idf) if w >= idf.mean()]

  def rare_weights(self, query: str, texts: Sequence[str]) -> np.ndarray:
    """For each text, the summed IDF over the units of the query's `rare_words` it holds (a
    page naming the whole subject outweighs a note naming its first name): [len(texts)]."""
    rare = self.rare_words(query)
    if not rare:
      return np.zeros(len(texts), np.float64)
    index = self._build()
    idf = {t: float(self._idf[index.vocab_dict[t]]) for t in rare}
    held = self._tokens(list(texts))
    return np.asarray(
      [math.fsum(idf[t] for t in sorted(idf.keys() & set(terms))) for terms in held]
    )

  def _rare_ranked(self, query: str) -> Iterator[tuple[int, float]]:
    """(unit index, score) by BM25 over the query's `rare_words` alone, in tie order."""
    rare = self.rare_words(query)
    return self._ordered(query, self._ranked(self._build(), rare)) if rare else iter(())

  def _state(self) -> dict:
    return {**super()._state(), 'unit_words': self.unit_words, 'stride_words': self.stride_words}

  @classmethod
  def load(cls, path: str | pathlib.Path) -> UnitRouter:
    body = cls._read(path)
    router = cls(
      threshold=body['threshold'],
      unit_words=body['unit_words'],
      stride_words=body['stride_words'],
      k1=body['k1'],
      b=body['b'],
    )
    router.add_many((key, text) for key, text in body['entries'])
    return router


def query_gain(
  model,
  query: str | Sequence[int],
  contexts: Sequence[str | Sequence[int]],
  *,
  chunk_size: int = 64,
  encode: route_lib.Encode | None = None,
  weigh: Callable[[list[int]], np.ndarray] | None = None,
) -> np.ndarray:
  """How much each context raises the model's likelihood of `query`, in nats per query token.

  Row 0 is BOS + query; row i + 1 is BOS + contexts[i] + a newline + query, right-padded
  (causal: padding after a row changes none of its logits). The gain of context i is the
  mean over the query's tokens of log p(token | row i + 1 so far) - log p(token | row 0 so
  far): about 0 for a context that says nothing of the query, larger for one that predicts it.
  With `weigh`, the mean is weighted by `weigh(query token ids)` [T] (non-negative, not all 0).

  Args:
    model: a `Gemma`.
    query, contexts: strings, or token id lists without BOS.
    chunk_size: tokens per forward call (rows are padded to a multiple of it).
    encode: str -> token ids without BOS; default the model's tokenizer.
    weigh: the query's token ids -> their weights; None for the plain mean.
  Returns:
    [len(contexts)] float64.
  """
  ids = lambda text: route_lib._token_ids(model, text, encode)[1:]
  asked = ids(query)
  newline = ids('\n') if isinstance(query, str) else []
  rows = [[model.config.bos_id, *asked]]
  rows += [[model.config.bos_id, *ids(c), *newline, *asked] for c in contexts]
  # Shapes rounded up (rows to 4, length to chunk_size, query tokens to 16) so that few compile.
  length = _round_up(max(map(len, rows)), chunk_size)
  tokens = np.full((_round_up(len(rows), 4), length), model.config.pad_id, np.int32)
  before = np.zeros((len(tokens), _round_up(len(asked), 16)), np.int32)
  for r, row in enumerate(rows):
    tokens[r, : len(row)] = row
    before[r, : len(asked)] = np.arange(len(row) - len(asked) - 1, len(row) - 1)
  targets = np.zeros(before.shape[1], np.int32)
  targets[: len(asked)] = asked
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)
  cache = model.init_cache(
    batch_size=len(tokens), capacity=_round_up(length, ops.CAPACITY_MULTIPLE)
  )
  hidden = []
  for begin in range(0, length, chunk_size):
    span = slice(begin, begin + chunk_size)
    out, cache = model.forward(tokens[:, span], positions[:, span], cache, logits='hidden')
    hidden.append(out)
  logp = _log_probs(hidden, before, targets, model.params['embedding'], model.config)
  logp = np.asarray(logp, np.float64)[: len(rows), : len(asked)]
  gains = logp[1:] - logp[0]  # [C, T]
  if weigh is None:
    return gains.mean(axis=1)
  weights = np.asarray(weigh(asked), np.float64)
  if weights.shape != (len(asked),) or not (weights >= 0).all() or not weights.sum() > 0:
    raise ValueError(f'weigh must give {len(asked)} weights >= 0, not all 0; got {weights}')
  return gains @ weights / weights.sum()


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


@functools.partial(jax.jit, static_argnames='config')
def _log_probs(hidden, before, targets, table, config):
  """log p(targets [T]) after the positions `before` [R, T] of the final-norm hidden states
  (chunks [R, C, D]), by the tied table [V, D]: [R, T] float32."""
  picked = jnp.take_along_axis(jnp.concatenate(hidden, axis=1), before[..., None], axis=1)
  logits = ops.unembed(picked, table, impl='xla', precision=config.dot_precision)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, jnp.broadcast_to(targets, before.shape)[..., None], -1)[..., 0]


RERANK_WEIGHTINGS = ('idf', 'mean')


class HybridRouter(route_lib.Router):
  """BM25 over routing units mixed with the model's own embedding of the same units; the top
  pages optionally reranked by the model.

  Each page's text is cut into the units of a `UnitRouter` (b=0). A unit scores
  `weight * bm25 + (1 - weight) * cosine`: bm25 the `UnitRouter` score (the fraction of the
  query's IDF the unit holds), cosine that of the `EmbeddingRouter`'s mean-pooled hidden
  states (not computed at `weight` 1). A page takes its best unit. With `rerank` > 0, the
  `rerank` best pages (the candidates) are reordered by `query_gain` of the query after each
  page's best unit, their score becomes that gain (nats per query token), and no more than
  `rerank` pages are returned. The rerank only reorders its candidates: a page outside them
  stays unreachable, so `rerank` is set by the first stage's recall at that many pages, not
  by the k asked for (a store with many short pages that repeat the question's words pushes
  the right page below the top 4; docs/paging.md). `rerank_rare` > 0 adds up to that many
  candidates ranked by BM25 over the query's `UnitRouter.rare_words` alone (its names, not
  the words short notes repeat), so at most `rerank + rerank_rare` pages are returned.
  `rerank_weighting` 'idf' weights each query token's gain by its `token_idf` over the units
  (a name's tokens count, the words hundreds of notes repeat hardly); 'mean' weights them
  alike (routers saved before the setting load with it). With `rerank_names` the candidates
  are ordered first by the IDF of the query's rare words each holds (`UnitRouter.rare_weights`:
  the page naming the whole subject before notes naming its first name), then by their gain
  (routers saved before the setting load without it). Candidates are distinct pages by
  content: a copy of a page already among them takes no place of its own.
  `entries` lists the units, keyed by their page.
  """

  kind: ClassVar[str] = 'hybrid-units'
  _file_fields = (
    *route_lib.Router._file_fields,
    'unit_words',
    'stride_words',
    'k1',
    'weight',
    'rerank',
    'chunk_size',
    'batch_size',
    'fingerprint',
  )

  def __init__(
    self,
    model,
    *,
    threshold: float | None,
    weight: float = 1.0,
    rerank: int = 0,
    rerank_rare: int = 0,
    rerank_weighting: str = 'idf',
    rerank_names: bool = True,
    unit_words: int = 64,
    stride_words: int | None = None,
    k1: float = 1.5,
    chunk_size: int = 64,
    batch_size: int = 8,
    encode: route_lib.Encode | None = None,
  ):
    super().__init__(threshold=threshold)
    route_lib.check_settings(weight=weight, rerank=rerank)
    _check_rerank_rare(rerank_rare)
    _check_rerank_weighting(rerank_weighting)
    self.model, self.weight, self.rerank, self.encode = model, weight, rerank, encode
    _check_rerank_names(rerank_names)
    self.rerank_rare, self.rerank_weighting = rerank_rare, rerank_weighting
    self.rerank_names = rerank_names
    self._contents: dict[str, tuple[str, ...]] = {}  # page key -> its units, in order
    self._contents_at = 0  # entries counted in it
    self._token_df: collections.Counter[int] = collections.Counter()  # units holding each id
    self._df_units = 0  # units counted in it
    self.lexical = UnitRouter(
      threshold=-np.inf, unit_words=unit_words, stride_words=stride_words, k1=k1
    )
    self.dense = route_lib.EmbeddingRouter(
      model, threshold=-np.inf, chunk_size=chunk_size, batch_size=batch_size, encode=encode
    )

  def add(self, key: str, text: str) -> bool:
    """Stores the units of `text` under `key`; False if every one was stored already."""
    new = self.lexical.add(key, text)  # refuses what `Router.add` refuses
    for unit in self.lexical.units_of(text):
      if super().add(key, unit):
        self.dense.add(key, unit)
    return new

  def _rank_many(self, queries: Sequence[str]) -> list[Iterator[tuple[int, float]]]:
    if not self._entries:
      return [iter(()) for _ in queries]
    scores = np.zeros((len(queries), len(self._entries)), np.float64)  # [Q, units]
    for row, ranked in zip(scores, self.lexical._rank_many(queries)):
      for index, score in ranked:
        row[index] = score
    scores *= self.weight
    if self.weight < 1.0:
      cosines = route_lib.similarities(self.dense.embed(queries), self.dense.matrix)
      scores += (1.0 - self.weight) * cosines
    ranked = [_by_score(row) for row in scores]
    if not self.rerank and not self.rerank_rare:
      return ranked
    return [
      self._reranked(query, self._ordered(query, order)) for query, order in zip(queries, ranked)
    ]

  def _reranked(
    self, query: str, ranked: Iterator[tuple[int, float]]
  ) -> Iterator[tuple[int, float]]:
    """The `rerank` best pages (each by its best unit) and up to `rerank_rare` more by the
    query's rare words, a copy of a page already taken skipped, by `query_gain` (after the
    IDF of the rare words each holds, with `rerank_names`), best first: (unit, gain, rank)."""
    best: dict[str, int] = {}
    taken: set[tuple[str, ...]] = set()  # the contents of the pages in `best`

    def take(index: int) -> bool:
      key = self._entries[index][0]
      content = self.page_contents()[key]
      if key in best or content in taken:
        return False
      best[key] = index
      taken.add(content)
      return True

    for index, _ in ranked:
      if len(best) == self.rerank:
        break
      take(index)
    added = 0
    for index, _ in self.lexical._rare_ranked(query) if self.rerank_rare else ():
      if added == self.rerank_rare:
        break
      added += take(index)
    units_ = list(best.values())
    if not units_:
      return iter(())
    texts = [self._entries[i][1] for i in units_]
    names = self.lexical.rare_weights(query, texts) if self.rerank_names else np.zeros(len(texts))
    gains = query_gain(
      self.model,
      query,
      texts,
      chunk_size=self.dense.chunk_size,
      encode=self.encode,
      weigh=self.token_idf if self.rerank_weighting == 'idf' else None,
    )
    order = np.lexsort((-gains, -names))  # by names, then by gain; stable
    return ((units_[j], float(gains[j]), (float(names[j]), float(gains[j]))) for j in order)

  def page_contents(self) -> dict[str, tuple[str, ...]]:
    """Each page key's units in the order stored: a page's content, as routing sees it."""
    if self._contents_at != len(self._entries):
      pages = collections.defaultdict(list)
      for key, unit in self._entries:
        pages[key].append(unit)
      self._contents = {key: tuple(found) for key, found in pages.items()}
      self._contents_at = len(self._entries)
    return self._contents

  def token_idf(self, ids: Sequence[int]) -> np.ndarray:
    """Each token id's IDF over the units as the model's tokenizer cuts them,
    log(1 + (N - df + 0.5) / (df + 0.5)) for N units, df of them holding the id: [len(ids)]."""
    for _, unit in self._entries[self._df_units :]:
      self._token_df.update(set(route_lib._token_ids(self.model, unit, self.encode)[1:]))
    self._df_units = len(self._entries)
    df = np.asarray([self._token_df[i] for i in ids], np.float64)
    return np.log1p((self._df_units - df + 0.5) / (df + 0.5))

  def _state(self) -> dict:
    return {
      **super()._state(),
      'unit_words': self.lexical.unit_words,
      'stride_words': self.lexical.stride_words,
      'k1': self.lexical.k1,
      'weight': self.weight,
      'rerank': self.rerank,
      **({'rerank_rare': self.rerank_rare} if self.rerank_rare else {}),
      'rerank_weighting': self.rerank_weighting,
      **({'rerank_names': True} if self.rerank_names else {}),
      'chunk_size': self.dense.chunk_size,
      'batch_size': self.dense.batch_size,
      'fingerprint': self.model.fingerprint,
    }

  def _matrix(self) -> np.ndarray:
    """The units' embeddings where the weight uses them, else none: [N or 0, D] float32."""
    if self.weight < 1.0:
      return self.dense.matrix
    return np.zeros((0, self.model.config.embed_dim), np.float32)

  def save(self, path: str | pathlib.Path) -> None:
    """JSON as `Router.save` plus the units' embeddings in `<path>.npy` (none at weight 1);
    the recorded SHA-256 covers the entries, settings and embeddings together."""
    matrix = self._matrix()
    partial = pathlib.Path(f'{path}.partial.npy')
    np.save(partial, matrix, allow_pickle=False)
    partial.replace(pathlib.Path(f'{path}.npy'))
    route_lib._write_json(path, self._state(), route_lib._matrix_bytes(matrix))

  @classmethod
  def load(
    cls, path: str | pathlib.Path, model, *, encode: route_lib.Encode | None = None
  ) -> HybridRouter:
    """Restores a saved router; re-embeds (lazily) if `model` is not the one it was saved with.

    Raises:
      RouterFileError: the file or its embeddings are unreadable, of another kind, or do not
        match the recorded SHA-256 (entries, settings and embeddings, in their pairing).
    """
    try:
      matrix = np.load(pathlib.Path(f'{path}.npy'), allow_pickle=False)
    except (OSError, ValueError) as e:
      raise route_lib.RouterFileError(f'{path}.npy: cannot read the embeddings: {e}') from e
    body = cls._read(path, route_lib._matrix_bytes(matrix))
    router = cls(
      model,
      threshold=body['threshold'],
      weight=body['weight'],
      rerank=body['rerank'],
      rerank_rare=_loaded_rerank_rare(path, body),
      rerank_weighting=_loaded_rerank_weighting(path, body),
      rerank_names=_loaded_rerank_names(path, body),
      unit_words=body['unit_words'],
      stride_words=body['stride_words'],
      k1=body['k1'],
      chunk_size=body['chunk_size'],
      batch_size=body['batch_size'],
      encode=encode,
    )
    for key, unit in body['entries']:
      router.lexical.add(key, unit)  # a unit is its own single unit
      if route_lib.Router.add(router, key, unit):
        router.dense.add(key, unit)
    if len(matrix) not in (0, len(router)):
      raise route_lib.RouterFileError(f'{path}: {len(router)} units but {len(matrix)} embeddings')
    if len(matrix) and body['fingerprint'] == model.fingerprint:
      router.dense._matrix = matrix
    return router


def _check_rerank_rare(value) -> None:
  if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0):
    raise ValueError(f'rerank_rare must be an integer >= 0, got {value!r}')


def _loaded_rerank_rare(path, body: dict) -> int:
  """A file's `rerank_rare` (0 where a file from before it records none)."""
  value = body.get('rerank_rare', 0)
  try:
    _check_rerank_rare(value)
  except ValueError as e:
    raise route_lib.RouterFileError(f'{path}: {e}') from e
  return value


def _check_rerank_weighting(value) -> None:
  if value not in RERANK_WEIGHTINGS:
    raise ValueError(f'rerank_weighting must be one of {RERANK_WEIGHTINGS}, got {value!r}')


def _loaded_rerank_weighting(path, body: dict) -> str:
  """A file's `rerank_weighting` ('mean', the only one then, where a file from before it
  records none)."""
  value = body.get('rerank_weighting', 'mean')
  try:
    _check_rerank_weighting(value)
  except ValueError as e:
    raise route_lib.RouterFileError(f'{path}: {e}') from e
  return value


def _check_rerank_names(value) -> None:
  if not isinstance(value, bool):
    raise ValueError(f'rerank_names must be a bool, got {value!r}')


def _loaded_rerank_names(path, body: dict) -> bool:
  """A file's `rerank_names` (False, the rerank by gain alone, where a file from before it
  records none)."""
  value = body.get('rerank_names', False)
  try:
    _check_rerank_names(value)
  except ValueError as e:
    raise route_lib.RouterFileError(f'{path}: {e}') from e
  return value


def _by_score(row: np.ndarray) -> Iterator[tuple[int, float]]:
  """(unit index, score) by falling score for one query's row [N]; units scoring 0 dropped."""
  order = np.argsort(-row, kind='stable')
  return ((int(i), float(row[i])) for i in order if row[i] != 0.0)
