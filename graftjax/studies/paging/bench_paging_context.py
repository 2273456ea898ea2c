"""Paged attention context: host-tier hit and miss latency, and route + read + verify + install.

The library of experiments/bench_paging_context.py. `experiment(...)` cuts standard-library
source into pages of `page_tokens` tokens, prefills each alone at slot 0 (rope_relative, Pallas
kernels), stores it as a window-trimmed page and catalogues it (BM25). It then times, per page:

  store read       `pages.get`: read + SHA-256 verify from the `file` store (OS cache warm);
  tier miss        `HostTier.get` on an empty tier: the store read + keeping the rows;
  tier hit         `HostTier.get` again: rebuilt from host memory, re-hashed (`verify_hits`);
  tier hit, unverified   the same without the re-hash;

and, per query (a line of a page's text), `PagedContext.open(k)` with the tier cleared (cold:
every page a miss) and again (warm: every page a hit), by step (route, read, check, install).
The first query's logits after the paged context are checked byte-equal (SHA-256) to a fresh
block-attention prefill of the same pages' texts in the same layout. Every figure is a median
(the CPU is shared with other work); the 90th percentile is kept beside it.
"""

from __future__ import annotations

import pathlib
import tempfile
import time

import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import blocks
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import context as context_lib
from graftjax.paging import pages as pages_lib
from graftjax.routing import route as route_lib
from graftjax.studies.common import corpus
from graftjax.studies.common import results


def page_pieces(tokenizer, n_pages: int, page_tokens: int) -> list[tuple[str, list[int]]]:
  """(source, ids) of n_pages pieces: BOS + page_tokens - 1 tokens of one stdlib file each."""
  bos = getattr(tokenizer, 'bos_id', 2)
  root = corpus.stdlib_root()
  out = []
  for path in corpus.stdlib_files():
    ids = tokenizer.encode(path.read_text(encoding='utf-8', errors='replace'), add_bos=False)
    body = page_tokens - 1
    for begin in range(0, len(ids) - body + 1, body):
      out.append((f'{path.relative_to(root)}@{begin}', [bos] + list(ids[begin : begin + body])))
      if len(out) == n_pages:
        return out
  raise ValueError(f'the standard library gives fewer than {n_pages} pages of {page_tokens}')


def _stats(times: list[float]) -> dict[str, float]:
  return {'median_s': float(np.median(times)), 'p90_s': float(np.percentile(times, 90))}


def _timed(fn) -> tuple[float, object]:
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def _query_text(text: str) -> str:
  """The piece's longest line (what a user might quote), stripped."""
  return max(text.splitlines() or [text], key=lambda line: len(route_lib.normalize(line))).strip()


def experiment(
  *,
  model_name: str,
  dtype: str,
  n_pages: int,
  page_tokens: int,
  k: int,
  capacity: int,
  chunk_size: int,
  queries: int,
  tier_pages: int,
  command: str | None = None,
) -> dict:
  """Tier hit/miss and paged-context open latencies (medians); the result."""
  model = gemma_model.load_named(
    model_name, dtype=jnp.dtype(dtype), position_scheme='rope_relative', impl='pallas'
  )
  tokenizer = model.tokenizer
  pieces = page_pieces(tokenizer, n_pages, page_tokens)
  target = model.graft_target
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'pages')
    catalog = catalog_lib.Catalog(':memory:', store=store)
    keys, texts, page_bytes = [], [], []
    for source, ids in tqdm.tqdm(pieces, desc='deposit pages'):
      _, cache = model.prefill(
        ids, cache=model.init_cache(capacity=capacity), chunk_size=chunk_size, logits='none'
      )
      block = blocks.capture(
        cache, blocks.Span(0, len(ids)), token_ids=ids, target=target, chunk_size=chunk_size
      )
      page = pages_lib.to_page(block, model.config)
      key = pages_lib.put(store, page)
      text = tokenizer.decode(ids[1:])
      catalog.add(
        key,
        text,
        source=source,
        n_tokens=len(ids),
        model_fingerprint=target.fingerprint,
        dtype=target.dtype,
        page_layout=page.layout,
      )
      keys.append(key)
      texts.append(text)
      page_bytes.append(page.nbytes())
    tier_bytes = tier_pages * max(page_bytes) * 2  # room for tier_pages pages (kept rows + slack)

    # Per page: store read, tier miss, verified hit, unverified hit.
    pages_lib.get(store, keys[0])  # warm-up (imports, OS cache)
    per_page = {'store_read': [], 'tier_miss': [], 'tier_hit': [], 'tier_hit_unverified': []}
    for key in tqdm.tqdm(keys, desc='tier'):
      per_page['store_read'].append(_timed(lambda key=key: pages_lib.get(store, key))[0])
      tier = context_lib.HostTier(store, max_bytes=tier_bytes)
      per_page['tier_miss'].append(_timed(lambda key=key, tier=tier: tier.get(key))[0])
      per_page['tier_hit'].append(_timed(lambda key=key, tier=tier: tier.get(key))[0])
      tier.verify_hits = False
      per_page['tier_hit_unverified'].append(_timed(lambda key=key, tier=tier: tier.get(key))[0])
    memory = tier.memory

    # Per query: open cold (tier cleared) and warm (every page a hit).
    tier = context_lib.HostTier(store, max_bytes=tier_bytes)
    ctx = context_lib.PagedContext(model, store, catalog, capacity=capacity, tier=tier)
    rng = np.random.default_rng(0)
    chosen = rng.choice(len(keys), size=min(queries, len(keys)), replace=False)
    pad = tokenizer.encode(' ', add_bos=False)[-1]
    ctx.open(_query_text(texts[int(chosen[0])]), k=k)  # warm-up: compiles the installs
    opens = {'cold': [], 'warm': []}
    steps = {'cold': [], 'warm': []}
    exact = None
    for n, i in enumerate(tqdm.tqdm(chosen, desc='queries')):
      query = _query_text(texts[int(i)])
      for phase in ('cold', 'warm'):
        if phase == 'cold':
          tier.clear()
        opened = ctx.open(query, k=k)
        if phase == 'warm' and opened.hits != len(opened.keys):
          raise RuntimeError(f'warm open had {opened.hits} hits of {len(opened.keys)}')
        opens[phase].append(sum(opened.seconds.values()))
        steps[phase].append(opened.seconds)
      if n == 0:
        ids = tokenizer.encode(query, add_bos=False)[:chunk_size]
        ids = list(ids) + [pad] * (chunk_size - len(ids))
        paged, _ = ctx.query(opened, ids, chunk_size=chunk_size, logits='all')
        fresh, _ = model.prefill(
          ids,
          cache=ctx.fresh(opened, chunk_size=chunk_size),
          chunk_size=chunk_size,
          start_position=opened.layout.next_position,
          logits='all',
        )
        exact = {
          'paged_logits_sha256': ledger.sha256_bytes(np.asarray(paged).tobytes()),
          'fresh_logits_sha256': ledger.sha256_bytes(np.asarray(fresh).tobytes()),
          'pages': len(opened.keys),
          'query_position': opened.layout.next_position,
        }
        exact['byte_equal'] = exact['paged_logits_sha256'] == exact['fresh_logits_sha256']
  step_medians = {
    phase: {s: float(np.median([t[s] for t in steps[phase]])) for s in steps[phase][0]}
    for phase in steps
  }
  per_page_stats = {name: _stats(times) for name, times in per_page.items()}
  summary = {
    'window_slots': capacity,
    'pages_stored': len(keys),
    'page_tokens': page_tokens,
    'k': k,
    'page_bytes_median': float(np.median(page_bytes)),
    'tier_memory': memory,
    'tier_hit_s': per_page_stats['tier_hit']['median_s'],
    'tier_hit_unverified_s': per_page_stats['tier_hit_unverified']['median_s'],
    'tier_miss_s': per_page_stats['tier_miss']['median_s'],
    'store_read_s': per_page_stats['store_read']['median_s'],
    'open_cold_s': float(np.median(opens['cold'])),
    'open_warm_s': float(np.median(opens['warm'])),
    'paged_equals_fresh': bool(exact and exact['byte_equal']),
  }
  inputs = {
    **results.model_inputs(model, model_name),
    'sha256_page_ids': ledger.sha256_tokens([t for _, ids in pieces for t in ids]),
  }
  return {
    **results.header('bench_paging_context', inputs=inputs, command=command),
    'model': model_name,
    'dtype': dtype,
    'chunk_size': chunk_size,
    'statistic': 'median over pages (tier, store) or queries (open); CPU shared with other work',
    'summary': summary,
    'per_page': per_page_stats,
    'open': {
      phase: {**_stats(opens[phase]), 'steps_median_s': step_medians[phase]} for phase in opens
    },
    'exactness': exact,
    'tier_max_bytes': tier_bytes,
  }


def format_summary(result: dict) -> str:
  s = result['summary']
  return (
    f'{s["pages_stored"]} pages of {s["page_tokens"]} tokens, k={s["k"]}, window'
    f' {s["window_slots"]} ({s["tier_memory"]} tier), medians:\n'
    f'  tier hit {s["tier_hit_s"] * 1e3:.3f} ms (unverified'
    f' {s["tier_hit_unverified_s"] * 1e3:.3f} ms), miss {s["tier_miss_s"] * 1e3:.3f} ms'
    f' (store read {s["store_read_s"] * 1e3:.3f} ms)\n'
    f'  open cold {s["open_cold_s"] * 1e3:.1f} ms, warm {s["open_warm_s"] * 1e3:.1f} ms;'
    f' paged == fresh logits: {s["paged_equals_fresh"]}'
  )
