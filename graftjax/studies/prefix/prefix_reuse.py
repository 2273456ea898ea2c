"""Automatic exact prefix reuse on three workloads: hit lengths, first-token times, bytes read,
and the logits' SHA-256 with reuse against a cold prefill.

    result = prefix_reuse.experiment(Settings(model='tiny', fewshot=2, turns=2, questions=2))

Each workload runs through one `prefix.Engine` over a fresh `file` store, request by request
in order; before each request the engine prefills it once untimed without depositing (it
compiles every program both timed paths run: the graft's installs and checks for its row
counts, and the chunk shapes, which a cold prefill on the same grid shares). Per request:
the stored prefix found (token granular), the hit grafted (under kernels that are not
chunk-invariant rounded down to the chunk grid), first-token time with reuse (lookup, fetch,
graft, prefill of the rest, logits on the host) and without (a cold prefill on the same chunk
grid and capacity), bytes read per tier, and the SHA-256 of both logits. The anchor is the same
workload with hits rounded down to `anchor_grid` tokens (the grid deterministic prefix caching
elsewhere resumes from): the tokens recomputed there that token granularity saves. The
sliding-window figures compare a span keeping every row with one keeping only what a
continuation after its last token sees (`compact_bytes`).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from graftjax import ledger
from graftjax import prefix
from graftjax import store as store_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.studies.common import results
from graftjax.studies.prefix import workloads


@dataclasses.dataclass(frozen=True)
class Settings:
  """What to run.

  Attributes:
    model: a name `model.load_named` takes ('gemma3-270m', 'tiny', 'gemma3-12b:random').
    impl: 'xla' or 'pallas' for every op.
    dtype: 'float32' or 'bfloat16'.
    span: tokens per stored span.
    chunk_size: prefill tokens per forward call.
    capacity: cache slots.
    fewshot: GSM8K questions behind the 8-shot prefix.
    turns: turns of the conversation.
    document_tokens: tokens of the shared document.
    questions: questions about the document.
    anchor_grid: the coarse grid hits are rounded to in the anchor.
  """

  model: str = 'gemma3-270m'
  impl: str = 'xla'
  dtype: str = 'float32'
  span: int = 256
  chunk_size: int = 32
  capacity: int = 2048
  fewshot: int = 4
  turns: int = 4
  document_tokens: int = 1536
  questions: int = 4
  anchor_grid: int = 1024


def prompts(model, settings: Settings) -> dict[str, list[list[int]]]:
  tok = model.tokenizer
  return {
    'fewshot': workloads.fewshot(tok, requests=settings.fewshot),
    'turns': workloads.turns(tok, count=settings.turns),
    'document': workloads.document(
      tok, tokens=settings.document_tokens, questions=settings.questions
    ),
  }


def _cold(model, ids, settings: Settings) -> tuple[np.ndarray, float]:
  began = time.perf_counter()
  cache = model.init_cache(capacity=settings.capacity)
  out, _ = model.prefill(ids, cache=cache, chunk_size=settings.chunk_size, logits='last')
  logits = np.asarray(out[0])
  return logits, time.perf_counter() - began


def _run(model, requests, settings: Settings) -> list[dict[str, Any]]:
  """A workload through a fresh engine and store: a row per request."""
  rows = []
  with tempfile.TemporaryDirectory() as root:
    engine = prefix.Engine(
      model,
      store_lib.BlockStore(root),
      span=settings.span,
      capacity=settings.capacity,
      chunk_size=settings.chunk_size,
    )
    for ids in requests:
      engine.prefill(ids, deposit=False)  # compiles
      cold, cold_s = _cold(model, ids, settings)
      out = engine.prefill(ids)
      found = out.found
      anchor = found // settings.anchor_grid * settings.anchor_grid
      boundary = found // settings.span * settings.span
      rows.append(
        {
          'tokens': len(ids),
          'found': found,
          'hit': out.hit,
          'anchor_hit': anchor,
          'span_boundary_hit': boundary,
          'saved_over_anchor': out.hit - anchor,
          'saved_over_anchor_token_granular': found - anchor,
          'first_token_s_reuse': out.seconds,
          'first_token_s_cold': cold_s,
          'read_bytes': out.read_bytes,
          'deposited_spans': out.deposited,
          'reasons': out.reasons,
          'sha256_reuse': ledger.sha256_array(out.logits),
          'sha256_cold': ledger.sha256_array(cold),
          'logits_equal': out.logits.tobytes() == cold.tobytes(),
        }
      )
  return rows


def row_bytes(model) -> tuple[int, int, int]:
  """(bytes of k and v per token in one cached layer, global cached layers, sliding ones)."""
  config = model.config
  itemsize = jnp.dtype(model.dtype).itemsize
  layers = config.cached_layers
  sliding = [i for i in layers if config.window(i) is not None]
  per_layer = [2 * config.kv_heads_of(i) * config.head_dim_of(i) * itemsize for i in layers]
  return int(np.mean(per_layer)), len(layers) - len(sliding), len(sliding)


def compact_bytes(model, tokens: int) -> dict[str, int]:
  """Bytes of one span of `tokens`: every row kept, and only a continuation's rows after its
  last token (sliding layers their last W - 1)."""
  config = model.config
  itemsize = jnp.dtype(model.dtype).itemsize
  full = compact = 0
  for i in config.cached_layers:
    row = 2 * config.kv_heads_of(i) * config.head_dim_of(i) * itemsize
    window = config.window(i)
    full += tokens * row
    compact += (tokens if window is None else min(tokens, window - 1)) * row
  return {'all_rows': full, 'compact': compact}


def experiment(settings: Settings = Settings()) -> dict[str, Any]:
  dtype = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}[settings.dtype]
  model = gemma_model.load_named(settings.model, dtype=dtype, impl=settings.impl)
  result = results.header('prefix_reuse', inputs=results.model_inputs(model, settings.model))
  workloads_out, summary = {}, {}
  every = []
  for name, requests in prompts(model, settings).items():
    rows = _run(model, requests, settings)
    every += rows
    workloads_out[name] = {'requests': rows}
    summary[name] = _totals(rows, settings)
  window = model.config.sliding_window
  result.update(
    settings=dataclasses.asdict(settings),
    exact_anywhere=bool(model.graft_target.chunk_invariant),
    workloads=workloads_out,
    sliding_window={
      'window': window,
      'span': settings.span,
      'span_bytes': compact_bytes(model, settings.span),
      'anchor_grid_span_bytes': compact_bytes(model, settings.anchor_grid),
      'recomputed_if_hits_fall_back_to_span_boundary': sum(
        r['found'] - r['span_boundary_hit'] for r in every
      ),
    },
    summary={
      **{
        f'{name}_{key}': value for name, totals in summary.items() for key, value in totals.items()
      },
      'requests': len(every),
      'logits_equal': sum(r['logits_equal'] for r in every),
    },
  )
  return result


def _totals(rows: list[dict[str, Any]], settings: Settings) -> dict[str, Any]:
  reused = rows[1:]  # the first request of a workload finds nothing
  return {
    'tokens': sum(r['tokens'] for r in rows),
    'hit_tokens': sum(r['hit'] for r in rows),
    'anchor_hit_tokens': sum(r['anchor_hit'] for r in rows),
    'first_token_s_reuse_median': float(np.median([r['first_token_s_reuse'] for r in reused]))
    if reused
    else None,
    'first_token_s_cold_median': float(np.median([r['first_token_s_cold'] for r in reused]))
    if reused
    else None,
  }
