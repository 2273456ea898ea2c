"""Our float32 gemma-3-270m against HF transformers and llama.cpp.

The library of experiments/reference_agreement.py. `compare(...)` runs fixture prompts
through the model (fixed padded chunks, then greedy decoding) and compares with the fixtures
of tests/fixtures/: against HF, max |Δlogit| over its top-20, log-sum-exp and greedy
agreement; against llama.cpp, top-1 agreement and pooled |Δlogit|. `experiment(...)` loads
the model and both fixtures and adds the result header.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import json
import pathlib
import time
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from graftjax import ledger
from graftjax.models import cache as cache_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.studies.common import results

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
HF_FIXTURE = REPO_ROOT / 'tests' / 'fixtures' / 'hf_reference.json'
LLAMACPP_FIXTURE = REPO_ROOT / 'tests' / 'fixtures' / 'llamacpp_reference.json'

LOGIT_TOLERANCE = 2e-3  # max |Δlogit| against HF, and the greedy margin cut-off.
LLAMACPP_TOP1_MIN = 0.93  # top-1 agreement with llama.cpp over all positions.
CAPACITY = 2048  # cache slots: the longest prompt, padded, plus the greedy steps.


def load_fixture(path: pathlib.Path | str = HF_FIXTURE) -> dict[str, Any]:
  return json.loads(pathlib.Path(path).read_text(encoding='utf-8'))


@dataclasses.dataclass(frozen=True)
class PromptRun:
  """Our model's logits on one prompt, reduced to what the fixtures compare.

  Attributes:
    argmax: [T] argmax id at every position.
    lse: [T] float64 log-sum-exp of the float32 logits over the vocabulary.
    gathered: name -> [P, k] float32 logits at requested (position, ids).
    greedy_ids: greedy continuation token ids.
    greedy_margins: float32 top-1 minus top-2 logit at each greedy step.
  """

  argmax: np.ndarray
  lse: np.ndarray
  gathered: dict[str, np.ndarray]
  greedy_ids: list[int]
  greedy_margins: list[float]


def _log_sum_exp(logits: np.ndarray) -> np.ndarray:
  """[..., V] float32 -> [...] float64 log-sum-exp."""
  x = logits.astype(np.float64)
  top = x.max(axis=-1, keepdims=True)
  return (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))[..., 0]


def _top2_margin(logits: np.ndarray) -> float:
  first, second = np.partition(logits, -2)[-2:][::-1]
  return float(np.float32(first) - np.float32(second))


def _drop_slots_from(cache: cache_lib.KVCache, length: int) -> cache_lib.KVCache:
  """The cache as if only its first `length` slots had been written."""
  slots = jnp.arange(cache.capacity)[None, :]
  positions = jnp.where(slots < length, cache.positions, cache_lib.EMPTY_POSITION)
  return cache.replace(positions=positions, length=jnp.asarray(length, jnp.int32))


def run_prompt(
  model: gemma_model.Gemma,
  token_ids: Sequence[int],
  *,
  requests: dict[str, tuple[Sequence[int], Sequence[Sequence[int]]]],
  chunk_size: int,
  greedy_steps: int,
  capacity: int = CAPACITY,
) -> PromptRun:
  """Prefills `token_ids` in padded chunks, then decodes greedily.

  Args:
    model: the model (batch 1 is used).
    token_ids: [T] prompt ids, BOS included.
    requests: name -> (positions [P], ids [P, k]): logits to gather.
    chunk_size: tokens per prefill call; the last chunk is padded.
    greedy_steps: tokens of greedy continuation.
    capacity: cache slots.
  """
  ids = np.asarray(token_ids, np.int32)
  length = ids.size
  padded = -(-length // chunk_size) * chunk_size
  if max(padded, length + greedy_steps) > capacity:
    raise ValueError(f'{length} tokens (+{greedy_steps}) do not fit capacity {capacity}')
  tokens = np.full(padded, model.config.pad_id, np.int32)
  tokens[:length] = ids
  wanted = {
    name: (np.asarray(pos, np.int64), np.asarray(top, np.int64))
    for name, (pos, top) in requests.items()
  }
  gathered = {name: np.zeros(top.shape, np.float32) for name, (_, top) in wanted.items()}
  argmax, lse = [], []
  cache = model.init_cache(batch_size=1, capacity=capacity)
  for begin in range(0, padded, chunk_size):
    positions = np.arange(begin, begin + chunk_size, dtype=np.int32)
    logits, cache = model.forward(tokens[None, begin : begin + chunk_size], positions[None], cache)
    logits = np.asarray(logits[0, : max(0, min(chunk_size, length - begin))])  # [C, V]
    argmax.append(logits.argmax(axis=-1))
    lse.append(_log_sum_exp(logits))
    for name, (pos, top) in wanted.items():
      rows = np.nonzero((pos >= begin) & (pos < begin + logits.shape[0]))[0]
      gathered[name][rows] = np.take_along_axis(logits[pos[rows] - begin], top[rows], axis=1)
    if begin + chunk_size >= length:
      last = logits[-1]
  cache = _drop_slots_from(cache, length)
  greedy_ids, greedy_margins = [], []
  for step in range(greedy_steps):
    token = int(last.argmax())
    greedy_ids.append(token)
    greedy_margins.append(_top2_margin(last))
    if step + 1 < greedy_steps:
      logits, cache = model.forward(
        np.array([[token]], np.int32), np.array([[length + step]], np.int32), cache
      )
      last = np.asarray(logits[0, -1])
  return PromptRun(
    argmax=np.concatenate(argmax),
    lse=np.concatenate(lse),
    gathered=gathered,
    greedy_ids=greedy_ids,
    greedy_margins=greedy_margins,
  )


def _topk_request(record: dict[str, Any]):
  return record['topk']['positions'], record['topk']['ids']


def compare_with_hf(
  run: PromptRun, record: dict[str, Any], *, tolerance: float = LOGIT_TOLERANCE
) -> dict[str, Any]:
  """Our logits against HF's on one prompt."""
  ours = run.gathered['hf'].astype(np.float64)
  theirs = np.asarray(record['topk']['logits'], np.float32).astype(np.float64)
  topk_diff = np.abs(ours - theirs)
  lse_diff = np.abs(run.lse - np.asarray(record['lse'], np.float64))
  hf_ids = record['greedy']['token_ids']
  low = [i for i, m in enumerate(record['greedy']['margins']) if m < tolerance]
  checked = low[0] if low else len(hf_ids)
  same = 0
  while same < len(hf_ids) and run.greedy_ids[same] == hf_ids[same]:
    same += 1
  return {
    'tokens': len(record['token_ids']),
    'topk_max_abs_diff': float(topk_diff.max()),
    'topk_mean_abs_diff': float(topk_diff.mean()),
    'lse_max_abs_diff': float(lse_diff.max()),
    'argmax_agreement': float(np.mean(run.argmax == np.asarray(record['argmax']))),
    'greedy_steps_checked': checked,
    'greedy_equal_prefix': same,
    'greedy_ok': same >= checked,
    'within_tolerance': bool(topk_diff.max() <= tolerance and lse_diff.max() <= tolerance),
  }


def compare_with_llamacpp(run: PromptRun, record: dict[str, Any]) -> dict[str, Any]:
  """Our logits against llama.cpp's on one prompt (raw figures, pooled later)."""
  diff = np.abs(
    run.gathered['llamacpp'].astype(np.float64)
    - np.asarray(record['topk']['logits'], np.float32).astype(np.float64)
  )
  top1_equal = run.argmax == np.asarray(record['top1'])
  return {
    'tokens': int(top1_equal.size),
    'top1_agreement': float(top1_equal.mean()),
    'topk_mean_abs_diff': float(diff.mean()),
    'topk_p99_abs_diff': float(np.percentile(diff, 99)),
    'topk_max_abs_diff': float(diff.max()),
    '_top1_equal': top1_equal,
    '_abs_diff': diff.ravel(),
  }


def summarize(hf_rows: list[dict], llama_rows: list[dict]) -> dict[str, Any]:
  """Overall figures: worst case against HF, pooled figures against llama.cpp."""
  top1 = np.concatenate([r['_top1_equal'] for r in llama_rows])
  diffs = np.concatenate([r['_abs_diff'] for r in llama_rows])
  return {
    'hf': {
      'prompts': len(hf_rows),
      'tokens': sum(r['tokens'] for r in hf_rows),
      'topk_max_abs_diff': max(r['topk_max_abs_diff'] for r in hf_rows),
      'lse_max_abs_diff': max(r['lse_max_abs_diff'] for r in hf_rows),
      'argmax_agreement': float(
        np.mean(np.concatenate([[r['argmax_agreement']] * r['tokens'] for r in hf_rows]))
      ),
      'greedy_ok': sum(r['greedy_ok'] for r in hf_rows),
      'within_tolerance': sum(r['within_tolerance'] for r in hf_rows),
      'tolerance': LOGIT_TOLERANCE,
    },
    'llamacpp': {
      'prompts': len(llama_rows),
      'tokens': int(top1.size),
      'top1_agreement': float(top1.mean()),
      'top1_min_required': LLAMACPP_TOP1_MIN,
      'topk_mean_abs_diff': float(diffs.mean()),
      'topk_p99_abs_diff': float(np.percentile(diffs, 99)),
      'topk_max_abs_diff': float(diffs.max()),
    },
  }


def progress_line(name: str, row: dict[str, Any]) -> str:
  """One prompt's figures (a row of `compare(...)['prompts']`) on one line."""
  return (
    f'{name}: {row["hf"]["tokens"]} tokens, HF max|Δ| {row["hf"]["topk_max_abs_diff"]:.2e}'
    f' (lse {row["hf"]["lse_max_abs_diff"]:.2e}), greedy'
    f' {row["hf"]["greedy_equal_prefix"]}/{row["hf"]["greedy_steps_checked"]},'
    f' llama.cpp top-1 {100 * row["llamacpp"]["top1_agreement"]:.1f}%'
    f' ({row["seconds"]:.0f}s)'
  )


def compare(
  model: gemma_model.Gemma,
  *,
  hf_fixture: dict[str, Any],
  llamacpp_fixture: dict[str, Any],
  prompt_names: Sequence[str] | None = None,
  chunk_size: int = 128,
  progress=None,
) -> dict[str, Any]:
  """Runs the chosen fixture prompts; returns per-prompt and overall figures."""
  llama_by_name = {p['name']: p for p in llamacpp_fixture['prompts']}
  records = [p for p in hf_fixture['prompts'] if prompt_names is None or p['name'] in prompt_names]
  if prompt_names is not None and len(records) != len(set(prompt_names)):
    known = [p['name'] for p in hf_fixture['prompts']]
    raise ValueError(f'unknown prompt names in {list(prompt_names)}; known: {known}')
  per_prompt, hf_rows, llama_rows = {}, [], []
  for record in records:
    llama = llama_by_name[record['name']]
    if llama['token_ids'] != record['token_ids']:
      raise ValueError(f'{record["name"]}: the fixtures tokenized differently')
    tic = time.time()
    run = run_prompt(
      model,
      record['token_ids'],
      requests={'hf': _topk_request(record), 'llamacpp': _topk_request(llama)},
      chunk_size=chunk_size,
      greedy_steps=len(record['greedy']['token_ids']),
    )
    hf_rows.append(compare_with_hf(run, record))
    llama_rows.append(compare_with_llamacpp(run, llama))
    per_prompt[record['name']] = {
      'hf': hf_rows[-1],
      'llamacpp': {k: v for k, v in llama_rows[-1].items() if not k.startswith('_')},
      'seconds': round(time.time() - tic, 2),
    }
    if progress:
      progress(record['name'], per_prompt[record['name']])
  return {'overall': summarize(hf_rows, llama_rows), 'prompts': per_prompt}


def experiment(
  *,
  prompt_names: Sequence[str] | None,
  chunk_size: int,
  dot_precision: str = 'highest',
  command: str | None = None,
  log: Callable[[str], None] = functools.partial(print, flush=True),
) -> dict:
  """Loads the model (products at `dot_precision`) and fixtures, compares; the result."""
  model = gemma_model.load('gemma3-270m', dtype=jnp.float32).with_dot_precision(dot_precision)
  hf_fixture, llamacpp_fixture = load_fixture(HF_FIXTURE), load_fixture(LLAMACPP_FIXTURE)
  started = time.time()
  figures = compare(
    model,
    hf_fixture=hf_fixture,
    llamacpp_fixture=llamacpp_fixture,
    prompt_names=prompt_names,
    chunk_size=chunk_size,
    progress=lambda name, row: log(progress_line(name, row)),
  )
  inputs = {
    'hf_fixture': str(HF_FIXTURE.relative_to(REPO_ROOT)),
    'hf_fixture_sha256': ledger.sha256_file(HF_FIXTURE),
    'llamacpp_fixture': str(LLAMACPP_FIXTURE.relative_to(REPO_ROOT)),
    'llamacpp_fixture_sha256': ledger.sha256_file(LLAMACPP_FIXTURE),
    'gguf_sha256': hf_fixture['gguf']['sha256'],
    'hf_versions': hf_fixture['versions'],
    'llamacpp_versions': llamacpp_fixture['versions'],
  }
  return {
    **results.header('reference_agreement', inputs=inputs, command=command),
    'model': 'gemma3-270m',
    'dtype': 'float32',
    'dot_precision': dot_precision,
    'model_fingerprint': model.fingerprint,
    'params_sha256': model.params_digest,
    'schedule': {'chunk_size': chunk_size, 'capacity': CAPACITY},
    'seconds': round(time.time() - started, 1),
    **figures,
  }
