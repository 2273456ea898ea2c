"""Time to first continuation token: graft a stored prefix vs recompute it.

The library of experiments/bench_graft.py. `experiment(...)` times, per prefix length, a
restore from the BlockStore by stage (read into reused host staging, pinned on a GPU, then
install: `graftjax.restore`) and a recompute by chunked prefill, sets the restore against
its floors (`restore_floor`: read + copy into the device, with and without SHA-256, and the
old pageable floor), and optionally runs llama.cpp's own state restore as the peer.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import blocks
from graftjax import ledger
from graftjax import restore as restore_lib
from graftjax import store as store_lib
from graftjax.models.gemma import gguf as gguf_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.store import manifest as store_manifest
from graftjax.studies.common import corpus
from graftjax.studies.graft import prefill_flops
from graftjax.studies.graft import restore_floor
from graftjax.studies.common import results

# llama.cpp's side of the comparison, run by another interpreter.
PEERS = pathlib.Path(__file__).resolve().parents[3] / 'experiments' / 'peers'


def long_text_ids(tokenizer, n: int) -> list[int]:
  """BOS + the first n tokens of standard-library sources, concatenated in sorted order."""
  ids = [tokenizer.bos_id] if hasattr(tokenizer, 'bos_id') else [2]
  for path in corpus.stdlib_files():
    ids += tokenizer.encode(path.read_text(encoding='utf-8', errors='replace'), add_bos=False)
    if len(ids) > n:
      return ids[: n + 1]  # n prefix tokens and the next one
  raise ValueError(f'the standard library holds fewer than {n} tokens')


def timed(fn, repeats: int, *, warmup: bool = True) -> tuple[float, list[float], object]:
  """Median seconds of `repeats` calls (after one warm-up call if `warmup`); the last result."""
  result = fn() if warmup else None
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - t0)
  return float(np.median(times)), times, result


class FirstToken:
  """A prefix of n tokens and the token after it, prefilled in chunks into a cache of capacity
  C (n + 1 rounded up to a chunk, plus a chunk): what a restore and a recompute both end with."""

  def __init__(self, model, ids: list[int], *, chunk_size: int):
    self.model, self.chunk_size = model, chunk_size
    self.n = len(ids) - 1
    self.prefix, self.next_token = ids[: self.n], ids[self.n]
    self.capacity = -(-(self.n + 1) // chunk_size) * chunk_size + chunk_size

  def logits(self, cache, model=None) -> jax.Array:
    """Logits of the next token (a 1-token query at position n) on `cache` (of `model`)."""
    return (model or self.model).forward(
      np.asarray([[self.next_token]]), np.asarray([[self.n]]), cache, logits='last'
    )[0]

  def prefill(self, model=None, chunk_size: int | None = None):
    """The prefix prefilled into a new cache by `model` (default: this run's) in chunks of
    `chunk_size` (default: this run's)."""
    model = model or self.model
    _, cache = model.prefill(
      self.prefix,
      cache=model.init_cache(capacity=self.capacity),
      chunk_size=chunk_size or self.chunk_size,
      logits='none',
    )
    return cache

  def capture(self) -> tuple[blocks.KVBlock, np.ndarray]:
    """The prefix's block and the next token's logits on the cache it came from."""
    cache = self.prefill()
    block = blocks.capture(
      cache,
      blocks.Span(0, self.n),
      token_ids=self.prefix,
      target=self.model.graft_target,
      chunk_size=self.chunk_size,
    )
    return block, np.asarray(self.logits(cache))

  def recompute(self, chunk_size: int | None = None) -> jax.Array:
    """New cache, prefill the prefix in chunks of `chunk_size` (default: this run's; at
    least n: in one call), forward the next token. A ring model takes chunks of that size.

    `capture` has compiled the prefill at this run's chunk size and capacity.
    """
    model = self.model
    if chunk_size and model.local_cache == 'ring':
      model = model.with_local_cache('ring', chunk_size=chunk_size)
    return self.logits(self.prefill(model, chunk_size), model).block_until_ready()

  def recompute_chunks(self, candidates: list[int]) -> list[int]:
    """The distinct chunk sizes `candidates` name for this prefix (0 or n and more: the
    whole prefix in one call, n); this run's if none."""
    sizes = [min(c, self.n) if c else self.n for c in candidates] or [self.chunk_size]
    return list(dict.fromkeys(min(c, self.n) for c in sizes))

  def restore_fn(self, read, install, stages: dict[str, list[float]]):
    """A call that reads (`read()`), makes a new cache, installs (`install(cache, got)`) and
    forwards the next token, appending each stage's seconds to `stages` (4 names, in order)."""

    def restore():
      t0 = time.perf_counter()
      got = read()
      t1 = time.perf_counter()
      cache = jax.block_until_ready(self.model.init_cache(capacity=self.capacity))
      t2 = time.perf_counter()
      cache = jax.block_until_ready(install(cache, got))
      t3 = time.perf_counter()
      logits = self.logits(cache).block_until_ready()
      t4 = time.perf_counter()
      for name, dt in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        stages[name].append(dt)
      return logits

    return restore


def over_lengths(model, ids: list[int], lengths: list[int], bench, *, desc: str, **kwargs):
  """`bench(model, store, ids[: n + 1], **kwargs)` for every n, on a fresh temporary BlockStore."""
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    return [bench(model, store, ids[: n + 1], **kwargs) for n in tqdm.tqdm(lengths, desc=desc)]


def load(
  model_name: str, dtype: str, longest: int, *, local_cache: str = 'full', chunk_size: int = 0
):
  """The named model (its sliding-window layers cached `local_cache`, a 'ring' taking chunks
  of `chunk_size`) and `long_text_ids` of its tokenizer."""
  model = gemma_model.load_named(model_name, dtype=jnp.dtype(dtype))
  if local_cache != 'full':
    model = model.with_local_cache(local_cache, chunk_size=chunk_size)
  return model, long_text_ids(model.tokenizer, longest)


def bench_one(
  model,
  store,
  ids: list[int],
  *,
  chunk_size: int,
  repeats: int,
  recompute_max: int,
  recompute_repeats: int | None = None,
  recompute_chunks: tuple[int, ...] = (),
) -> dict:
  run = FirstToken(model, ids, chunk_size=chunk_size)
  n, capacity = run.n, run.capacity
  block, reference = run.capture()
  key = store.put(block)
  block_bytes = sum(a.nbytes for a in block.arrays().values())
  del block

  staging = restore_lib.Staging()  # reused by every timed restore: made in the warm-up
  read = lambda: restore_lib.read(store, key, staging, capacity=capacity)
  install = lambda cache, got: restore_lib.install(
    cache, got, target=model.graft_target, chunk_size=chunk_size, donate=True
  )
  stages = {'read_s': [], 'new_cache_s': [], 'install_s': [], 'first_forward_s': []}
  inside = {'read_s': [], 'copy_dispatch_s': [], 'install_s': []}  # Staging.timings

  def install_timed(cache, got):
    cache = install(cache, got)
    for name, values in inside.items():
      values.append(staging.timings[name])
    return cache

  graft_s, graft_times, logits = timed(run.restore_fn(read, install_timed, stages), repeats)
  medians = {k: float(np.median(v[1:])) for k, v in stages.items()}  # [0] is the warm-up
  restores = [a + b for a, b in zip(stages['read_s'][1:], stages['install_s'][1:])]
  # Each timed restore read a manifest parsed before (by `put`): one more whose manifest
  # this process has not parsed, as a block's first read pays.
  store_manifest.forget_parsed()
  first = {name: [] for name in stages}
  run.restore_fn(read, install, first)()
  floor = restore_floor.measure(pathlib.Path(store.root) / key, repeats=max(3, repeats))

  def restore_stages_once() -> dict[str, float]:
    cache = jax.block_until_ready(model.init_cache(capacity=capacity))  # untimed, as above
    t0 = time.perf_counter()
    got = read()
    t1 = time.perf_counter()
    jax.block_until_ready(install(cache, got))
    return {'read': t1 - t0, 'install': time.perf_counter() - t1}

  side = restore_floor.side_by_side(
    pathlib.Path(store.root) / key, restore_stages_once, repeats=max(3, repeats)
  )
  restore_s = medians['read_s'] + medians['install_s']
  first_read_s = first['read_s'][0] + first['install_s'][0]
  row = {
    **restore_stages(floor, {k: float(np.median(v[1:])) for k, v in inside.items()}),
    'prefix_tokens': n,
    'capacity': capacity,
    'block_bytes': block_bytes,
    'graft_first_token_s': graft_s,
    'graft_times_s': graft_times,
    'graft_stages_median_s': medians,
    'restore_s': restore_s,
    'staging_memory': staging.memory,
    'restore_copy_bytes': restore_lib.COPY_BYTES,
    'graft_logits_equal_recompute': bool(np.asarray(logits).tobytes() == reference.tobytes()),
    'floor': floor,
    'floor_s': floor['floor_s'],
    'restore_over_floor': restore_s / floor['floor_s'],
    'restore_best_s': min(restores),
    'restore_best_over_floor': min(restores) / floor['floor_s'],
    'restore_over_verified_floor': restore_s / floor['verified_floor_s'],
    'restore_over_floor_pageable': restore_s / floor['floor_pageable_s'],
    'side_by_side': side,
    'restore_over_floor_side_by_side': side['restore_over_floor'],
    'restore_first_read_s': first_read_s,
    'restore_first_read_over_floor': first_read_s / floor['floor_s'],
  }
  if n <= recompute_max:
    row.update(recompute(run, recompute_chunks, recompute_repeats or repeats))
    row['speedup'] = row['recompute_first_token_s'] / graft_s
    row['graft_over_recompute'] = graft_s / row['recompute_first_token_s']
  else:
    row['recompute_first_token_s'] = None
    row['recompute_not_run'] = f'prefix longer than --recompute_max={recompute_max}'
  store.delete(key)
  return row


def recompute(run: FirstToken, candidates: tuple[int, ...], repeats: int) -> dict:
  """The recompute at each chunk size `run.recompute_chunks(candidates)` names (median of
  `repeats` after one warm-up that compiles, none for the run's own size), the fastest
  taken as the recompute; its prefill rate and model FLOPs (`prefill_flops`: the prefix,
  then the next token with its logits) per second."""
  sweep = []
  for chunk in run.recompute_chunks(list(candidates)):
    warmup = chunk != run.chunk_size  # the capture compiled the run's own
    median_s, times, _ = timed(lambda c=chunk: run.recompute(c), repeats, warmup=warmup)
    sweep.append(
      {'chunk_size': chunk, 'one_call': chunk >= run.n, 'median_s': median_s, 'times_s': times}
    )
  best = min(sweep, key=lambda r: r['median_s'])
  config = run.model.config
  flops = prefill_flops.prefill_flops(config, run.n) + prefill_flops.prefill_flops(
    config, 1, start=run.n, logits_tokens=1
  )
  return {
    'recompute_first_token_s': best['median_s'],
    'recompute_times_s': best['times_s'],
    'recompute_chunk_size': best['chunk_size'],
    'recompute_sweep': sweep,
    'recompute_impl': config.impl_of('attention'),
    'prefill_tokens_per_s': run.n / best['median_s'],
    'model_flops': flops,
    'model_flops_per_s': flops / best['median_s'],
  }


def restore_stages(floor: dict, inside: dict[str, float]) -> dict:
  """The floor's stages and the restore's, side by side (seconds): `stages_s`."""
  return {
    'stages_s': {
      'floor_read': floor['read_s'],
      'floor_copy': floor['copy_s'],
      'hash': floor['hash_s'],
      'verified_read': floor['verified_read_s'],
      'restore_read': inside['read_s'],
      'restore_copy_dispatch': inside['copy_dispatch_s'],
      'restore_install': inside['install_s'],
    }
  }


def llamacpp_peer(python: str, prefixes: list[list[int]], next_token: int) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    request = pathlib.Path(tmp) / 'tokens.json'
    request.write_text(json.dumps({'prefixes': prefixes, 'next_token': next_token}))
    script = PEERS / 'llamacpp_restore.py'
    proc = subprocess.run(
      [python, str(script), str(gguf_lib.locate_gguf()), str(request), str(os.cpu_count())],
      capture_output=True,
      text=True,
      check=False,
    )
  if proc.returncode:
    raise RuntimeError(f'llama.cpp peer failed:\n{proc.stderr[-3000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def experiment(
  *,
  model_name: str,
  dtype: str,
  lengths: list[int],
  chunk_size: int,
  repeats: int,
  recompute_max: int,
  llamacpp_python: str | None,
  recompute_repeats: int | None = None,
  local_cache: str = 'full',
  recompute_chunks: tuple[int, ...] = (),
) -> dict:
  """Graft vs recompute for every prefix length (and llama.cpp's restore); the result.

  `local_cache='ring'` keeps sliding-window layers in window-sized rings (the block still
  holds every layer's rows of the span; a ring layer's older ones are zero).
  """
  model, ids = load(model_name, dtype, max(lengths), local_cache=local_cache, chunk_size=chunk_size)
  rows = over_lengths(
    model,
    ids,
    lengths,
    bench_one,
    desc='prefix lengths',
    chunk_size=chunk_size,
    repeats=repeats,
    recompute_max=recompute_max,
    recompute_repeats=recompute_repeats,
    recompute_chunks=tuple(recompute_chunks),
  )
  device = jax.devices()[0]
  peak, no_peak = prefill_flops.peak_flops(device.device_kind, device.platform)
  for row in rows:
    if 'model_flops_per_s' in row:
      row['mfu'] = None if peak is None else row['model_flops_per_s'] / peak
  inputs = {
    **results.model_inputs(model, model_name),
    'sha256_prefix_ids': ledger.sha256_tokens(ids[:-1]),
  }
  result = {
    **results.header('bench_graft', inputs=inputs),
    'model': model_name,
    'dtype': dtype,
    'chunk_size': chunk_size,
    'local_cache': local_cache,
    'recompute_chunks': list(recompute_chunks),
    'bf16_dense_peak_flops': peak,
    'mfu_note': no_peak
    or 'model FLOPs (prefill_flops.py) of the fastest recompute over the dense bfloat16 peak',
    'rows': rows,
  }
  if llamacpp_python:
    peer = llamacpp_peer(llamacpp_python, [ids[:n] for n in lengths], ids[max(lengths)])
    result['llamacpp'] = peer
    for row, p in zip(rows, peer['results']):
      row['llamacpp_load_file_s'] = p['load_file_s']
      row['llamacpp_restore_first_token_s'] = p['restore_and_first_token_s']
      row['llamacpp_prefill_first_token_s'] = p['prefill_and_first_token_s']
      row['llamacpp_state_file_bytes'] = p['state_file_bytes']
      # Same prefix tokens on both sides, so per-token ratios are plain ratios.
      row['restore_over_llamacpp_load'] = row['restore_s'] / p['load_file_s']
      row['graft_over_llamacpp_restore_first_token'] = (
        row['graft_first_token_s'] / p['restore_and_first_token_s']
      )
  return result


def format_rows(result: dict) -> str:
  """One line per prefix length: graft against recompute, block bytes, restore against its
  floor, llama.cpp."""
  nan = float('nan')
  lines = []
  for row in result['rows']:
    mfu = row.get('mfu')
    lines.append(
      f'N={row["prefix_tokens"]:>6}  graft {row["graft_first_token_s"]:.3f}s'
      f' / recompute {row["recompute_first_token_s"] or nan:.3f}s'
      f' = {row.get("graft_over_recompute", nan):.3f}'
      f' (chunk {row.get("recompute_chunk_size")},'
      f' MFU {"n/a" if mfu is None else f"{mfu:.1%}"})'
      f'  block {row["block_bytes"] / 1e9:.3f} GB'
      f'  restore {row["restore_s"]:.3f}s = {row["restore_over_floor"]:.2f}x'
      f' its floor {row["floor_s"]:.3f}s (best {row.get("restore_best_over_floor", nan):.2f}x,'
      f' first read {row.get("restore_first_read_over_floor", nan):.2f}x;'
      f' side by side {row.get("restore_over_floor_side_by_side", nan):.2f}x)'
      f'  llama.cpp restore {row.get("llamacpp_restore_first_token_s", nan):.3f}s'
    )
  return '\n'.join(lines)
