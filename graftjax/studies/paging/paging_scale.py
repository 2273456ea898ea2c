"""A page store grown from real text, and its access cost at every size.

Details and the exactness argument: docs/paging.md, section `graftjax/studies/paging/paging_scale.py`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import pathlib
import platform
import random
import sysconfig
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import blocks
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import ops
from graftjax.models.gemma import tokenizer as tokenizer_lib
from graftjax.paging import catalog as catalog_lib
from graftjax.paging import pages
from graftjax.routing import route as route_lib
from graftjax.studies.common import corpus
from graftjax.studies.common import results

PLAN_FILE = 'scale_plan.npz'
PLAN_META = 'scale_plan.json'
MEASUREMENTS = 'scale_measurements.json'
# The tiny model's dimensions with the real model's attention layout.
TINY_270M_LAYOUT = 'tiny-270m-layout'
MODELS = ('gemma3-270m', 'tiny', TINY_270M_LAYOUT)


def load_model(name: str, *, dtype: str = 'float32', impl: str = 'xla') -> gemma_model.Gemma:
  """'gemma3-270m', 'tiny', or 'tiny-270m-layout': tiny random weights (embed 32, head dim
  16, one KV head) in the real model's layout (18 layers, 5 local : 1 global, window 512)."""
  if name == TINY_270M_LAYOUT:
    return gemma_model.tiny(
      dtype=jnp.dtype(dtype),
      attention_types=config_lib.gemma3_attention_pattern(18),
      sliding_window=512,
      impl=impl,
    )
  return gemma_model.load_named(name, dtype=jnp.dtype(dtype), impl=impl)


def decode(tokenizer, ids) -> str:
  """Text of token ids (an int array or list), control tokens left out."""
  return tokenizer.decode([int(i) for i in ids], skip_special=True)


def source_files(*, site_packages: bool = True) -> list[pathlib.Path]:
  """Sorted .py files of the standard library (tests included), then of site-packages."""
  root = corpus.stdlib_root()
  files = [p for p in sorted(root.rglob('*.py')) if 'site-packages' not in p.parts]
  if site_packages:
    site = pathlib.Path(sysconfig.get_paths()['purelib'])
    files += sorted(site.rglob('*.py'))
  return files


@dataclasses.dataclass(frozen=True)
class Plan:
  """Pages to store, in store order: ids [P, page_tokens] int32 and where each comes from."""

  ids: np.ndarray
  sources: tuple[str, ...]
  made_with: str = ''  # the interpreter whose sources were read, e.g. 'Python 3.11.9'

  def __len__(self) -> int:
    return len(self.sources)

  def digest(self) -> str:
    return ledger.sha256_bytes(np.ascontiguousarray(self.ids, np.int32).tobytes())


def plan_pages(tokenizer, *, page_tokens: int, num_pages: int, seed: int) -> Plan:
  """`num_pages` pages of real source text, shuffled with `seed` (see the module docstring)."""
  if page_tokens < 2 or num_pages < 1:
    raise ValueError(f'need page_tokens >= 2 and num_pages >= 1, got {page_tokens}, {num_pages}')
  bos = getattr(tokenizer, 'bos_id', 2)
  body = page_tokens - 1
  found: list[tuple[str, list[int]]] = []
  seen: set[bytes] = set()  # a page repeated elsewhere (a copied file) has the same key
  for path in source_files():
    text = path.read_text(encoding='utf-8', errors='replace')
    if len(text) < body:  # a token covers at least one character
      continue
    ids = tokenizer.encode(text, add_bos=False)
    where = _relative(path)
    for begin in range(0, len(ids) - body + 1, body):
      page = [bos, *ids[begin : begin + body]]
      if (raw := np.asarray(page, np.int32).tobytes()) not in seen:
        seen.add(raw)
        found.append((f'{where}@{begin}', page))
    if len(found) >= num_pages:
      break
  else:
    raise ValueError(
      f'the sources hold {len(found)} pages of {page_tokens} tokens, not {num_pages}'
    )
  random.Random(seed).shuffle(found)
  found = found[:num_pages]
  return Plan(
    np.asarray([ids for _, ids in found], np.int32),
    tuple(s for s, _ in found),
    made_with=f'Python {platform.python_version()}',
  )


def _relative(path: pathlib.Path) -> str:
  for root in (corpus.stdlib_root(), pathlib.Path(sysconfig.get_paths()['purelib'])):
    if path.is_relative_to(root):
      return str(path.relative_to(root))
  return str(path)


def load_or_plan(folder: pathlib.Path, tokenizer, *, page_tokens, num_pages, seed, model) -> Plan:
  """The plan saved in `folder`, or a new one (saved) when there is none.

  Raises:
    ValueError: if the saved plan was made for other arguments or another model.
  """
  meta = {
    'page_tokens': page_tokens,
    'num_pages': num_pages,
    'seed': seed,
    'model_fingerprint': model.fingerprint,
  }
  if (folder / PLAN_META).exists():
    saved = json.loads((folder / PLAN_META).read_text())
    if {k: saved.get(k) for k in meta} != meta:
      raise ValueError(f'{folder} holds a plan for {saved}, not {meta}: use another --store')
    with np.load(folder / PLAN_FILE) as z:
      plan = Plan(z['ids'], tuple(saved['sources']), made_with=saved.get('made_with', ''))
    if plan.digest() != saved['ids_sha256']:
      raise ValueError(f'{folder / PLAN_FILE} does not match its digest')
    return plan
  plan = plan_pages(tokenizer, page_tokens=page_tokens, num_pages=num_pages, seed=seed)
  folder.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(folder / PLAN_FILE, ids=plan.ids)  # small enough to carry to a device
  (folder / PLAN_META).write_text(
    json.dumps(
      {
        **meta,
        'ids_sha256': plan.digest(),
        'made_with': plan.made_with,
        'sources': list(plan.sources),
      }
    )
  )
  return plan


def plan_only(
  *, model_name: str, dtype: str, impl: str, store_dir, page_tokens: int, num_pages: int, seed: int
) -> Plan:
  """Makes (or checks) the plan of a store without growing it, e.g. to carry it to a device."""
  model = load_model(model_name, dtype=dtype, impl=impl)
  return load_or_plan(
    pathlib.Path(store_dir),
    model.tokenizer,
    page_tokens=page_tokens,
    num_pages=num_pages,
    seed=seed,
    model=model,
  )


def prefill_capacity(page_tokens: int) -> int:
  """A page's own cache: its tokens rounded up to `ops.CAPACITY_MULTIPLE` slots."""
  return -(-page_tokens // ops.CAPACITY_MULTIPLE) * ops.CAPACITY_MULTIPLE


def make_pages(model, ids, *, capacity: int, chunk_size: int, local_rows: int | None):
  """Pages of ids [B, T]: the B rows prefilled side by side, each alone at slots [0, T).

  Under chunk- and batch-invariant kernels each page is byte for byte the page
  of its row prefilled in a batch of one; under XLA the last bits may differ.
  """
  ids = np.asarray(ids, np.int32)
  batch, n = ids.shape
  cache = model.init_cache(batch_size=batch, capacity=capacity)
  for begin in range(0, n, chunk_size):
    chunk = ids[:, begin : begin + chunk_size]
    positions = np.broadcast_to(
      np.arange(begin, begin + chunk.shape[1], dtype=np.int32), chunk.shape
    )
    _, cache = model.forward(chunk, positions, cache, logits='none')
  cache = jax.device_get(cache)  # one copy to the host for every row
  return [
    pages.to_page(
      blocks.capture(
        cache,
        blocks.Span(0, n),
        token_ids=ids[b],
        target=model.graft_target,
        chunk_size=chunk_size,
        batch_index=b,
      ),
      model.config,
      local_rows=local_rows,
    )
    for b in range(batch)
  ]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `experiment` runs (experiments/paging_scale.py builds it from its flags): its
  arguments, as its docstring describes them; `grow` reads the prefill and write fields."""

  model_name: str  # one of MODELS
  dtype: str
  impl: str
  store_dir: str | os.PathLike  # the store, its plan and its measurements
  page_tokens: int  # BOS included
  local_rows: int | None  # local-layer rows kept in a page (None: W - 1)
  window_slots: int  # slots of the window every page is installed into
  sizes: Sequence[int]  # pages stored at each measurement
  queries: int  # per size
  chunk_size: int  # prefill chunk of a page
  seed: int = 0  # page order and queries
  batch: int = 1  # pages prefilled side by side
  threads: int = 8  # concurrent store writes
  deadline_s: float | None = None


def grow(
  store: store_lib.BlockStore,
  catalog: catalog_lib.Catalog,
  model: gemma_model.Gemma,
  plan: Plan,
  upto: int,
  settings: Settings,
  *,
  deadline: float | None = None,
  progress: bool = True,
) -> dict[str, Any]:
  """Stores and catalogues the plan's first `upto` pages (skipping catalogued ones).

  Pages are prefilled `settings.batch` at a time in chunks of `settings.chunk_size` (a short
  last batch is padded with copies of its first page, so one program serves every batch), cut
  to `settings.local_rows` and written by `settings.threads` threads. Stops early, with
  everything added so far durable, at `deadline` (a `time.monotonic()` value). Returns counts
  and seconds.
  """
  tokenizer = model.tokenizer
  done = {catalog.get(key).source for key in catalog.keys()}
  todo = [i for i in range(min(upto, len(plan))) if plan.sources[i] not in done]
  capacity = prefill_capacity(plan.ids.shape[1])
  dtype = jnp.dtype(model.dtype).name
  t0 = time.perf_counter()
  prefill_s, added = 0.0, 0
  pending: list[tuple[int, concurrent.futures.Future]] = []

  def catalogue(batch):
    nonlocal added
    entries = []
    for i, future in batch:
      key, layout = future.result()
      entries.append(
        catalog_lib.Entry(
          key=key,
          text=decode(tokenizer, plan.ids[i][1:]),
          source=plan.sources[i],
          n_tokens=int(plan.ids.shape[1]),
          page_layout=layout,
          model_fingerprint=model.fingerprint,
          dtype=dtype,
        )
      )
    added += catalog.add_many(entries)

  def put(page):
    return pages.put(store, page), page.layout

  batch, threads = settings.batch, settings.threads
  bar = tqdm.tqdm(total=len(todo), desc=f'pages to {upto}', disable=not progress, mininterval=5)
  with bar, concurrent.futures.ThreadPoolExecutor(threads) as pool:
    for begin in range(0, len(todo), batch):
      if deadline is not None and time.monotonic() > deadline:
        break
      rows = todo[begin : begin + batch]
      padded = rows + rows[:1] * (batch - len(rows))
      t1 = time.perf_counter()
      made = make_pages(
        model,
        plan.ids[padded],
        capacity=capacity,
        chunk_size=settings.chunk_size,
        local_rows=settings.local_rows,
      )
      prefill_s += time.perf_counter() - t1
      pending += [(i, pool.submit(put, page)) for i, page in zip(rows, made)]
      bar.update(len(rows))
      while len(pending) >= max(4 * threads, 2 * batch):  # bounded memory; catalogue what is stored
        catalogue(pending[: 2 * threads])
        pending = pending[2 * threads :]
    catalogue(pending)
  return {
    'pages_added': added,
    'seconds': time.perf_counter() - t0,
    'prefill_capture_s': prefill_s,
    'complete': len(catalog) >= min(upto, len(plan)),
  }


@functools.partial(jax.jit, donate_argnums=0)
def _empty(cache):
  return cache.replace(
    positions=jnp.full_like(cache.positions, -1),
    segments=jnp.zeros_like(cache.segments),
    length=jnp.zeros_like(cache.length),
  )


def empty_window(cache):
  """The window (donated) with every slot empty again; installs overwrite keys and values."""
  return jax.block_until_ready(_empty(cache))


def query_line(text: str, rng: random.Random) -> str:
  """A line of >= 40 characters of `text` (the longest line if none is that long)."""
  lines = [line for line in text.splitlines() if len(line.strip()) >= 40]
  if lines:
    return rng.choice(lines)
  return max(text.splitlines() or [text], key=lambda line: len(line.strip()))


def device_memory() -> dict[str, Any]:
  """What the backend says of its memory, and the bytes of every live jax array."""
  device = jax.devices()[0]
  stats = device.memory_stats()
  keep = ('bytes_in_use', 'peak_bytes_in_use', 'bytes_limit')
  return {
    'platform': device.platform,
    'memory_stats': None if stats is None else {k: int(stats[k]) for k in keep if k in stats},
    'live_array_bytes': int(sum(a.nbytes for a in jax.live_arrays())),
  }


def disk_bytes(root: str | os.PathLike) -> dict[str, int]:
  """Files, their sizes and allocated bytes under `root`: the whole store folder (pages,
  catalog, and the saved plan: 5.4 MB for 10,000 pages of 128 tokens)."""
  files = size = allocated = 0
  for folder, _, names in os.walk(root):
    for name in names:
      st = os.lstat(os.path.join(folder, name))
      files += 1
      size += st.st_size
      allocated += st.st_blocks * 512
  return {'files': files, 'bytes': size, 'allocated_bytes': allocated}


def measure(
  store: store_lib.BlockStore,
  catalog: catalog_lib.Catalog,
  model: gemma_model.Gemma,
  window,
  *,
  queries: int,
  seed: int,
) -> tuple[dict[str, Any], Any]:
  """Access latency over the catalogued pages now (see the module docstring); (row, window)."""
  entries = [catalog.get(key) for key in catalog.keys()]
  rng = random.Random(seed)
  config, target = model.config, model.graft_target
  t0 = time.perf_counter()
  catalog.router.route('warm up the index', k=1)  # builds the BM25 index after the adds
  index_build_s = time.perf_counter() - t0
  asked = [rng.randrange(len(entries)) for _ in range(queries)]
  stages = {'route_s': [], 'read_verify_s': [], 'install_s': [], 'first_query_s': []}
  access, right, empty_s, abstained = [], 0, [], 0

  def one(entry, query_text):
    nonlocal window
    t0 = time.perf_counter()
    window = empty_window(window)
    t1 = time.perf_counter()
    hits = catalog.route(query_text, k=1)
    t2 = time.perf_counter()
    if not hits:  # the router abstains (no term of the query is indexed): a miss, not timed
      return None, None
    got = pages.get(store, hits[0][0].key)
    t3 = time.perf_counter()
    query_position = got.first_exact_position(config)
    window = jax.block_until_ready(
      pages.install(
        window,
        got,
        target=target,
        config=config,
        query_position=query_position,
        allow_other_shape=not target.chunk_invariant,
        donate=True,
      )
    )
    t4 = time.perf_counter()
    token = int(got.block.meta.token_ids[-1])
    logits, window = model.forward(
      np.asarray([[token]]), np.asarray([[query_position]]), window, logits='last'
    )
    jax.block_until_ready(logits)
    t5 = time.perf_counter()
    return hits[0][0].key == entry.key, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)

  one(entries[asked[0]], entries[asked[0]].text)  # compiles install and the query
  for i in asked:
    hit, timed = one(entries[i], query_line(entries[i].text, rng))
    if hit is None:
      abstained += 1
      continue
    e, *times = timed
    right += hit
    empty_s.append(e)
    for name, dt in zip(stages, times):
      stages[name].append(dt)
    access.append(sum(times[:3]))
  memory = device_memory()  # while the window (and the last page's query) is live
  disk = disk_bytes(store.root)
  row = {
    'pages': len(entries),
    'stored_tokens': int(sum(e.n_tokens for e in entries)),
    'queries': queries,
    'access_median_s': float(np.median(access)),
    'access_p10_s': float(np.percentile(access, 10)),
    'access_p90_s': float(np.percentile(access, 90)),
    **{f'{name[:-2]}_median_s': float(np.median(v)) for name, v in stages.items()},
    'empty_window_median_s': float(np.median(empty_s)),
    'index_build_s': index_build_s,
    'top1_own_page': right / queries,
    'abstained': abstained,
    'device_memory': memory,
    'disk': disk,
    'catalog_bytes': _catalog_bytes(catalog),
  }
  return row, window


def _catalog_bytes(catalog: catalog_lib.Catalog) -> int:
  return sum(
    os.path.getsize(catalog.path + suffix)
    for suffix in ('', '-wal')
    if os.path.exists(catalog.path + suffix)
  )


def experiment(
  settings: Settings,
  *,
  progress: bool = True,
  command: str | None = None,
) -> dict[str, Any]:
  """Grows the store at `store_dir` to each of `sizes` pages, measuring at each; the result.

  Resumes a store grown by an earlier call with the same settings (its plan
  and measurements are in `store_dir`). With `deadline_s`, stops growing after
  that many seconds; the result then says `complete: False`.
  """
  start = time.monotonic()
  deadline = None if settings.deadline_s is None else start + settings.deadline_s
  sizes = sorted(set(settings.sizes))
  model = load_model(settings.model_name, dtype=settings.dtype, impl=settings.impl)
  if settings.window_slots <= settings.page_tokens:
    raise ValueError(f'a window of {settings.window_slots} slots cannot hold a page and its query')
  folder = pathlib.Path(settings.store_dir)
  t0 = time.perf_counter()
  plan = load_or_plan(
    folder,
    model.tokenizer,
    page_tokens=settings.page_tokens,
    num_pages=max(sizes),
    seed=settings.seed,
    model=model,
  )
  plan_s = time.perf_counter() - t0
  measured_path = folder / MEASUREMENTS
  measured = json.loads(measured_path.read_text()) if measured_path.exists() else {}
  store = store_lib.BlockStore(folder)
  builds = []
  window = model.init_cache(capacity=settings.window_slots)
  with catalog_lib.Catalog.beside(store, router=route_lib.BM25Router(threshold=0.0)) as catalog:
    for size in sizes:
      if str(size) in measured:
        continue
      built = grow(
        store, catalog, model, plan, size, settings, deadline=deadline, progress=progress
      )
      builds.append({'upto': size, **built})
      if not built['complete']:
        break
      row, window = measure(
        store, catalog, model, window, queries=settings.queries, seed=settings.seed
      )
      measured[str(size)] = row
      measured_path.write_text(json.dumps(measured, indent=1))
    stored_pages = len(catalog)
  rows = [measured[str(s)] for s in sizes if str(s) in measured]
  return _result(
    model=model,
    model_name=settings.model_name,
    dtype=settings.dtype,
    impl=settings.impl,
    plan=plan,
    plan_s=plan_s,
    page_tokens=settings.page_tokens,
    local_rows=settings.local_rows,
    window_slots=settings.window_slots,
    sizes=sizes,
    rows=rows,
    builds=builds,
    stored_pages=stored_pages,
    seconds=time.monotonic() - start,
    store_dir=str(folder),
    batch=settings.batch,
    command=command,
  )


def _result(*, model, plan, rows, sizes, page_tokens, window_slots, command, **rest) -> dict:
  config = model.config
  latency = {str(r['pages']): r['access_median_s'] for r in rows}
  fastest = {str(r['pages']): r['access_p10_s'] for r in rows}
  stats = [r['device_memory']['memory_stats'] for r in rows]
  in_use = (
    {str(r['pages']): s['bytes_in_use'] for r, s in zip(rows, stats)}
    if stats and all(s and 'bytes_in_use' in s for s in stats)
    else None
  )
  live = {str(r['pages']): r['device_memory']['live_array_bytes'] for r in rows}
  largest = rows[-1] if rows else None
  values = list(latency.values())
  local = (
    'W - 1 = every row a later query sees' if rest['local_rows'] is None else rest['local_rows']
  )
  byte_tokens = isinstance(model.tokenizer, tokenizer_lib.ByteTokenizer)  # random weights
  summary = {
    'setup': (
      f'{rest["model_name"]} ({"random weights, " if byte_tokens else ""}'
      f'{config.num_layers} layers: {_num_global(config)} global +'
      f' {config.num_layers - _num_global(config)} local of window {config.sliding_window},'
      f' embed {config.embed_dim}, {config.num_kv_heads} KV head(s) x {config.head_dim};'
      f' {"byte tokens" if byte_tokens else "its tokenizer"}) in {rest["dtype"]},'
      f' {rest["impl"]} kernels, on {jax.devices()[0].platform}; pages of {page_tokens} tokens'
      f' keeping {local} local-layer rows'
    ),
    'stored_tokens': largest['stored_tokens'] if largest else 0,
    'window_slots': window_slots,
    'access_latency_s': latency,
    'install_byte_exact': model.graft_target.chunk_invariant,
    'pages_stored': largest['pages'] if largest else 0,
    'page_tokens': page_tokens,
    'stored_over_window': (largest['stored_tokens'] / window_slots) if largest else 0.0,
    'bytes_on_disk': largest['disk']['bytes'] if largest else 0,
    'bytes_on_disk_per_token': (
      largest['disk']['bytes'] / largest['stored_tokens'] if largest else None
    ),
    'page_payload_bytes_per_token': pages.bytes_per_token(
      config, rest['dtype'], page_tokens, local_rows=rest['local_rows']
    )['page'],
    'device_bytes_in_use': in_use,
    'device_bytes_in_use_note': (
      'device.memory_stats() bytes_in_use while answering'
      if in_use is not None
      else f'device.memory_stats() is None on {jax.devices()[0].platform}: see live_array_bytes'
    ),
    'live_array_bytes': live,
    'access_largest_over_smallest': values[-1] / values[0] if values else None,
    'access_max_deviation_from_smallest': _deviation(values),
    'access_p10_s': fastest,
    'access_p10_max_deviation_from_smallest': _deviation(list(fastest.values())),
    'stage_median_s': {
      str(r['pages']): {
        stage: r[f'{stage}_median_s'] for stage in ('route', 'read_verify', 'install')
      }
      for r in rows
    },
    'top1_own_page': {str(r['pages']): r['top1_own_page'] for r in rows},
    'complete': [r['pages'] for r in rows] == sizes,
  }
  return {
    **results.header(
      'paging_scale',
      inputs={
        **results.model_inputs(model, rest['model_name']),
        'sha256_page_ids': plan.digest(),
      },
      command=command,
    ),
    'model': rest['model_name'],
    'model_config': {
      'num_layers': config.num_layers,
      'global_layers': _num_global(config),
      'sliding_window': config.sliding_window,
      'embed_dim': config.embed_dim,
      'num_kv_heads': config.num_kv_heads,
      'head_dim': config.head_dim,
      'vocab_size': config.vocab_size,
      'random_weights': byte_tokens,
    },
    'dtype': rest['dtype'],
    'impl': rest['impl'],
    'local_rows': rest['local_rows'],
    'tokenizer': 'one id per UTF-8 byte' if byte_tokens else 'the model tokenizer',
    'corpus': (
      f'Python sources of the interpreter that made the plan ({plan.made_with or "unrecorded"}):'
      ' stdlib incl. tests, then site-packages'
    ),
    'prefill_batch': rest['batch'],
    'store_dir': rest['store_dir'],
    'timing': 'medians of per-query wall times',
    'summary': summary,
    'rows': rows,
    'builds': rest['builds'],
    'plan_s': rest['plan_s'],
    'stored_pages_now': rest['stored_pages'],
    'seconds': rest['seconds'],
  }


def _deviation(values: list[float]) -> float | None:
  """The largest relative deviation from the first value (None for no values)."""
  return max(abs(v / values[0] - 1) for v in values) if values else None


def _num_global(config) -> int:
  return sum(config.window(i) is None for i in range(config.num_layers))


def format_rows(result: dict[str, Any]) -> str:
  """One line per measured size."""
  lines = []
  for r in result['rows']:
    memory = r['device_memory']
    in_use = (memory['memory_stats'] or {}).get('bytes_in_use')
    lines.append(
      f'{r["pages"]:>6} pages {r["stored_tokens"]:>10,} tokens  access'
      f' {r["access_median_s"] * 1e3:7.2f} ms (route {r["route_median_s"] * 1e3:.2f},'
      f' read+verify {r["read_verify_median_s"] * 1e3:.2f}, install'
      f' {r["install_median_s"] * 1e3:.2f})  top1 {r["top1_own_page"]:.2f}  disk'
      f' {r["disk"]["bytes"] / 2**20:,.1f} MiB  device in use'
      f' {"n/a" if in_use is None else f"{in_use / 2**20:,.1f} MiB"}, live arrays'
      f' {memory["live_array_bytes"] / 2**20:,.1f} MiB'
    )
  if not result['summary']['complete']:
    lines.append(f'incomplete: {result["stored_pages_now"]} pages stored; run again to resume')
  return '\n'.join(lines)
