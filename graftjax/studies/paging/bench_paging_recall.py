"""Paged recall: overlapping pages against facts cut by a boundary, and routing over mixed sizes.

The library of experiments/bench_paging_recall.py. Two measurements:

- `overlap_rows`: a document cut into pages of `page_tokens` with each overlap
  (`pages.cut`), facts planted across the plain pages' boundaries; per
  overlap, the pages and bytes stored per document token, how often the page
  BM25 routes a fact's question to holds the whole fact, and the access time
  (route + read + verify + install) on this machine.
- `routing_rows`: a synthetic store of long pages (real text, one fact of one of
  several templates each) and many short pages that repeat the templates'
  words (`mixed_store`); per router, top-1 and top-4 routing of direct and
  reworded questions with Wilson intervals, and the false-hit rate on
  questions whose fact is not stored, by score threshold and at a threshold
  fitted on a calibration split, reported on a disjoint one (`calibrated`).
  With a real model (`model_routers`), the hybrid arms too: BM25 units mixed
  with the model's embedding (the weight fitted on the calibration split),
  and that mix with its top `rerank` pages reranked by the model (`query_gain`).
- `candidate_recall`: how often the page holding a question's fact is among the first
  stage's (`UnitRouter`'s) top c pages, per c: the most a rerank of c candidates can reach.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import stats
from graftjax import store as store_lib
from graftjax.models.gemma import config as config_lib
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import pages
from graftjax.routing import route as route_lib
from graftjax.routing import units as units_lib
from graftjax.studies.paging import needle
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results


@dataclasses.dataclass(frozen=True)
class Template:
  """A fact kind: the fact's line, its question and a reworded question ({name}, {number})."""

  fact: str
  question: str
  reworded: str


TEMPLATES = (
  Template(
    'The access code of {name} is {number}.',
    'What is the access code of {name}?',
    'Which number lets {name} in?',
  ),
  Template(
    '{name} was born in the year {number}.',
    'In which year was {name} born?',
    'When did {name} come into the world?',
  ),
  Template(
    'The locker of {name} has number {number}.',
    'What number is the locker of {name}?',
    'Which locker belongs to {name}?',
  ),
  Template(
    '{name} paid {number} dollars for the car.',
    'How much did {name} pay for the car?',
    'What did the car cost {name}?',
  ),
)
SHORT_NOTES = (
  'Access codes are reset every month; the access code is printed on the card.',
  'Born in the year of the storm; the year is written in the book of the year.',
  'Each locker has a number. Locker numbers: see the locker list.',
  'The car was paid for in dollars. Pay for the car at the desk.',
  'What is the code? The code is the access code of the door.',
)

# A second needle set, written apart from the routers' development: its reworded questions
# share only the name with their fact, and its notes repeat the reworded questions' words.
UNSEEN_TEMPLATES = (
  Template(
    'The parking space of {name} is number {number}.',
    'What is the number of the parking space of {name}?',
    'Where does {name} leave the car at work?',
  ),
  Template(
    '{name} lives at house number {number}.',
    'At which house number does {name} live?',
    'What is the address of {name}?',
  ),
  Template(
    'The phone extension of {name} is {number}.',
    'What is the phone extension of {name}?',
    'How do I ring {name} at the office?',
  ),
  Template(
    '{name} scored {number} points in the final.',
    'How many points did {name} score in the final?',
    'How well did {name} do in the last game?',
  ),
)
UNSEEN_NOTES = (
  'Where to leave the car at work: the car park behind the office.',
  'What is the address of the office? The address is on the letter.',
  'How do I ring the office? Ring the desk at the office and wait.',
  'How well did the team do in the last game? The last game was close.',
  'Leave the car at the gate at work; do not leave it at the office.',
)
NEEDLE_SETS = {  # name: (templates, short notes) of `mixed_store`
  'four': (TEMPLATES, SHORT_NOTES),
  'unseen': (UNSEEN_TEMPLATES, UNSEEN_NOTES),
}


@dataclasses.dataclass(frozen=True)
class Question:
  """A question in both wordings; `key` the page holding its fact, None if it is not stored."""

  direct: str
  reworded: str
  key: str | None


def mixed_store(
  filler: Sequence[str],
  *,
  facts: int,
  absent: int,
  short_pages: int,
  seed: int,
  needle_set: str = 'four',
) -> tuple[list[tuple[str, str]], list[Question]]:
  """(key, text) of `facts` long pages and `short_pages` short ones; the questions.

  Long page i is `filler[i]` with the fact line of template i mod 4 of `needle_set` (one of
  `NEEDLE_SETS`) inserted at a random line; short pages are its notes, half of them
  followed by a first name of the facts' names. `absent` more questions ask of names that
  are not stored.
  """
  if needle_set not in NEEDLE_SETS:
    raise ValueError(f'needle_set must be one of {sorted(NEEDLE_SETS)}, got {needle_set!r}')
  templates, notes = NEEDLE_SETS[needle_set]
  if len(filler) < facts:
    raise ValueError(f'{len(filler)} filler texts for {facts} long pages')
  rng = random.Random(seed)
  named = needle.make_needles(facts + absent, seed)
  entries, questions = [], []
  for i, (name, number) in enumerate(named):
    template = templates[i % len(templates)]
    key = None
    if i < facts:
      key = f'long/{i}'
      lines = filler[i].splitlines()
      lines.insert(rng.randrange(len(lines) + 1), template.fact.format(name=name, number=number))
      entries.append((key, '\n'.join(lines)))
    questions.append(
      Question(template.question.format(name=name), template.reworded.format(name=name), key)
    )
  first_names = sorted({name.split()[0] for name, _ in named[:facts]})
  for j in range(short_pages):
    note = rng.choice(notes)
    entries.append((f'short/{j}', f'{note} {rng.choice(first_names)}.' if j % 2 else note))
  return entries, questions


WORDINGS = ('direct', 'reworded')
ROUTERS: dict[str, Callable[[], route_lib.Router]] = {
  'bm25': lambda: route_lib.BM25Router(threshold=0.0),
  'bm25_b0': lambda: route_lib.BM25Router(threshold=0.0, b=0.0),
  'bm25_units': lambda: units_lib.UnitRouter(threshold=0.0),
}


class _Routed(route_lib.Router):
  """A router whose top 4 for each query is routed once and kept (a rerank costs a forward
  pass per query); a call for k <= 4 takes the first k, as the router's own would."""

  kind = 'routed-once'

  def __init__(self, router: route_lib.Router):
    super().__init__(threshold=None)
    self.router, self._hits = router, {}

  def route_many(self, queries, k=1, *, threshold=None):
    if not 1 <= k <= 4:
      raise ValueError(f'k must be 1 to 4 here, got {k}')
    new = [q for q in dict.fromkeys(queries) if q not in self._hits]
    self._hits.update(zip(new, self.router.route_many(new, 4, threshold=-np.inf)))
    threshold = self.threshold if threshold is None else threshold
    return [[h for h in self._hits[q][:k] if h.score >= threshold] for q in queries]

  def _rank_many(self, queries):
    raise NotImplementedError('routes through the wrapped router')


def _queries(questions: Sequence[Question]) -> route_lib.Queries:
  stored = [q for q in questions if q.key is not None]
  return route_lib.Queries(
    deposited=[(q.direct, q.key) for q in stored],
    reworded=[(q.reworded, q.key) for q in stored],
    unrelated=[text for q in questions if q.key is None for text in (q.direct, q.reworded)],
  )


def routing_rows(
  entries: Sequence[tuple[str, str]],
  questions: Sequence[Question],
  *,
  router: route_lib.Router,
  thresholds: Sequence[float],
  max_false_hit: float = 0.05,
  seed: int = 0,
  added: bool = False,
  wordings: Sequence[str] = WORDINGS,
) -> dict[str, Any]:
  """Top-1 / top-4 over the stored questions and false hits over the absent, per wording of
  `wordings`; with both wordings, `calibrated`: the threshold fitted on half the questions
  (`route_lib.calibrate`: false hits among absent ones <= `max_false_hit`), reported on the
  other half. `added`: the router holds `entries` already."""
  if not wordings or not set(wordings) <= set(WORDINGS):
    raise ValueError(f'wordings must be some of {WORDINGS}, got {list(wordings)}')
  if not added:
    router.add_many(entries)
  router = _Routed(router)
  stored = [q for q in questions if q.key is not None]
  missing = [q for q in questions if q.key is None]
  out: dict[str, Any] = {}
  for wording in wordings:
    hits = router.route_many([getattr(q, wording) for q in stored], 4, threshold=-np.inf)
    top1 = sum(bool(h) and h[0].key == q.key for q, h in zip(stored, hits))
    top4 = sum(q.key in [x.key for x in h] for q, h in zip(stored, hits))
    short1 = sum(bool(h) and h[0].key.startswith('short/') for h in hits)
    best = [h[0].score if h else 0.0 for h in hits]
    right_best = [h[0].score if h and h[0].key == q.key else None for q, h in zip(stored, hits)]
    absent = router.route_many([getattr(q, wording) for q in missing], 1, threshold=-np.inf)
    absent_best = [h[0].score if h else 0.0 for h in absent]
    out[wording] = {
      'questions': len(stored),
      'top1': stats.rate(top1, len(stored)).to_json(),
      'top4': stats.rate(top4, len(stored)).to_json(),
      'top1_short_page': short1,
      'median_best_score': float(np.median(best)),
      'by_threshold': [
        {
          'threshold': t,
          'top1_at_threshold': stats.rate(
            sum(s is not None and s >= t for s in right_best), len(stored)
          ).to_json(),
          'false_hits': stats.rate(sum(s >= t for s in absent_best), len(missing)).to_json(),
        }
        for t in thresholds
      ],
    }
  if set(wordings) == set(WORDINGS):
    out['calibrated'] = route_lib.calibrate(
      router, _queries(questions), seed=seed, max_false_hit=max_false_hit
    ).to_json()
  return out


def candidate_recall(
  entries: Sequence[tuple[str, str]],
  questions: Sequence[Question],
  *,
  router: units_lib.UnitRouter,
  sizes: Sequence[int],
  rare: int = 4,
) -> dict[str, Any]:
  """Per wording and candidate count c of `sizes`: the stored questions whose page is among
  `router`'s top c (Wilson 95%), the recall a rerank of c candidates is bounded by; under
  `<wording>_plus_rare`, among those and the top `rare` pages by the question's rare words
  (`UnitRouter.rare_words`: `HybridRouter(rerank=c, rerank_rare=rare)`'s candidates)."""
  if not sizes or min(sizes) < 1:
    raise ValueError(f'candidate counts must be integers >= 1, got {list(sizes)}')
  router.add_many(entries)
  stored = [q for q in questions if q.key is not None]
  top = lambda texts, k: [
    [h.key for h in found] for found in router.route_many(texts, k, threshold=-np.inf)
  ]
  rate = lambda found: stats.rate(sum(found), len(stored)).to_json()
  out: dict[str, Any] = {'rare': rare}
  for wording in WORDINGS:
    texts = [getattr(q, wording) for q in stored]
    keys = top(texts, max(sizes))
    names = [' '.join(router.rare_words(t)) for t in texts]
    by_rare = (
      [k if n else [] for k, n in zip(top(names, rare), names)] if rare else [[]] * len(names)
    )
    out[wording] = {str(c): rate(q.key in k[:c] for q, k in zip(stored, keys)) for c in sizes}
    out[f'{wording}_plus_rare'] = {
      str(c): rate(q.key in k[:c] or q.key in r for q, k, r in zip(stored, keys, by_rare))
      for c in sizes
    }
  return out


@dataclasses.dataclass(frozen=True)
class Rerank:
  """The rerank arm: the `pages` best pages and up to `rare` more by the question's rare words
  (`HybridRouter`'s `rerank`, `rerank_rare`), query tokens weighted by `weighting`
  (`rerank_weighting`), over the questions of `wordings`."""

  pages: int = 4
  rare: int = 0
  weighting: str = 'idf'
  wordings: Sequence[str] = WORDINGS


def model_routers(
  entries: Sequence[tuple[str, str]],
  questions: Sequence[Question],
  *,
  model,
  weights: Sequence[float],
  rerank: Rerank,
  thresholds: Sequence[float],
  seed: int,
  encode: route_lib.Encode | None = None,
) -> dict[str, Any]:
  """The hybrid arms: `routing_rows` of `HybridRouter` at the weight of `weights` with the most
  top-1 hits (direct and reworded) on the calibration half of the stored questions (ties to
  the larger weight), without and with the `rerank` arm."""
  calibration, _, _ = route_lib.split(_queries(questions), seed=seed)
  fit_on = [*calibration.deposited, *calibration.reworded]
  router = units_lib.HybridRouter(model, threshold=None, encode=encode)
  router.add_many(entries)
  fits = []
  for weight in sorted(weights, reverse=True):
    router.weight = weight
    hits = router.route_many([q for q, _ in fit_on], 1, threshold=-np.inf)
    fits.append(
      {'weight': weight, 'top1': sum(bool(h) and h[0].key == k for h, (_, k) in zip(hits, fit_on))}
    )
  router.weight = max(fits, key=lambda f: f['top1'])['weight']
  rows = lambda: routing_rows(
    entries, questions, router=router, thresholds=thresholds, seed=seed, added=True
  )
  out = {'hybrid_mix': {**rows(), 'weight': router.weight, 'weight_fit': fits}}
  router.rerank, router.rerank_rare = rerank.pages, rerank.rare
  router.rerank_weighting = rerank.weighting
  t0 = time.perf_counter()
  out['hybrid_rerank'] = {
    **routing_rows(
      entries,
      questions,
      router=router,
      thresholds=thresholds,
      seed=seed,
      added=True,
      wordings=rerank.wordings,
    ),
    'weight': router.weight,
    'rerank': rerank.pages,
    'rerank_rare': rerank.rare,
    'rerank_weighting': rerank.weighting,
  }
  routed = len({getattr(q, w) for w in rerank.wordings for q in questions})
  out['hybrid_rerank']['rerank_seconds_per_query'] = (time.perf_counter() - t0) / routed
  return out


def _document(tokenizer, filler: Sequence[str], facts: Sequence[str], *, body: int, seed: int):
  """(token ids, [(begin, end)] of each fact): text with fact i across plain boundary i + 1."""
  ids: list[int] = []
  for text in filler:
    ids += tokenizer.encode(text, add_bos=False)
    if len(ids) >= (len(facts) + 2) * body:
      break
  rng = random.Random(seed)
  out, places = list(ids[: (len(facts) + 2) * body]), []
  for i, fact in enumerate(facts):
    fact_ids = tokenizer.encode(f' {fact} ', add_bos=False)
    at = (i + 1) * body - rng.randrange(1, len(fact_ids))  # cut by the boundary at (i + 1) * body
    out[at : at + len(fact_ids)] = fact_ids
    places.append((at, at + len(fact_ids)))
  return out, places


def overlap_rows(
  model,
  filler: Sequence[str],
  *,
  page_tokens: int,
  overlaps: Sequence[int],
  facts: int,
  chunk_size: int,
  seed: int,
) -> list[dict[str, Any]]:
  """Per overlap: pages, stored tokens and bytes per document token, boundary facts whole in
  the routed page, access time (route + read + verify + install, median)."""
  tokenizer = model.tokenizer
  named = needle.make_needles(facts, seed)
  lines = [
    TEMPLATES[i % len(TEMPLATES)].fact.format(name=n, number=x) for i, (n, x) in enumerate(named)
  ]
  asks = [TEMPLATES[i % len(TEMPLATES)].question.format(name=n) for i, (n, _) in enumerate(named)]
  doc, places = _document(tokenizer, filler, lines, body=page_tokens - 1, seed=seed)
  capacity = paging_scale.prefill_capacity(page_tokens)
  bos = getattr(tokenizer, 'bos_id', 2)
  rows = []
  for overlap in overlaps:
    ids, cuts = pages.cut(doc, page_tokens, overlap=overlap, bos=bos)
    with tempfile.TemporaryDirectory() as tmp:
      store = store_lib.BlockStore(os.path.join(tmp, 'store'))
      with catalog_lib.Catalog.beside(store) as catalog:
        keys, nbytes = [], 0
        for p, row in enumerate(ids):
          (page,) = paging_scale.make_pages(
            model, row[None], capacity=capacity, chunk_size=chunk_size, local_rows=None
          )
          nbytes += page.nbytes()
          keys.append(pages.put(store, page))
          catalog.add(
            keys[-1],
            paging_scale.decode(tokenizer, row[1:]),
            source=f'page {p}',
            n_tokens=page_tokens,
            model_fingerprint=model.fingerprint,
            dtype=jnp.dtype(model.dtype).name,
            page_layout=page.layout,
          )
        window = model.init_cache(capacity=capacity)
        catalog.route('warm up', k=1)
        whole, access = 0, []
        for ask, (begin, end) in zip(asks, places):
          window = paging_scale.empty_window(window)
          t0 = time.perf_counter()
          (hit, _), *_ = catalog.route(ask, k=1)
          got = pages.get(store, hit.key)
          window = jax.block_until_ready(
            pages.install(
              window,
              got,
              target=model.graft_target,
              config=model.config,
              chunk_size=chunk_size,
              donate=True,
            )
          )
          access.append(time.perf_counter() - t0)
          first, last = cuts[keys.index(hit.key)]
          whole += first <= begin and end <= last
    rows.append(
      {
        'overlap': overlap,
        'stride': page_tokens - 1 - overlap,
        'pages': len(ids),
        'document_tokens': len(doc),
        'stored_tokens_per_document_token': len(ids) * (page_tokens - 1) / len(doc),
        'stored_bytes_per_document_token': nbytes / len(doc),
        'boundary_facts': len(places),
        'boundary_facts_whole_in_routed_page': stats.rate(whole, len(places)).to_json(),
        'access_median_s': float(np.median(access)),
        'access_p90_s': float(np.percentile(access, 90)),
      }
    )
  return rows


def real_model_bytes(page_tokens: int, overlaps: Sequence[int]) -> list[dict[str, Any]]:
  """gemma-3-270m in bfloat16, from its config: page bytes per document token, by overlap."""
  config = config_lib.gemma3_270m()
  body = page_tokens - 1
  per_token = pages.bytes_per_token(config, 'bfloat16', page_tokens)['page']
  return [
    {
      'overlap': o,
      'page_bytes_per_page_token': per_token,
      'page_bytes_per_document_token': per_token * page_tokens * body / (body - o) / body,
    }
    for o in overlaps
  ]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `experiment` runs (experiments/bench_paging_recall.py builds it from its flags): its
  arguments, as its docstring describes them."""

  model_name: str
  page_tokens: int
  overlaps: Sequence[int]
  boundary_facts: int
  facts: int
  absent: int
  short_pages: int
  thresholds: Sequence[float]
  chunk_size: int
  seed: int
  filler: Sequence[str]
  router_model: str | None = None
  weights: Sequence[float] = (1.0, 0.95, 0.9, 0.8, 0.5)
  rerank: int = 4
  rerank_rare: int = 0
  rerank_wordings: Sequence[str] = WORDINGS
  rerank_weighting: str = 'idf'
  recall_at: Sequence[int] = (1, 4, 16, 64)
  needle_set: str = 'four'


def check(settings: Settings) -> None:
  """Refuses settings `experiment` cannot measure, before any work (each a `ValueError`
  naming the setting): a count that leaves a rate with no trials, an overlap that is not a
  part of a page, an unknown needle set, wording or weighting, a weight outside [0, 1]."""
  counts = {'facts': 2, 'absent': 2, 'boundary_facts': 1, 'page_tokens': 1, 'short_pages': 0}
  for name, least in counts.items():
    if getattr(settings, name) < least:
      raise ValueError(f'{name} must be at least {least}, got {getattr(settings, name)}')
  if not settings.overlaps or not all(0 <= o < settings.page_tokens for o in settings.overlaps):
    raise ValueError(f'overlaps must lie in [0, page_tokens), got {list(settings.overlaps)}')
  if not settings.thresholds:
    raise ValueError('thresholds: give at least one')
  if settings.needle_set not in NEEDLE_SETS:
    raise ValueError(
      f'needle_set must be one of {sorted(NEEDLE_SETS)}, got {settings.needle_set!r}'
    )
  if not settings.rerank_wordings or not set(settings.rerank_wordings) <= set(WORDINGS):
    raise ValueError(
      f'rerank_wordings must be some of {WORDINGS}, got {list(settings.rerank_wordings)}'
    )
  if settings.rerank_weighting not in units_lib.RERANK_WEIGHTINGS:
    raise ValueError(
      f'rerank_weighting must be one of {units_lib.RERANK_WEIGHTINGS},'
      f' got {settings.rerank_weighting!r}'
    )
  if not settings.recall_at or min(settings.recall_at) < 1:
    raise ValueError(f'recall_at must be integers >= 1, got {list(settings.recall_at)}')
  if settings.rerank < 0 or settings.rerank_rare < 0:
    raise ValueError(
      f'rerank and rerank_rare must be >= 0, got {settings.rerank}, {settings.rerank_rare}'
    )
  if not settings.weights or not all(0.0 <= w <= 1.0 for w in settings.weights):
    raise ValueError(f'weights must lie in [0, 1], got {list(settings.weights)}')


def experiment(
  settings: Settings,
  *,
  command: str | None = None,
) -> dict[str, Any]:
  """Both measurements; the result. `router_model` (a `paging_scale.load_model` name) adds
  the hybrid arms (`model_routers`; the `rerank` fields make its `Rerank`) run with that
  model; `recall_at` the candidate counts of `candidate_recall` (of `UnitRouter`, the hybrid
  arms' first stage); `needle_set` the routing store's templates and notes (`NEEDLE_SETS`).
  The settings are checked first (`check`)."""
  check(settings)
  model = paging_scale.load_model(settings.model_name)
  entries, questions = mixed_store(
    settings.filler,
    facts=settings.facts,
    absent=settings.absent,
    short_pages=settings.short_pages,
    seed=settings.seed,
    needle_set=settings.needle_set,
  )
  routed = {
    name: routing_rows(
      entries, questions, router=make(), thresholds=settings.thresholds, seed=settings.seed
    )
    for name, make in ROUTERS.items()
  }
  recall = candidate_recall(
    entries,
    questions,
    router=ROUTERS['bm25_units'](),
    sizes=sorted(set(settings.recall_at)),
    rare=settings.rerank_rare or 4,
  )
  inputs = {'model_fingerprint': model.fingerprint}
  if settings.router_model is not None:
    ranker = paging_scale.load_model(settings.router_model)
    t0 = time.perf_counter()
    routed.update(
      model_routers(
        entries,
        questions,
        model=ranker,
        weights=settings.weights,
        rerank=Rerank(
          pages=settings.rerank,
          rare=settings.rerank_rare,
          weighting=settings.rerank_weighting,
          wordings=settings.rerank_wordings,
        ),
        thresholds=settings.thresholds,
        seed=settings.seed,
      )
    )
    routed['hybrid_rerank']['seconds_all_arms'] = time.perf_counter() - t0
    inputs.update(
      {f'router_{k}': v for k, v in results.model_inputs(ranker, settings.router_model).items()}
    )
  overlap = overlap_rows(
    model,
    settings.filler[settings.facts :],
    page_tokens=settings.page_tokens,
    overlaps=settings.overlaps,
    facts=settings.boundary_facts,
    chunk_size=settings.chunk_size,
    seed=settings.seed,
  )
  inputs['sha256_filler'] = hashlib.sha256('\0'.join(settings.filler).encode()).hexdigest()
  return {
    **results.header('bench_paging_recall', inputs=inputs, command=command),
    'model': settings.model_name,
    'router_model': settings.router_model,
    'page_tokens': settings.page_tokens,
    'summary': _summary(overlap, routed),
    'timing': 'median of per-query wall times on a CPU shared with other work',
    'overlap': overlap,
    'gemma3_270m_bfloat16_bytes': real_model_bytes(settings.page_tokens, settings.overlaps),
    'routing': {
      'long_pages': settings.facts,
      'short_pages': settings.short_pages,
      'absent_questions': settings.absent,
      'needle_set': settings.needle_set,
      'templates': [dataclasses.asdict(t) for t in NEEDLE_SETS[settings.needle_set][0]],
      'short_notes': list(NEEDLE_SETS[settings.needle_set][1]),
      'routers': routed,
      'candidate_recall': {'router': 'bm25_units', **recall},
    },
  }


def _summary(overlap: list[dict[str, Any]], routed: dict[str, Any]) -> dict[str, Any]:
  """Headline scalars: per overlap, tokens stored and boundary facts kept; per router, top-k."""
  out: dict[str, Any] = {}
  for r in overlap:
    out[f'overlap_{r["overlap"]}'] = {
      'stored_tokens_per_document_token': r['stored_tokens_per_document_token'],
      'boundary_facts_whole_in_routed_page': r['boundary_facts_whole_in_routed_page']['rate'],
      'access_median_s': r['access_median_s'],
    }
  for name, r in routed.items():
    for wording in (w for w in WORDINGS if w in r):
      out[f'{name}_{wording}'] = {
        'top1': r[wording]['top1']['rate'],
        'top4': r[wording]['top4']['rate'],
      }
    if 'calibrated' not in r:
      continue
    report = r['calibrated']['report']
    out[f'{name}_calibrated'] = {
      'threshold': r['calibrated']['threshold'],
      **{k: report[k]['rate'] for k in ('deposited', 'reworded', 'false_hit')},
    }
  return out


def format_rows(result: dict[str, Any]) -> str:
  """One line per overlap, then one per router and wording."""
  pct = lambda r: f'{100 * r["rate"]:.0f}% [{100 * r["low"]:.0f}, {100 * r["high"]:.0f}]'
  lines = [
    f'overlap {r["overlap"]:>4}: {r["pages"]} pages, x{r["stored_tokens_per_document_token"]:.2f}'
    f' tokens stored, {r["stored_bytes_per_document_token"]:.0f} B/token;'
    f' boundary facts whole in the routed page {pct(r["boundary_facts_whole_in_routed_page"])};'
    f' access {r["access_median_s"] * 1e3:.1f} ms'
    for r in result['overlap']
  ]
  recall = result['routing'].get('candidate_recall')  # absent from results before it
  for wording in WORDINGS if recall else ():
    lines.append(
      f'{"candidates":>13} {wording:>8}: '
      + ', '.join(f'page in top-{c} {pct(r)}' for c, r in recall[wording].items())
    )
    if f'{wording}_plus_rare' in recall:
      lines.append(
        f'{"+ rare words":>13} {wording:>8}: '
        + ', '.join(
          f'top-{c} + {recall["rare"]} {pct(r)}' for c, r in recall[f'{wording}_plus_rare'].items()
        )
      )
  for name, by_wording in result['routing']['routers'].items():
    for wording in (w for w in WORDINGS if w in by_wording):
      r = by_wording[wording]
      lines.append(
        f'{name:>13} {wording:>8}: top-1 {pct(r["top1"])}, top-4 {pct(r["top4"])},'
        f' short page first {r["top1_short_page"]}/{r["questions"]}'
      )
    if 'calibrated' not in by_wording:
      continue
    fit = by_wording['calibrated']
    lines.append(
      f'{name:>13} threshold {float(fit["threshold"]):.3g} fitted on half, on the other: direct top-1'
      f' {pct(fit["report"]["deposited"])}, reworded top-1 {pct(fit["report"]["reworded"])},'
      f' false hits {pct(fit["report"]["false_hit"])}'
    )
  return '\n'.join(lines)
