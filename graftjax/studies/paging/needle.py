"""Needles in a paged store: routed page-in against the base model over a window.

Details and the exactness argument: docs/paging.md, section `graftjax/studies/paging/needle.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import random
import re
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import compose
from graftjax import ledger
from graftjax import stats
from graftjax import store as store_lib
from graftjax.errors import GraftjaxError
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import context as context_lib
from graftjax.paging import pages
from graftjax.routing import route as route_lib
from graftjax.routing import units as units_lib
from graftjax.studies.common import corpus
from graftjax.studies.paging import paging_scale
from graftjax.studies.common import results

NEEDLE_SOURCE = 'needle page'  # catalog source of needle page p: f'{NEEDLE_SOURCE} {p}'
FIRST_NAMES = (
  'Amelia', 'Bartholomew', 'Cressida', 'Dorian', 'Evangeline', 'Fitzgerald', 'Griselda',
  'Horatio', 'Isadora', 'Jasper', 'Katarina', 'Leopold', 'Marisol', 'Nikolai', 'Ophelia',
  'Percival', 'Quintessa', 'Rosalind', 'Sebastian', 'Theodora', 'Ulysses', 'Valentina',
  'Wilhelmina', 'Xavier', 'Yolanda', 'Zebulon',
)  # fmt: skip
LAST_NAMES = (
  'Abernathy', 'Blackwood', 'Castellanos', 'Delacroix', 'Ellingsworth', 'Fairweather',
  'Gallagher', 'Hargreaves', 'Ingersoll', 'Jablonski', 'Kowalczyk', 'Lindqvist', 'Montgomery',
  'Nakamura', 'Oyelaran', 'Pemberton', 'Quarshie', 'Rasmussen', 'Szymanski', 'Thistlewood',
  'Underhill', 'Vasquez', 'Whitcombe', 'Yamamoto', 'Zielinski',
)  # fmt: skip


class NeedleError(GraftjaxError, ValueError):
  """A needle study cannot run as asked: a template, haystack or placement is unusable."""


@dataclasses.dataclass(frozen=True)
class Template:
  """A fact kind: its line, its question and the answer's opening ({name}, {number} in each)."""

  fact: str
  question: str
  answer: str

  def check(self) -> None:
    """Raises NeedleError unless every field names {name} and the fact names {number}."""
    for field in ('fact', 'question', 'answer'):
      text = getattr(self, field)
      if not isinstance(text, str) or '{name}' not in text:
        raise NeedleError(f'template {field} {text!r} does not name {{name}}')
      try:
        text.format(name='x', number=0)
      except (KeyError, IndexError, ValueError) as e:
        raise NeedleError(f'template {field} {text!r}: only {{name}} and {{number}} ({e})') from e
    if '{number}' not in self.fact:
      raise NeedleError(f'template fact {self.fact!r} does not name {{number}}')


ACCESS_CODE = Template(
  fact='The access code of {name} is {number}.',
  question='What is the access code of {name}?',
  answer='The access code of {name} is',
)
TEMPLATE_SETS = {  # named sets `--templates` takes besides a JSON file
  'access_code': (ACCESS_CODE,),
  'four': (
    ACCESS_CODE,
    Template(
      fact='{name} was born in the year {number}.',
      question='In which year was {name} born?',
      answer='{name} was born in the year',
    ),
    Template(
      fact='The locker of {name} has number {number}.',
      question='What number does the locker of {name} have?',
      answer='The locker of {name} has number',
    ),
    Template(
      fact='{name} paid {number} dollars for the car.',
      question='How many dollars did {name} pay for the car?',
      answer='{name} paid',
    ),
  ),
}
PLACEMENTS = ('inside', 'boundary', 'mixed')
ROUTERS = {  # BM25 over whole pages, or over fixed-size routing units (`units_lib.units`)
  'bm25': lambda: route_lib.BM25Router(threshold=0.0),
  'units': lambda: units_lib.UnitRouter(threshold=0.0),
}


def load_templates(path: str | os.PathLike) -> tuple[Template, ...]:
  """A named set of `TEMPLATE_SETS`, or templates from a JSON file: a list of
  {"fact": ..., "question": ..., "answer": ...}.

  Raises:
    NeedleError: the file is unreadable, not such a list, or a template is unusable.
  """
  if str(path) in TEMPLATE_SETS:
    return TEMPLATE_SETS[str(path)]
  try:
    rows = json.loads(pathlib.Path(path).read_text(encoding='utf-8'))
  except OSError as e:
    raise NeedleError(f'{path}: cannot read the templates: {e.strerror or e}') from e
  except (ValueError, RecursionError) as e:
    raise NeedleError(f'{path}: not JSON ({e})') from e
  fields = {'fact', 'question', 'answer'}
  if (
    not isinstance(rows, list)
    or not rows
    or not all(isinstance(r, dict) and set(r) == fields for r in rows)
  ):
    raise NeedleError(
      f'{path}: templates must be a non-empty list of objects with {sorted(fields)}'
    )
  templates = tuple(Template(**r) for r in rows)
  for template in templates:
    template.check()
  return templates


@dataclasses.dataclass(frozen=True)
class Needle:
  name: str
  number: int
  page: int  # the first page holding it whole, else the page it starts in
  offset: int  # token offset of its line in that page (BOS at 0)
  template: Template = ACCESS_CODE
  window: int = 0
  span: tuple[int, int] = (0, 0)  # [begin, end) of its tokens in its window's text
  at_boundary: bool = False  # cut by a boundary of the plain (non-overlapping) pages

  @property
  def fact(self) -> str:
    return self.template.fact.format(name=self.name, number=self.number)

  @property
  def question(self) -> str:
    return self.template.question.format(name=self.name)

  @property
  def prompt(self) -> str:
    return f'\nQuestion: {self.question}\nAnswer: {self.template.answer.format(name=self.name)}'


def make_needles(count: int, seed: int) -> list[tuple[str, int]]:
  """`count` distinct (name, 4-digit number) pairs."""
  rng = random.Random(seed)
  names = [f'{a} {b}' for a in FIRST_NAMES for b in LAST_NAMES]
  if count > len(names):
    raise ValueError(f'at most {len(names)} needles, asked for {count}')
  return list(zip(rng.sample(names, count), rng.sample(range(1000, 10000), count)))


def haystack_ids(tokenizer, paths, tokens: int) -> list[int]:
  """At least `tokens` token ids of the files at `paths` in order (no BOS).

  Raises:
    NeedleError: a file cannot be read, or the files hold fewer tokens.
  """
  ids: list[int] = []
  for path in paths:
    try:
      text = pathlib.Path(path).read_text(encoding='utf-8', errors='replace')
    except OSError as e:
      raise NeedleError(f'haystack {path}: cannot read it: {e.strerror or e}') from e
    ids += tokenizer.encode(text, add_bos=False)
    if len(ids) >= tokens:
      return ids
  raise NeedleError(f'the haystack holds {len(ids):,} tokens; the windows need {tokens:,}')


def plant(
  tokenizer,
  *,
  needles: int,
  page_tokens: int,
  pages_per_window: int,
  margin: int,
  seed,
  templates=(ACCESS_CODE,),
  placement: str = 'inside',
  overlap: int = 0,
  haystack=None,
):
  """(page token ids [P, page_tokens], needles, windows' text ids, page spans).

  Windows of `pages_per_window * (page_tokens - 1)` tokens of the haystack (default: the
  standard-library sources), fact i of template `templates[i % len]` in plain page i: at a
  line break `margin` tokens or more inside it ('inside'), or written over its boundary
  with the next page of its window ('boundary'; the window's last page keeps its fact
  inside); 'mixed' does so for even i only. Each window is cut into pages (`pages.cut`, `overlap`);
  page spans are (window, begin, end) in the window's text.
  """
  if placement not in PLACEMENTS:
    raise NeedleError(f'placement must be one of {PLACEMENTS}, got {placement!r}')
  for template in templates:
    template.check()
  body = page_tokens - 1
  windows = -(-needles // pages_per_window)
  text_ids = haystack_ids(
    tokenizer,
    corpus.stdlib_files() if haystack is None else haystack,
    windows * pages_per_window * body,
  )
  newline = {i for i in set(text_ids) if '\n' in paging_scale.decode(tokenizer, [i])}
  rng, edges = random.Random(seed), random.Random(seed + 1)
  facts = make_needles(needles, seed)
  page_ids, planted, docs, spans = [], [], [], []
  for w in range(windows):
    doc: list[int] = []
    places = []
    for j in range(pages_per_window):
      p = w * pages_per_window + j
      ids = text_ids[p * body : (p + 1) * body]
      if p < needles:
        name, number = facts[p]
        template = templates[p % len(templates)]
        fact_ids = tokenizer.encode(
          template.fact.format(name=name, number=number) + '\n', add_bos=False
        )
        cross = placement == 'boundary' or (placement == 'mixed' and p % 2 == 0)
        if cross and j + 1 < pages_per_window:  # at most `margin` tokens into the next page
          lo = max(1, len(fact_ids) - margin)
          before = edges.randrange(lo, max(lo + 1, len(fact_ids) - 1))
          places.append((p, len(doc) + body - before, fact_ids))
        else:
          lo, hi = margin, body - margin - len(fact_ids)
          breaks = [i + 1 for i in range(lo - 1, hi - 1) if ids[i] in newline] or [lo]
          at = rng.choice(breaks)
          ids = (ids[:at] + fact_ids + ids[at:])[:body]
          places.append((p, len(doc) + at, fact_ids))
      doc += ids
    for p, at, fact_ids in places:
      doc[at : at + len(fact_ids)] = fact_ids  # a crossing fact is written over the boundary
    rows, cuts = pages.cut(doc, page_tokens, overlap=overlap, bos=_bos(tokenizer))
    first = len(page_ids)
    page_ids += list(rows)
    spans += [(w, begin, end) for begin, end in cuts]
    docs.append(doc)
    for p, at, fact_ids in places:
      end = at + len(fact_ids) - 1  # the newline after the fact is not needed whole
      whole = [i for i, (b, e) in enumerate(cuts) if b <= at and end <= e]
      page = first + (
        whole[0] if whole else next(i for i, (b, e) in enumerate(cuts) if b <= at < e)
      )
      name, number = facts[p]
      planted.append(
        Needle(
          name,
          number,
          page,
          at - spans[page][1] + 1,
          templates[p % len(templates)],
          w,
          (at, end),
          at // body != (end - 1) // body,
        )
      )
  return np.asarray(page_ids, np.int32), planted, docs, spans


def greedy(model, cache, prompt_ids, *, position: int, answer_tokens: int, chunk: int):
  """(answer token ids, first logits, cache): `prompt_ids` at `position`, then greedy decode."""
  logits, cache = model.prefill(
    prompt_ids, cache=cache, chunk_size=chunk, start_position=position, logits='last'
  )
  first = np.asarray(logits[0])
  position += len(prompt_ids)
  out = []
  for step in range(answer_tokens):
    token = int(np.argmax(np.asarray(logits[0])))
    out.append(token)
    if step + 1 < answer_tokens:
      logits, cache = model.forward(
        np.asarray([[token]]), np.asarray([[position]]), cache, logits='last'
      )
      position += 1
  return out, first, cache


def _bos(tokenizer) -> int:
  return getattr(tokenizer, 'bos_id', 2)


def first_number(text: str) -> int | None:
  match = re.search(r'\d+', text)
  return None if match is None else int(match.group())


def _sha(array) -> str:
  return hashlib.sha256(np.asarray(array).tobytes()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `experiment` runs: the model, the needles and their pages, the arms (experiments/needle.py
  builds it from its flags; the fields are `experiment`'s arguments)."""

  model_name: str
  dtype: str
  needles: int
  page_tokens: int
  pages_per_window: int
  answer_tokens: int
  chunk_size: int
  question_chunk: int
  impl: str = 'xla'
  store_dir: str | os.PathLike | None = None
  margin: int = 32
  seed: int = 0
  templates: Sequence[Template] = (ACCESS_CODE,)
  placement: str = 'inside'
  overlap: int = 0
  haystack: Sequence[str] | None = None  # text files
  router: str = 'bm25'
  top_k: int = 0
  topk_threshold: float | None = None
  position_scheme: str = 'rope'


def experiment(
  settings: Settings,
  *,
  progress: bool = True,
  command: str | None = None,
) -> dict[str, Any]:
  """Both arms on every needle (and with `top_k` > 0 the top-k arm); the result.

  `store_dir`, `templates`, `top_k` and the other settings are fields of `settings`.
  With `store_dir` (a store grown by `paging_scale`, same model), the needle
  pages join that store and its catalog, and every question is routed over
  all of it; otherwise over the needle pages alone, in a temporary store.
  `templates`, `placement`, `overlap` and `haystack` (text files) as `plant`; `router`
  one of `ROUTERS`. `impl` 'xla_split' is XLA with the split-invariant attention
  (kernels/attention_xla_split.py). With `top_k` > 0 each question is also answered from its
  top-k routed pages composed side by side (`PagedContext`: each page in its own segment, the
  best next to the question), which needs `position_scheme` 'rope_relative' and split-invariant
  attention ('pallas' or 'xla_split'); every page is then computed at the context's capacity.
  `topk_threshold`: compose only the top-k pages scoring at least it (the best page always);
  None composes all k.
  """
  if settings.router not in ROUTERS:
    raise NeedleError(f'router must be one of {sorted(ROUTERS)}, got {settings.router!r}')
  model = _load(
    settings.model_name,
    dtype=settings.dtype,
    impl=settings.impl,
    position_scheme=settings.position_scheme,
  )
  if settings.top_k:
    try:
      split = compose.check_model(model)
    except compose.ComposeError as e:
      raise NeedleError(
        f'the top-{settings.top_k} arm cannot compose pages on this model: {e}'
      ) from e
  tokenizer = model.tokenizer
  page_ids, planted, docs, spans = plant(
    tokenizer,
    needles=settings.needles,
    page_tokens=settings.page_tokens,
    pages_per_window=settings.pages_per_window,
    margin=settings.margin,
    seed=settings.seed,
    templates=settings.templates,
    placement=settings.placement,
    overlap=settings.overlap,
    haystack=settings.haystack,
  )
  window_tokens = 1 + settings.pages_per_window * (settings.page_tokens - 1)
  prompts = [tokenizer.encode(n.prompt, add_bos=False) for n in planted]
  longest = max(len(p) for p in prompts) + settings.answer_tokens
  capacity = -(-(window_tokens + longest) // 64) * 64
  if (
    settings.top_k
  ):  # one capacity for every arm, whole pages of the context (pages are computed in it)
    context_slots = settings.top_k * -(-settings.page_tokens // split) * split + longest
    capacity = -(-max(capacity, context_slots) // split) * split
  config, target = model.config, model.graft_target
  kinds = list(dict.fromkeys(settings.templates))
  rows = [
    {
      'name': n.name,
      'number': n.number,
      'template': kinds.index(n.template),
      'window': n.window,
      'page': n.page,
      'offset': n.offset,
      'at_boundary': n.at_boundary,
      'same_template_neighbours': sum(
        m.window == n.window and m.template == n.template and m is not n for m in planted
      ),
    }
    for n in planted
  ]
  number_of = {n.number: n.name for n in planted}
  t_start = time.perf_counter()

  with contextlib.ExitStack() as stack:
    root = settings.store_dir or stack.enter_context(tempfile.TemporaryDirectory())
    store = store_lib.BlockStore(
      os.path.join(root, 'store') if settings.store_dir is None else root
    )
    catalog = stack.enter_context(
      catalog_lib.Catalog.beside(store, router=ROUTERS[settings.router]())
    )
    t0 = time.perf_counter()
    for p in tqdm.tqdm(range(len(page_ids)), desc='pages', disable=not progress):
      (page,) = paging_scale.make_pages(
        model, page_ids[p][None], capacity=capacity, chunk_size=settings.chunk_size, local_rows=None
      )
      key = pages.put(store, page)
      catalog.add(
        key,
        paging_scale.decode(tokenizer, page_ids[p][1:]),
        source=f'{NEEDLE_SOURCE} {p}',
        n_tokens=settings.page_tokens,
        model_fingerprint=model.fingerprint,
        dtype=jnp.dtype(model.dtype).name,
        page_layout=page.layout,
      )
    build_s = time.perf_counter() - t0
    page_of = {k: _needle_page(catalog.get(k).source) for k in catalog.keys()}
    routed_over = [catalog.get(k) for k in catalog.keys()]
    store_bytes = paging_scale.disk_bytes(store.root)['bytes']
    window = model.init_cache(capacity=capacity)
    catalog.router.route('warm up the index', k=1)
    for i, (needle, prompt, row) in enumerate(
      tqdm.tqdm(list(zip(planted, prompts, rows)), desc='paged', disable=not progress)
    ):
      window = paging_scale.empty_window(window)
      t0 = time.perf_counter()
      hits = catalog.route(needle.question, k=1)
      t1 = time.perf_counter()
      got = pages.get(store, hits[0][0].key)
      t2 = time.perf_counter()
      window = jax.block_until_ready(
        pages.install(
          window, got, target=target, config=config, chunk_size=settings.chunk_size, donate=True
        )
      )
      t3 = time.perf_counter()
      answer, first, window = greedy(
        model,
        window,
        prompt,
        position=settings.page_tokens,
        answer_tokens=settings.answer_tokens,
        chunk=settings.question_chunk,
      )
      t4 = time.perf_counter()
      text = paging_scale.decode(tokenizer, answer)
      routed_page = page_of[hits[0][0].key]
      row.update(
        routed_page=hits[0][0].source,
        routed_right=routed_page is not None and _holds(spans[routed_page], needle),
        paged_answer=text,
        paged_right=first_number(text) == needle.number,
        paged_confused_with=_confused(first_number(text), needle, number_of),
        route_s=t1 - t0,
        read_verify_s=t2 - t1,
        install_s=t3 - t2,
        access_s=t3 - t0,
        paged_answer_s=t4 - t3,
      )
      if i == 0 and routed_page is not None:  # the paged context against a fresh prefill
        _, fresh = model.prefill(
          page_ids[routed_page],
          cache=model.init_cache(capacity=capacity),
          chunk_size=settings.chunk_size,
          logits='none',
        )
        _, fresh_first, _ = greedy(
          model,
          fresh,
          prompt,
          position=settings.page_tokens,
          answer_tokens=1,
          chunk=settings.question_chunk,
        )
        row['paged_first_logits_equal_fresh_prefill'] = _sha(first) == _sha(fresh_first)
    if settings.top_k:
      context = context_lib.PagedContext(model, store, catalog, capacity=capacity)
      _top_k_arm(
        model, context, planted, prompts, rows, spans, page_of, number_of, k=settings.top_k,
        answer_tokens=settings.answer_tokens, chunk_size=settings.chunk_size,
        question_chunk=settings.question_chunk, tokenizer=tokenizer, progress=progress,
        threshold=settings.topk_threshold,
      )  # fmt: skip

  base_s = []
  for w in tqdm.tqdm(range(len(docs)), desc='base', disable=not progress):
    members = [i for i, n in enumerate(planted) if n.window == w]
    ids = [_bos(tokenizer), *(int(t) for t in docs[w])]
    t0 = time.perf_counter()
    _, context = model.prefill(
      ids, cache=model.init_cache(capacity=capacity), chunk_size=settings.chunk_size, logits='none'
    )
    context = jax.block_until_ready(context)
    prefill_s = time.perf_counter() - t0
    for i in members:
      t0 = time.perf_counter()
      answer, _, _ = greedy(
        model,
        jax.tree.map(jnp.copy, context),
        prompts[i],
        position=len(ids),
        answer_tokens=settings.answer_tokens,
        chunk=settings.question_chunk,
      )
      text = paging_scale.decode(tokenizer, answer)
      rows[i].update(
        fact_token_in_window=planted[i].span[0] + 1,
        base_answer=text,
        base_right=first_number(text) == planted[i].number,
        base_confused_with=_confused(first_number(text), planted[i], number_of),
        base_answer_s=time.perf_counter() - t0,
      )
    base_s.append(prefill_s)

  paged = stats.rate(sum(r['paged_right'] for r in rows), len(rows))
  base = stats.rate(sum(r['base_right'] for r in rows), len(rows))
  routed = stats.rate(sum(r['routed_right'] for r in rows), len(rows))
  intervals_overlap = paged.low <= base.high and base.low <= paged.high
  return {
    **results.header(
      'needle',
      inputs={
        **results.model_inputs(model, settings.model_name),
        'sha256_page_ids': ledger.sha256_bytes(np.ascontiguousarray(page_ids).tobytes()),
      },
      command=command,
    ),
    'model': settings.model_name,
    'dtype': settings.dtype,
    'impl': settings.impl,
    'routed_over': 'the needle pages only'
    if settings.store_dir is None
    else f'the store at {settings.store_dir}',
    'page_tokens': settings.page_tokens,
    'pages_per_window': settings.pages_per_window,
    'window_tokens': window_tokens,
    'window_capacity': capacity,
    'answer_tokens': settings.answer_tokens,
    'placement': settings.placement,
    'overlap': settings.overlap,
    'router': settings.router,
    'position_scheme': model.position_scheme,
    'top_k': settings.top_k,
    'topk_threshold': settings.topk_threshold,
    'templates': [dataclasses.asdict(t) for t in kinds],
    'corpus': 'standard-library sources of this interpreter, in sorted order'
    if settings.haystack is None
    else [str(path) for path in settings.haystack],
    'summary': {
      'needles': len(rows),
      'paged_accuracy': paged.value,
      'paged_accuracy_wilson95': {'low': paged.low, 'high': paged.high},
      'base_accuracy': base.value,
      'base_accuracy_wilson95': {'low': base.low, 'high': base.high},
      'intervals_overlap': intervals_overlap,
      'routing_top1': routed.value,
      'routing_top1_wilson95': {'low': routed.low, 'high': routed.high},
      'base_window_tokens': window_tokens,
      'needle_pages': len(page_ids),
      'stored_pages': len(routed_over),
      'stored_tokens': int(sum(e.n_tokens for e in routed_over)),
      'store_bytes_on_disk': store_bytes,
      'page_access_median_s': float(np.median([r['access_s'] for r in rows])),
      'paged_answer_median_s': float(np.median([r['paged_answer_s'] for r in rows])),
      'base_window_prefill_median_s': float(np.median(base_s)),
      'base_answer_median_s': float(np.median([r['base_answer_s'] for r in rows])),
      'paged_first_logits_equal_fresh_prefill': rows[0].get(
        'paged_first_logits_equal_fresh_prefill'
      ),
      'base_accuracy_same_template_neighbour': _accuracy(
        rows, 'base', lambda r: r['same_template_neighbours'] > 0
      ),
      'base_accuracy_no_same_template_neighbour': _accuracy(
        rows, 'base', lambda r: r['same_template_neighbours'] == 0
      ),
      'paged_accuracy_at_boundary': _accuracy(rows, 'paged', lambda r: r['at_boundary']),
      'base_accuracy_at_boundary': _accuracy(rows, 'base', lambda r: r['at_boundary']),
      'paged_accuracy_inside_a_page': _accuracy(rows, 'paged', lambda r: not r['at_boundary']),
      'paged_distractor_confusions': sum(r['paged_confused_with'] is not None for r in rows),
      'base_distractor_confusions': sum(r['base_confused_with'] is not None for r in rows),
      **(_top_k_summary(rows, settings.top_k) if settings.top_k else {}),
    },
    'rates': {
      'paged': paged.to_json(),
      'base': base.to_json(),
      'routing': routed.to_json(),
      **(_top_k_rates(rows) if settings.top_k else {}),
    },
    'store_build_s': build_s,
    'seconds': time.perf_counter() - t_start,
    'rows': rows,
  }


def _load(model_name: str, *, dtype: str, impl: str, position_scheme: str):
  """The model under `position_scheme`; `impl` 'xla', 'pallas' or 'xla_split' (XLA, attention
  summed by absolute splits)."""
  if impl == 'xla_split':
    model = paging_scale.load_model(model_name, dtype=dtype, impl='xla')
    model = model.with_impl('xla', attention='xla_split')
  else:
    model = paging_scale.load_model(model_name, dtype=dtype, impl=impl)
  return (
    model
    if position_scheme == model.position_scheme
    else model.with_position_scheme(position_scheme)
  )


def _top_k_arm(
  model,
  context,
  planted,
  prompts,
  rows,
  spans,
  page_of,
  number_of,
  *,
  k: int,
  answer_tokens: int,
  chunk_size: int,
  question_chunk: int,
  tokenizer,
  progress: bool,
  threshold: float | None = None,
) -> None:
  """Each question after its top-k routed pages side by side (best last, next to it), those
  scoring below `threshold` left out (the best page kept; the router's own threshold applies
  first); the first needle's context is
  checked against a fresh block-attention prefill of its pages. Each row records the other
  planted facts of its template held whole by the pages composed (`topk_same_template_composed`)
  and whether a wrong answer is the number of one of them (`topk_confused_with_composed`)."""
  for i, (needle, prompt, row) in enumerate(
    tqdm.tqdm(list(zip(planted, prompts, rows)), desc=f'top-{k}', disable=not progress)
  ):
    t0 = time.perf_counter()
    routed = context.catalog.route(needle.question, k)
    if threshold is not None:
      routed = routed[:1] + [(entry, score) for entry, score in routed[1:] if score >= threshold]
    route_s = time.perf_counter() - t0
    keys = [entry.key for entry, _ in routed][::-1]  # best last: next to the question
    opened = context.assemble(keys, scores=[score for _, score in routed][::-1], route_s=route_s)
    t1 = time.perf_counter()
    position = opened.layout.next_position
    if i == 0:  # the composed context against a fresh prefill of its pages in its layout
      fresh = context.fresh(opened, chunk_size=chunk_size)
      _, fresh_first, _ = greedy(
        model, fresh, prompt, position=position, answer_tokens=1, chunk=question_chunk
      )
    answer, first, _ = greedy(
      model,
      opened.cache,
      prompt,
      position=position,
      answer_tokens=answer_tokens,
      chunk=question_chunk,
    )
    t2 = time.perf_counter()
    text = paging_scale.decode(tokenizer, answer)
    ranks = [
      rank
      for rank, (entry, _) in enumerate(routed)
      if page_of[entry.key] is not None and _holds(spans[page_of[entry.key]], needle)
    ]
    composed = [spans[page_of[e.key]] for e, _ in routed if page_of[e.key] is not None]
    beside = [m for m in planted if m is not needle and any(_holds(sp, m) for sp in composed)]
    confused = _confused(first_number(text), needle, number_of)
    row.update(
      topk_routed_pages=[entry.source for entry, _ in routed],
      topk_composed=len(routed),
      topk_same_template_composed=sum(m.template == needle.template for m in beside),
      topk_confused_with_composed=confused is not None and confused in {m.name for m in beside},
      topk_routed_rank=ranks[0] if ranks else None,
      topk_routed_right=bool(ranks),
      topk_answer=text,
      topk_right=first_number(text) == needle.number,
      topk_confused_with=confused,
      topk_access_s=t1 - t0,
      topk_answer_s=t2 - t1,
    )
    if i == 0:
      row['topk_first_logits_equal_fresh_prefill'] = _sha(first) == _sha(fresh_first)


def _top_k_rates(rows) -> dict[str, Any]:
  n = len(rows)
  return {
    'topk': stats.rate(sum(r['topk_right'] for r in rows), n).to_json(),
    'routing_topk': stats.rate(sum(r['topk_routed_right'] for r in rows), n).to_json(),
  }


def _top_k_summary(rows, k: int) -> dict[str, Any]:
  """The top-k arm's figures: accuracy, routing recall at k, latency, exactness."""
  rates = _top_k_rates(rows)
  return {
    'topk_k': k,
    'topk_accuracy': rates['topk']['rate'],
    'topk_accuracy_wilson95': {'low': rates['topk']['low'], 'high': rates['topk']['high']},
    'routing_topk': rates['routing_topk']['rate'],
    'routing_topk_wilson95': {
      'low': rates['routing_topk']['low'],
      'high': rates['routing_topk']['high'],
    },
    'topk_accuracy_at_boundary': _accuracy(rows, 'topk', lambda r: r['at_boundary']),
    'topk_access_median_s': float(np.median([r['topk_access_s'] for r in rows])),
    'topk_answer_median_s': float(np.median([r['topk_answer_s'] for r in rows])),
    'topk_first_logits_equal_fresh_prefill': rows[0]['topk_first_logits_equal_fresh_prefill'],
    'topk_distractor_confusions': sum(r['topk_confused_with'] is not None for r in rows),
    'topk_pages_composed_mean': float(np.mean([r['topk_composed'] for r in rows])),
    # interference: the composed analogue of the base arm's same-template neighbour
    'topk_accuracy_same_template_composed': _accuracy(
      rows, 'topk', lambda r: r['topk_same_template_composed'] > 0
    ),
    'topk_accuracy_no_same_template_composed': _accuracy(
      rows, 'topk', lambda r: r['topk_same_template_composed'] == 0
    ),
    'topk_confusions_with_composed': sum(r['topk_confused_with_composed'] for r in rows),
  }


def _needle_page(source: str) -> int | None:
  """The needle page index of a catalog source, None for a page of another origin."""
  head, _, index = source.rpartition(' ')
  return int(index) if head == NEEDLE_SOURCE and index.isdigit() else None


def _holds(span: tuple[int, int, int], needle: Needle) -> bool:
  """Whether a page of (window, begin, end) holds the needle's fact whole."""
  window, begin, end = span
  return window == needle.window and begin <= needle.span[0] and needle.span[1] <= end


def _confused(answer: int | None, needle: Needle, number_of: dict[int, str]) -> str | None:
  """The name of another planted fact whose number `answer` is, else None."""
  other = number_of.get(answer)
  return None if other is None or other == needle.name else other


def _accuracy(rows, arm: str, where) -> dict[str, float] | None:
  """Accuracy of `arm` over the rows `where` holds, with its Wilson 95% interval (None: none)."""
  picked = [r for r in rows if where(r)]
  if not picked:
    return None
  rate = stats.rate(sum(r[f'{arm}_right'] for r in picked), len(picked))
  return {'rate': rate.value, 'low': rate.low, 'high': rate.high, 'n': len(picked)}


def format_summary(result: dict[str, Any]) -> str:
  s = result['summary']
  pct = lambda v: f'{100 * v:.1f}%'
  interval = lambda k: f'[{pct(s[k]["low"])}, {pct(s[k]["high"])}]'
  part = lambda k: 'n/a' if s[k] is None else f'{pct(s[k]["rate"])} of {s[k]["n"]}'
  return (
    f'{s["needles"]} needles, {result["model"]} {result["dtype"]}:'
    f' paged {pct(s["paged_accuracy"])} {interval("paged_accuracy_wilson95")},'
    f' base over {s["base_window_tokens"]:,}-token windows {pct(s["base_accuracy"])}'
    f' {interval("base_accuracy_wilson95")}; routing top-1 {pct(s["routing_top1"])};'
    f' page access {s["page_access_median_s"] * 1e3:.1f} ms (median)\n'
    f'base with a same-template neighbour {part("base_accuracy_same_template_neighbour")},'
    f' without {part("base_accuracy_no_same_template_neighbour")}; at a boundary: paged'
    f' {part("paged_accuracy_at_boundary")}, base {part("base_accuracy_at_boundary")};'
    f' answers naming another fact: paged {s["paged_distractor_confusions"]},'
    f' base {s["base_distractor_confusions"]}'
  ) + (
    f'\ntop-{s["topk_k"]} composed: {pct(s["topk_accuracy"])} {interval("topk_accuracy_wilson95")};'
    f' routing top-{s["topk_k"]} {pct(s["routing_topk"])}; access'
    f' {s["topk_access_median_s"] * 1e3:.1f} ms (median); first logits equal a fresh prefill:'
    f' {s["topk_first_logits_equal_fresh_prefill"]}'
    + (
      f'\ncomposed beside a same-template fact {part("topk_accuracy_same_template_composed")},'
      f' without {part("topk_accuracy_no_same_template_composed")}; answers naming a fact'
      f' composed beside: {s["topk_confusions_with_composed"]}'
      if 'topk_confusions_with_composed' in s  # absent from results before it
      else ''
    )
    if 'topk_k' in s
    else ''
  )
