"""Catalog lookup cost against the number of catalogued pages.

The library of experiments/bench_paging_route.py. `experiment(...)` fills a sqlite
catalog (`graftjax.paging.catalog`) with pieces of the standard library's sources, for
every catalog size and router (exact recurrence, BM25), and times route + fetch per
query. No model is run.
"""

from __future__ import annotations

import hashlib
import pathlib
import random
import tempfile
import time

import numpy as np

from graftjax.paging import catalog as catalog_lib
from graftjax.routing import route as route_lib
from graftjax.studies.common import corpus
from graftjax.studies.common import results

_FINGERPRINT = '0' * 64  # no model: entries stand for pages of some model


def pieces(n: int, lines: int, seed: int) -> list[tuple[str, str]]:
  """(source, text) of n pieces of `lines` lines of the standard library, shuffled."""
  root = corpus.stdlib_root()
  out = []
  for path in corpus.stdlib_files():
    text = path.read_text(encoding='utf-8', errors='replace').splitlines()
    for begin in range(0, len(text), lines):
      piece = '\n'.join(text[begin : begin + lines])
      if len(route_lib.normalize(piece)) >= 200:
        out.append((f'{path.relative_to(root)}:{begin + 1}', piece))
  random.Random(seed).shuffle(out)
  if len(out) < n:
    raise ValueError(f'the standard library gives {len(out)} pieces, fewer than {n}')
  return out[:n]


def key_of(source: str) -> str:
  return hashlib.sha256(source.encode()).hexdigest()


def bench_size(entries, *, kind: str, queries: int, seed: int, folder: pathlib.Path) -> dict:
  """Fill a catalog with `entries`, time `queries` lookups with router `kind`; the row."""
  router = route_lib.BM25Router(threshold=0.0) if kind == 'bm25' else route_lib.ExactRouter()
  path = folder / f'{kind}_{len(entries)}.sqlite'
  with catalog_lib.Catalog(path, router=router) as catalog:
    t0 = time.perf_counter()
    catalog.add_many(
      catalog_lib.Entry(
        key_of(s), text, s, len(text.split()), None, _FINGERPRINT, 'bfloat16', key_of(text)
      )
      for s, text in entries
    )
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if kind == 'bm25':
      router._build()  # index build, timed apart
    build_s = time.perf_counter() - t0
    rng = random.Random(seed)
    asked = [rng.randrange(len(entries)) for _ in range(queries)]
    route_s, get_s, right = [], [], 0
    for i in asked:
      source, text = entries[i]
      if kind == 'bm25':
        lines = [line for line in text.splitlines() if len(line.strip()) >= 40] or [text]
        query = rng.choice(lines)
      else:
        query = text
      t0 = time.perf_counter()
      hits = catalog.router.route(query, k=1)
      t1 = time.perf_counter()
      got = [catalog.get(hit.key) for hit in hits]
      t2 = time.perf_counter()
      route_s.append(t1 - t0)
      get_s.append(t2 - t1)
      right += bool(got) and got[0].key == key_of(source)
  lookup = np.add(route_s, get_s)
  return {
    'router': kind,
    'entries': len(entries),
    'catalog_bytes': path.stat().st_size,
    'add_s': add_s,
    'index_build_s': build_s,
    'queries': queries,
    'route_median_s': float(np.median(route_s)),
    'sqlite_get_median_s': float(np.median(get_s)),
    'lookup_median_s': float(np.median(lookup)),
    'lookup_p90_s': float(np.percentile(lookup, 90)),
    'top1_own_piece': right / queries,
  }


def experiment(
  *, sizes: list[int], queries: int, lines: int, seed: int, command: str | None = None
) -> dict:
  """Lookup cost of every router at every catalog size; the result."""
  entries = pieces(max(sizes), lines, seed)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for kind in ('exact', 'bm25'):
      for n in sizes:
        rows.append(
          bench_size(entries[:n], kind=kind, queries=queries, seed=seed, folder=pathlib.Path(tmp))
        )
  digest = hashlib.sha256('\0'.join(text for _, text in entries).encode()).hexdigest()
  summary = {
    kind: {str(r['entries']): r['lookup_median_s'] for r in rows if r['router'] == kind}
    for kind in ('exact', 'bm25')
  }
  for kind, by_size in summary.items():
    values = list(by_size.values())
    by_size['largest_over_smallest'] = values[-1] / values[0]
  return {
    **results.header('bench_paging_route', inputs={'sha256_pieces': digest}, command=command),
    'lines_per_piece': lines,
    'timing': 'median of per-query wall times on a CPU shared with other work',
    'summary': {'lookup_median_s': summary},
    'rows': rows,
  }


def format_rows(result: dict) -> str:
  """One line per router and catalog size: lookup (route, sqlite; p90), index build, top-1."""
  return '\n'.join(
    f'{row["router"]:>5} N={row["entries"]:>6}  lookup {row["lookup_median_s"] * 1e3:.3f} ms'
    f' (route {row["route_median_s"] * 1e3:.3f}, sqlite {row["sqlite_get_median_s"] * 1e3:.3f};'
    f' p90 {row["lookup_p90_s"] * 1e3:.3f})  build {row["index_build_s"]:.2f}s'
    f'  top1 {row["top1_own_piece"]:.2f}'
    for row in result['rows']
  )
