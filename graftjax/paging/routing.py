"""Routing units: BM25 over fixed-size windows of each page's text, a page scored by its best.

    router = UnitRouter(threshold=0.0, unit_words=64)
    catalog = Catalog(path, router=router, store=store)   # routes pages of any mix of sizes

Details and why: docs/paging.md, section `graftjax/paging/routing.py`.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import ClassVar

import bm25s
import numpy as np

from graftjax.flywheel import route as route_lib


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
    threshold: float,
    unit_words: int = 64,
    stride_words: int | None = None,
    k1: float = 1.5,
    b: float = 0.0,
  ):
    super().__init__(threshold=threshold, k1=k1, b=b)
    stride_words = unit_words // 2 if stride_words is None else stride_words
    if not 0 < stride_words <= unit_words:
      raise ValueError(f'need 0 < stride_words <= unit_words, got {stride_words}, {unit_words}')
    self.unit_words, self.stride_words = unit_words, stride_words
    self._idf: np.ndarray | None = None  # [terms] float64, lucene IDF over the units
    self._idf_unseen = 0.0

  def add(self, key: str, text: str) -> bool:
    """Stores the units of `text` under `key`; False if every one was stored already."""
    if not isinstance(text, str):
      return super().add(key, text)  # raises the TypeError
    if not route_lib.normalize(text):
      return super().add(key, text)  # raises the ValueError
    return any([super(UnitRouter, self).add(key, u) for u in self._units(text)])  # noqa: C419 (add all)

  def _units(self, text: str) -> list[str]:
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
