"""Page-in against re-prefill for blocks of 128 to 8k tokens.

The library of experiments/bench_paging_pagein.py. `experiment(...)` times, per block
size, reading a stored page (into reused host staging, `graftjax.restore`) and installing
it against prefilling the block again (both ending with the same next-token query, whose
logits must be byte-equal), measures bytes per token on disk and from the config against
llama.cpp's state file, and fits the page-in / recompute `Policy`. The prefix, the timing and the temporary store are
`bench_graft`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import jax
import numpy as np

from graftjax import ledger
from graftjax import restore as restore_lib
from graftjax.paging import pages
from graftjax.paging import policy as policy_lib
from graftjax.store import manifest as store_manifest
from graftjax.studies.graft import bench_graft
from graftjax.studies.common import results


def chunk_bytes(root: str, key: str) -> int:
  """Bytes of a stored block's chunk files (its payload: every file but the metadata)."""
  metadata = ('zarr.json', store_manifest.MANIFEST)
  return sum(
    os.path.getsize(os.path.join(d, f))
    for d, _, fs in os.walk(os.path.join(root, key))
    for f in fs
    if f not in metadata
  )


def tree_bytes(root: str, key: str) -> int:
  """Bytes of every file of a stored block (payload and metadata)."""
  return sum(
    os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(root, key)) for f in fs
  )


def sha(logits) -> str:
  return hashlib.sha256(np.asarray(logits).tobytes()).hexdigest()


def _install_page(model, cache, staged: restore_lib.Staged, *, chunk_size: int):
  """`pages.install` of a staged page: its checks, then the staged install."""
  return restore_lib.install(
    cache,
    staged,
    target=model.graft_target,
    config=model.config,
    chunk_size=chunk_size,
    donate=True,
  )


def bench_one(model, store, ids, *, chunk_size: int, repeats: int, recompute_repeats: int) -> dict:
  """Page-in and recompute of the block ids[:-1], then the query ids[-1]; the row."""
  run = bench_graft.FirstToken(model, ids, chunk_size=chunk_size)
  n, capacity = run.n, run.capacity
  block, reference = run.capture()
  reference = sha(reference)
  page = pages.to_page(block, model.config)
  key = pages.put(store, page)
  block_key = store.put(block)
  sizes = {
    'page_chunk_bytes': chunk_bytes(store.root, key),
    'page_dir_bytes': tree_bytes(store.root, key),
    'block_chunk_bytes': chunk_bytes(store.root, block_key),
    'block_dir_bytes': tree_bytes(store.root, block_key),
  }
  if block_key != key:  # n <= W - 1: nothing to trim, the page is the block
    store.delete(block_key)
  del block, page

  staging = restore_lib.Staging()  # reused by every timed page-in: made in the warm-up
  stages = {'read_verify_s': [], 'new_cache_s': [], 'install_s': [], 'first_forward_s': []}
  page_in_fn = run.restore_fn(
    lambda: restore_lib.read(store, key, staging, capacity=capacity),
    lambda cache, got: _install_page(model, cache, got, chunk_size=chunk_size),
    stages,
  )
  page_in_s, page_in_times, page_logits = bench_graft.timed(page_in_fn, repeats)
  recompute_s, recompute_times, recompute_logits = bench_graft.timed(
    run.recompute, repeats if n < 2048 else recompute_repeats, warmup=False
  )
  digests = {
    'reference': reference,
    'page_in': sha(page_logits),
    'recompute': sha(recompute_logits),
  }
  if len(set(digests.values())) != 1:
    raise AssertionError(f'n={n}: query logits differ between paths: {digests}')
  store.delete(key)
  return {
    'tokens': n,
    'capacity': capacity,
    'page_in_s': page_in_s,
    'page_in_times_s': page_in_times,
    'page_in_stages_median_s': {k: float(np.median(v[1:])) for k, v in stages.items()},
    'recompute_s': recompute_s,
    'recompute_times_s': recompute_times,
    'query_logits_sha256': reference,
    'query_logits_byte_equal': True,
    **sizes,
    'page_bytes_per_token': sizes['page_chunk_bytes'] / n,
    'block_bytes_per_token': sizes['block_chunk_bytes'] / n,
  }


def llamacpp_sizes(path: str) -> dict[int, int]:
  """Prefix tokens -> llama.cpp state file bytes, from a bench_graft result ({} if none ran)."""
  try:
    body = json.loads(pathlib.Path(path).read_text())
  except FileNotFoundError:
    return {}
  peer = body.get('llamacpp', {'results': []})
  return {r['prefix_tokens']: r['state_file_bytes'] for r in peer['results']}


def experiment(
  *,
  model_name: str,
  dtype: str,
  sizes: list[int],
  chunk_size: int,
  repeats: int,
  recompute_repeats: int,
  llamacpp_result: str,
  command: str | None = None,
) -> dict:
  """Page-in vs recompute at every block size, bytes per token, the policy; the result."""
  model, ids = bench_graft.load(model_name, dtype, max(sizes))
  rows = bench_graft.over_lengths(
    model,
    ids,
    sizes,
    bench_one,
    desc='block sizes',
    chunk_size=chunk_size,
    repeats=repeats,
    recompute_repeats=recompute_repeats,
  )
  policy = policy_lib.Policy.from_rows(rows)
  config = model.config
  computed = {
    d: {
      'asymptote': pages.bytes_per_token(config, d),
      **{str(n): pages.bytes_per_token(config, d, n) for n in sizes},
    }
    for d in ('float32', 'bfloat16')
  }
  llama = llamacpp_sizes(llamacpp_result)
  versus_llamacpp = {}
  for n, state_bytes in sorted(llama.items()):
    entry = {'llamacpp_state_file_bytes': state_bytes}
    for d in ('float32', 'bfloat16'):
      per = pages.bytes_per_token(config, d, n)
      entry[f'block_{d}_bytes'] = per['block'] * n
      entry[f'page_{d}_bytes'] = per['page'] * n
      entry[f'block_{d}_over_llamacpp'] = per['block'] * n / state_bytes
      entry[f'page_{d}_over_llamacpp'] = per['page'] * n / state_bytes
    versus_llamacpp[str(n)] = entry
  inputs = {
    **results.model_inputs(model, model_name),
    'sha256_ids': ledger.sha256_tokens(ids[:-1]),
  }
  if llama:
    inputs['llamacpp_result_sha256'] = ledger.sha256_file(llamacpp_result)
  return {
    **results.header('bench_paging_pagein', inputs=inputs, command=command),
    'model': model_name,
    'dtype': dtype,
    'chunk_size': chunk_size,
    'timing': 'medians of wall times'
    + (' on a CPU shared with other work' if jax.default_backend() == 'cpu' else ''),
    'summary': {
      'crossover_tokens': policy.crossover_tokens,
      'choice': {str(n): policy.choose(n) for n in sizes},
      'page_in_s': {str(r['tokens']): r['page_in_s'] for r in rows},
      'recompute_s': {str(r['tokens']): r['recompute_s'] for r in rows},
      'all_query_logits_byte_equal': all(r['query_logits_byte_equal'] for r in rows),
    },
    'policy': policy.to_json(),
    'bytes_per_token_computed': computed,
    'versus_llamacpp_state_file': versus_llamacpp,
    'rows': rows,
  }


def format_rows(result: dict) -> str:
  """One line per block size (page-in, recompute, bytes per token on disk) and the crossover."""
  lines = [
    f'n={row["tokens"]:>5}  page-in {row["page_in_s"]:.3f}s  recompute {row["recompute_s"]:.3f}s'
    f'  page {row["page_bytes_per_token"]:.0f} B/token vs block'
    f' {row["block_bytes_per_token"]:.0f} B/token on disk'
    for row in result['rows']
  ]
  return '\n'.join(lines + [f'crossover: {result["summary"]["crossover_tokens"]} tokens'])
