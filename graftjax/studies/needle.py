"""Needles in a paged store: routed page-in against the base model over a window.

Details and the exactness argument: docs/paging.md, section `graftjax/studies/needle.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import re
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import ledger
from graftjax import store as store_lib
from graftjax.flywheel import route as route_lib
from graftjax.flywheel import stats
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import pages
from graftjax.studies import corpus
from graftjax.studies import paging_scale
from graftjax.studies import results

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


@dataclasses.dataclass(frozen=True)
class Needle:
  name: str
  number: int
  page: int  # index of the page holding it (window = page // pages_per_window)
  offset: int  # token offset of its line in the page (BOS at 0)

  @property
  def fact(self) -> str:
    return f'The access code of {self.name} is {self.number}.'

  @property
  def question(self) -> str:
    return f'What is the access code of {self.name}?'

  @property
  def prompt(self) -> str:
    return f'\nQuestion: {self.question}\nAnswer: The access code of {self.name} is'


def make_needles(count: int, seed: int) -> list[tuple[str, int]]:
  """`count` distinct (name, 4-digit number) pairs."""
  rng = random.Random(seed)
  names = [f'{a} {b}' for a in FIRST_NAMES for b in LAST_NAMES]
  if count > len(names):
    raise ValueError(f'at most {len(names)} needles, asked for {count}')
  return list(zip(rng.sample(names, count), rng.sample(range(1000, 10000), count)))


def plant(tokenizer, *, needles: int, page_tokens: int, pages_per_window: int, margin: int, seed):
  """(page token ids [P, page_tokens], needles): windows of real text with facts planted."""
  body = page_tokens - 1
  windows = -(-needles // pages_per_window)
  num_pages = windows * pages_per_window
  text_ids: list[int] = []
  for path in corpus.stdlib_files():
    text_ids += tokenizer.encode(path.read_text(encoding='utf-8', errors='replace'), add_bos=False)
    if len(text_ids) >= num_pages * body:
      break
  newline = {i for i in set(text_ids) if '\n' in paging_scale.decode(tokenizer, [i])}
  rng = random.Random(seed)
  facts = make_needles(needles, seed)
  page_ids, planted = [], []
  for p in range(num_pages):
    ids = text_ids[p * body : (p + 1) * body]
    if p < needles:
      name, number = facts[p]
      needle_ids = tokenizer.encode(f'The access code of {name} is {number}.\n', add_bos=False)
      lo, hi = margin, body - margin - len(needle_ids)
      breaks = [i + 1 for i in range(lo - 1, hi - 1) if ids[i] in newline] or [lo]
      at = rng.choice(breaks)
      ids = (ids[:at] + needle_ids + ids[at:])[:body]
      planted.append(Needle(name, number, p, at + 1))
    page_ids.append([_bos(tokenizer), *ids])
  return np.asarray(page_ids, np.int32), planted


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


def experiment(
  *,
  model_name: str,
  dtype: str,
  impl: str = 'xla',
  store_dir: str | os.PathLike | None = None,
  needles: int,
  page_tokens: int,
  pages_per_window: int,
  answer_tokens: int,
  chunk_size: int,
  question_chunk: int,
  margin: int = 32,
  seed: int = 0,
  progress: bool = True,
  command: str | None = None,
) -> dict[str, Any]:
  """Both arms on every needle; the result.

  With `store_dir` (a store grown by `paging_scale`, same model), the needle
  pages join that store and its catalog, and every question is routed over
  all of it; otherwise over the needle pages alone, in a temporary store.
  """
  model = paging_scale.load_model(model_name, dtype=dtype, impl=impl)
  tokenizer = paging_scale.tokenizer_of(model)
  page_ids, planted = plant(
    tokenizer,
    needles=needles,
    page_tokens=page_tokens,
    pages_per_window=pages_per_window,
    margin=margin,
    seed=seed,
  )
  window_tokens = 1 + pages_per_window * (page_tokens - 1)
  prompts = [tokenizer.encode(n.prompt, add_bos=False) for n in planted]
  longest = max(len(p) for p in prompts) + answer_tokens
  capacity = -(-(window_tokens + longest) // 64) * 64
  config, target = model.config, model.graft_target
  rows = [{'name': n.name, 'number': n.number, 'page': n.page, 'offset': n.offset} for n in planted]
  t_start = time.perf_counter()

  with contextlib.ExitStack() as stack:
    root = store_dir or stack.enter_context(tempfile.TemporaryDirectory())
    store = store_lib.BlockStore(os.path.join(root, 'store') if store_dir is None else root)
    catalog = stack.enter_context(
      catalog_lib.Catalog.beside(store, router=route_lib.BM25Router(threshold=0.0))
    )
    t0 = time.perf_counter()
    for p in tqdm.tqdm(range(len(page_ids)), desc='pages', disable=not progress):
      (page,) = paging_scale.make_pages(
        model, page_ids[p][None], capacity=capacity, chunk_size=chunk_size, local_rows=None
      )
      key = pages.put(store, page)
      catalog.add(
        key,
        paging_scale.decode(tokenizer, page_ids[p][1:]),
        source=f'{NEEDLE_SOURCE} {p}',
        n_tokens=page_tokens,
        model_fingerprint=model.fingerprint,
        dtype=jnp.dtype(model.dtype).name,
        page_layout=page.layout,
      )
    build_s = time.perf_counter() - t0
    key_of = {catalog.get(k).source: k for k in catalog.keys()}
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
        pages.install(window, got, target=target, config=config, donate=True)
      )
      t3 = time.perf_counter()
      answer, first, window = greedy(
        model,
        window,
        prompt,
        position=page_tokens,
        answer_tokens=answer_tokens,
        chunk=question_chunk,
      )
      t4 = time.perf_counter()
      text = paging_scale.decode(tokenizer, answer)
      row.update(
        routed_page=hits[0][0].source,
        routed_right=hits[0][0].key == key_of[f'{NEEDLE_SOURCE} {needle.page}'],
        paged_answer=text,
        paged_right=first_number(text) == needle.number,
        route_s=t1 - t0,
        read_verify_s=t2 - t1,
        install_s=t3 - t2,
        access_s=t3 - t0,
        paged_answer_s=t4 - t3,
      )
      if i == 0 and row['routed_right']:  # the paged context against a fresh prefill of it
        _, fresh = model.prefill(
          page_ids[needle.page],
          cache=model.init_cache(capacity=capacity),
          chunk_size=chunk_size,
          logits='none',
        )
        _, fresh_first, _ = greedy(
          model, fresh, prompt, position=page_tokens, answer_tokens=1, chunk=question_chunk
        )
        row['paged_first_logits_equal_fresh_prefill'] = _sha(first) == _sha(fresh_first)

  base_s = []
  for w in tqdm.tqdm(range(-(-needles // pages_per_window)), desc='base', disable=not progress):
    members = range(w * pages_per_window, (w + 1) * pages_per_window)
    ids = [_bos(tokenizer)] + [int(t) for p in members for t in page_ids[p][1:]]
    t0 = time.perf_counter()
    _, context = model.prefill(
      ids, cache=model.init_cache(capacity=capacity), chunk_size=chunk_size, logits='none'
    )
    context = jax.block_until_ready(context)
    prefill_s = time.perf_counter() - t0
    for i in (i for i in members if i < needles):
      t0 = time.perf_counter()
      answer, _, _ = greedy(
        model,
        jax.tree.map(jnp.copy, context),
        prompts[i],
        position=len(ids),
        answer_tokens=answer_tokens,
        chunk=question_chunk,
      )
      text = paging_scale.decode(tokenizer, answer)
      rows[i].update(
        window=w,
        fact_token_in_window=(planted[i].page - w * pages_per_window) * (page_tokens - 1)
        + planted[i].offset,
        base_answer=text,
        base_right=first_number(text) == planted[i].number,
        base_answer_s=time.perf_counter() - t0,
      )
    base_s.append(prefill_s)

  paged = stats.rate(sum(r['paged_right'] for r in rows), len(rows))
  base = stats.rate(sum(r['base_right'] for r in rows), len(rows))
  routed = stats.rate(sum(r['routed_right'] for r in rows), len(rows))
  overlap = paged.low <= base.high and base.low <= paged.high
  return {
    **results.header(
      'needle',
      inputs={
        'model_fingerprint': model.fingerprint,
        'sha256_page_ids': ledger.sha256_bytes(np.ascontiguousarray(page_ids).tobytes()),
      },
      command=command,
    ),
    'model': model_name,
    'dtype': dtype,
    'impl': impl,
    'routed_over': 'the needle pages only' if store_dir is None else f'the store at {store_dir}',
    'page_tokens': page_tokens,
    'pages_per_window': pages_per_window,
    'window_tokens': window_tokens,
    'window_capacity': capacity,
    'answer_tokens': answer_tokens,
    'corpus': 'standard-library sources of this interpreter, in sorted order',
    'summary': {
      'needles': len(rows),
      'paged_accuracy': paged.value,
      'paged_accuracy_wilson95': {'low': paged.low, 'high': paged.high},
      'base_accuracy': base.value,
      'base_accuracy_wilson95': {'low': base.low, 'high': base.high},
      'intervals_overlap': overlap,
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
    },
    'rates': {'paged': paged.to_json(), 'base': base.to_json(), 'routing': routed.to_json()},
    'store_build_s': build_s,
    'seconds': time.perf_counter() - t_start,
    'rows': rows,
  }


def format_summary(result: dict[str, Any]) -> str:
  s = result['summary']
  pct = lambda v: f'{100 * v:.1f}%'
  interval = lambda k: f'[{pct(s[k]["low"])}, {pct(s[k]["high"])}]'
  return (
    f'{s["needles"]} needles, {result["model"]} {result["dtype"]}:'
    f' paged {pct(s["paged_accuracy"])} {interval("paged_accuracy_wilson95")},'
    f' base over {s["base_window_tokens"]:,}-token windows {pct(s["base_accuracy"])}'
    f' {interval("base_accuracy_wilson95")}; routing top-1 {pct(s["routing_top1"])};'
    f' page access {s["page_access_median_s"] * 1e3:.1f} ms (median)'
  )
