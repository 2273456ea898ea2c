r"""Page-in against re-prefill for blocks of 128 to 8k tokens (issue 13, items 2 and 6).

    python experiments/bench_paging_pagein.py --tokens=128,256,512,1024,2048,4096,8192 \
        --out=experiments/results/paging_pagein_cpu.json

For each block size n (real text: standard-library sources, concatenated):
the block is prefilled in chunks of `--chunk_size` into a cache of capacity
C (n + 1 rounded up to a chunk, plus a chunk), captured, cut to a page
(`graftjax.paging.pages.to_page`: global layers whole, local layers' last
W - 1 rows) and stored in a file BlockStore; then, timed,
  page_in    read + verify the page, make a new cache, install it, forward
             the next token (1-token query at position n);
  recompute  make a new cache, prefill the n tokens in the same chunks,
             forward the same query.
Both paths' query logits are asserted byte-equal (SHA-256 of their bytes)
to each other and to the query run on the cache the block came from. The
costs give `graftjax.paging.policy.Policy` and its crossover. Bytes per
token are measured on disk (chunk files of the stored page and of the
plain block) and computed from the config, against llama.cpp's state file
(`--llamacpp_result`, the committed bench_graft_cpu.json). Timings are
medians of `--repeats` runs after a warm-up (recompute: `--recompute_repeats`
at n >= 2048) on a CPU shared with other work.
"""

from graftjax import determinism

determinism.pin()

import hashlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import os
import pathlib
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from graftjax import blocks
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.paging import pages
from graftjax.paging import policy as policy_lib
from graftjax.studies import cli
from graftjax.studies import corpus
from graftjax.studies import results

_MODEL = flags.DEFINE_enum('model', 'gemma3-270m', ['gemma3-270m', 'tiny'], 'Model.')
_TOKENS = flags.DEFINE_list(
  'tokens', ['128', '256', '512', '1024', '2048', '4096', '8192'], 'Block sizes.'
)
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 512, 'Prefill chunk (both paths).')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats (median reported).')
_RECOMPUTE_REPEATS = flags.DEFINE_integer(
  'recompute_repeats', 1, 'Timed recompute repeats at n >= 2048 (slow on CPU).'
)
_LLAMACPP_RESULT = flags.DEFINE_string(
  'llamacpp_result',
  'experiments/results/bench_graft_cpu.json',
  "bench_graft result holding llama.cpp's state file sizes.",
)
_OUT = flags.DEFINE_string('out', 'experiments/results/paging_pagein.json', 'Result JSON.')


def text_ids(tokenizer, n: int) -> list[int]:
  """BOS + the first n tokens of standard-library sources, concatenated in sorted order."""
  ids = [2]
  for path in corpus.stdlib_files():
    ids += tokenizer.encode(path.read_text(encoding='utf-8', errors='replace'), add_bos=False)
    if len(ids) > n:
      return ids[: n + 1]
  raise ValueError(f'the standard library holds fewer than {n} tokens')


def timed(fn, repeats: int):
  """(median seconds of `repeats` calls after a warm-up, their times, last result)."""
  result = fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - t0)
  return float(np.median(times)), times, result


def chunk_bytes(root: str, key: str) -> int:
  """Bytes of a stored block's chunk files (its payload, no metadata)."""
  total = 0
  for directory, _, files in os.walk(os.path.join(root, key)):
    if f'{os.sep}c' in directory[len(os.path.join(root, key)) :]:
      total += sum(os.path.getsize(os.path.join(directory, f)) for f in files)
  return total


def tree_bytes(root: str, key: str) -> int:
  return sum(
    os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(root, key)) for f in fs
  )


def sha(logits) -> str:
  return hashlib.sha256(np.asarray(logits).tobytes()).hexdigest()


def bench_one(model, store, ids, *, chunk_size: int, repeats: int, recompute_repeats: int) -> dict:
  n = len(ids) - 1
  prefix, query = ids[:n], ids[n]
  capacity = -(-(n + 1) // chunk_size) * chunk_size + chunk_size
  first = lambda cache: model.forward(
    np.asarray([[query]]), np.asarray([[n]]), cache, logits='last'
  )[0]
  _, cache = model.prefill(
    prefix, cache=model.init_cache(capacity=capacity), chunk_size=chunk_size, logits='none'
  )
  block = blocks.capture(cache, blocks.Span(0, n), token_ids=prefix, target=model.graft_target)
  reference = sha(first(cache))
  del cache
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

  stages = {'read_verify_s': [], 'new_cache_s': [], 'install_s': [], 'first_forward_s': []}

  def page_in_fn():
    t0 = time.perf_counter()
    got = pages.get(store, key)
    t1 = time.perf_counter()
    cache = jax.block_until_ready(model.init_cache(capacity=capacity))
    t2 = time.perf_counter()
    cache = jax.block_until_ready(
      pages.install(cache, got, target=model.graft_target, config=model.config, donate=True)
    )
    t3 = time.perf_counter()
    logits = first(cache).block_until_ready()
    t4 = time.perf_counter()
    for name, dt in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
      stages[name].append(dt)
    return logits

  def recompute_fn():
    cache = model.init_cache(capacity=capacity)
    _, cache = model.prefill(prefix, cache=cache, chunk_size=chunk_size, logits='none')
    return first(cache).block_until_ready()

  page_in_s, page_in_times, page_logits = timed(page_in_fn, repeats)
  recompute_s, recompute_times, recompute_logits = timed(
    recompute_fn, repeats if n < 2048 else recompute_repeats
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
  """Prefix tokens -> llama.cpp state file bytes, from a committed bench_graft result."""
  try:
    body = json.loads(pathlib.Path(path).read_text())
  except FileNotFoundError:
    return {}
  return {r['prefix_tokens']: r['state_file_bytes'] for r in body['llamacpp']['results']}


def run(
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
  model = gemma_model.load_named(model_name, dtype=jnp.dtype(dtype))
  tokenizer = model.tokenizer or corpus.ByteTokenizer(model.config.vocab_size)
  ids = text_ids(tokenizer, max(sizes))
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    store = store_lib.BlockStore(pathlib.Path(tmp) / 'store')
    for n in tqdm.tqdm(sizes, desc='block sizes'):
      rows.append(
        bench_one(
          model,
          store,
          ids[: n + 1],
          chunk_size=chunk_size,
          repeats=repeats,
          recompute_repeats=recompute_repeats,
        )
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
    'model_fingerprint': model.fingerprint,
    'sha256_ids': ledger.sha256_tokens(ids[:-1]),
  }
  if llama:
    inputs['llamacpp_result_sha256'] = ledger.sha256_file(llamacpp_result)
  return {
    **results.header('bench_paging_pagein', inputs=inputs, command=command),
    'model': model_name,
    'dtype': dtype,
    'chunk_size': chunk_size,
    'timing': 'medians of wall times on a CPU shared with other work',
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  result = run(
    model_name=_MODEL.value,
    dtype=_DTYPE.value,
    sizes=[int(x) for x in _TOKENS.value],
    chunk_size=_CHUNK_SIZE.value,
    repeats=_REPEATS.value,
    recompute_repeats=_RECOMPUTE_REPEATS.value,
    llamacpp_result=_LLAMACPP_RESULT.value,
  )
  for row in result['rows']:
    print(
      f'n={row["tokens"]:>5}  page-in {row["page_in_s"]:.3f}s  recompute {row["recompute_s"]:.3f}s'
      f'  page {row["page_bytes_per_token"]:.0f} B/token vs block'
      f' {row["block_bytes_per_token"]:.0f} B/token on disk'
    )
  print(f'crossover: {result["summary"]["crossover_tokens"]} tokens')
  results.write(_OUT.value, result)


if __name__ == '__main__':
  cli.run(main)
