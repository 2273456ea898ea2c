"""A sweep of attention tile sizes and launch knobs.

The library of experiments/bench_attention_tiles.py. `sweep(...)` times every candidate
`BlockSizes` on decode and prefill cases at gemma-3-270m shapes, against the bandwidth floor
and the XLA reference, and checks each against the reference.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.kernels import attention as attention_lib
from graftjax.kernels import dots
from graftjax.studies.common import device_trace
from graftjax.studies.common import results
from graftjax.studies.common import timing

HBM_BYTES_PER_S = 4.3e12  # H200
HEADS, KV_HEADS, HEAD_DIM = 4, 1, 256  # gemma-3-270m
# --quick: tiny sizes, a smoke test.
QUICK = dict(decode_lengths=[64], prefill_lengths=[64], iters=2)


# Launch knobs after the tile sizes (speed only, `attention`'s doc).
LAUNCH_KNOBS = ('num_stages', 'combine_stages')
CANDIDATE_FORM = (
  'block_q,block_k,block_s,num_warps[,num_stages,combine_stages[,combine_group,combine_block_h]]'
)


def parse_candidate(text: str) -> tuple[attention_lib.BlockSizes, dict[str, int]]:
  """(tile sizes, launch knobs) of a candidate of the form CANDIDATE_FORM."""
  try:
    numbers = [int(x) for x in text.split(',')]
    if len(numbers) not in (4, 6, 8):
      raise ValueError
  except ValueError as e:
    raise ValueError(f'candidate {text!r} must be {CANDIDATE_FORM}') from e
  combine = dict(zip(('combine_group', 'combine_block_h'), numbers[6:]))
  sizes = attention_lib.BlockSizes(*numbers[:3], num_warps=numbers[3], **combine)
  return sizes, dict(zip(LAUNCH_KNOBS, numbers[4:6]))


def _case(phase: str, length: int, dtype: str):
  num_q = 1 if phase == 'decode' else length
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, num_q, HEADS, HEAD_DIM)) * HEAD_DIM**-0.5, dtype)
  k = jnp.asarray(rng.standard_normal((1, length, KV_HEADS, HEAD_DIM)), dtype)
  v = jnp.asarray(rng.standard_normal((1, length, KV_HEADS, HEAD_DIM)), dtype)
  q_pos = jnp.arange(length - num_q, length, dtype=jnp.int32)[None]
  k_pos = jnp.arange(length, dtype=jnp.int32)[None]
  return q, k, v, q_pos, k_pos


def _traced(fn, args, top: int) -> dict:
  """{'kernels': the `top` largest device kernels of one traced call fn(*args)}, or {}."""
  if top <= 0:
    return {}
  events, wall_s = device_trace.trace(lambda: fn(*args))
  return {'kernels': device_trace.summarize(events, wall_s=wall_s, top=top)['kernels']}


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `sweep` runs (experiments/bench_attention_tiles.py builds it from its flags): its
  arguments, as its docstring describes them."""

  candidates: dict[str, list[str]]  # per dtype, candidates of the form CANDIDATE_FORM
  decode_lengths: Sequence[int]  # decode cases: S cached slots, one query
  prefill_lengths: Sequence[int]  # prefill cases: T = S
  iters: int  # calls per timed loop (decode; prefill a tenth)
  time_budget_s: float  # candidates after this long are skipped
  interpret: bool  # the kernels in Pallas' interpreter (off GPU)
  quick: bool = False
  trace_kernels: int = 0
  precision: str = 'highest'


def sweep(
  settings: Settings,
  *,
  log=print,
  command: str | None = None,
) -> dict:
  """Times every candidate on every case; returns the JSON-ready result.

  `quick` (a smoke test) keeps each dtype's first candidate and `QUICK`'s sizes.
  `trace_kernels` > 0 also traces one call of each (and of XLA) and keeps its largest
  device kernels by name (`device_trace`): which of the kernels and XLA ops a call runs
  takes the time. Every dot (the kernels' and XLA's) is at `precision`, a name in
  `dots.NAMES`; `max_abs_diff_vs_reference` is against XLA at HIGHEST.

  Raises:
    ValueError: for a malformed candidate (before anything runs).
  """
  candidates = settings.candidates
  decode_lengths, prefill_lengths = settings.decode_lengths, settings.prefill_lengths
  iters = settings.iters
  for texts in candidates.values():
    for text in texts:
      parse_candidate(text)  # fail early on a malformed one
  dot_precision = dots.from_name(settings.precision)
  if settings.quick:
    candidates = {dtype: texts[:1] for dtype, texts in candidates.items()}
    decode_lengths, prefill_lengths = QUICK['decode_lengths'], QUICK['prefill_lengths']
    iters = QUICK['iters']
  started = time.perf_counter()
  rows = []
  cases = [('decode', n) for n in decode_lengths] + [('prefill', n) for n in prefill_lengths]
  for dtype, texts in candidates.items():
    item = jnp.dtype(dtype).itemsize
    for phase, length in cases:
      args = _case(phase, length, dtype)
      floor_s = 2 * length * KV_HEADS * HEAD_DIM * item / HBM_BYTES_PER_S
      loops = iters if phase == 'decode' else max(1, iters // 10)
      want = np.asarray(jax.jit(attention_lib.attention_reference)(*args).astype(jnp.float32))
      reference = jax.jit(
        functools.partial(attention_lib.attention_reference, precision=dot_precision)
      )
      base = dict(
        dtype=dtype,
        phase=phase,
        S=length,
        T=1 if phase == 'decode' else length,
        floor_s=floor_s,
        precision=settings.precision,
      )
      overhead_s = timing.loop_overhead(args, iters=loops)
      base.update(loop_overhead_s=overhead_s)
      xla_s = timing.time_in_loop(lambda a: reference(*a), args, iters=loops)
      rows.append(
        dict(
          base,
          impl='xla',
          device_s=xla_s,
          over_floor=xla_s / floor_s,
          net_over_floor=(xla_s - overhead_s) / floor_s,
          **_traced(reference, args, settings.trace_kernels),
        )
      )
      log(
        f'{dtype:8s} {phase:7s} S={length:6d} xla {1e3 * xla_s:9.4f} ms'
        f' ({xla_s / floor_s:7.1f}x floor)'
      )
      for text in texts:
        sizes, stages = parse_candidate(text)
        row = dict(
          base, impl='pallas', candidate=text, block_sizes=dataclasses.asdict(sizes), stages=stages
        )
        if time.perf_counter() - started > settings.time_budget_s:
          rows.append(dict(row, skipped='time budget spent'))
          continue
        kernel = jax.jit(
          lambda *a, sizes=sizes, stages=stages: attention_lib.attention(
            *a, block_sizes=sizes, precision=dot_precision, interpret=settings.interpret, **stages
          )
        )
        try:
          got = np.asarray(kernel(*args).astype(jnp.float32))
          seconds = timing.time_in_loop(lambda a, f=kernel: f(*a), args, iters=loops)
        except Exception as e:
          rows.append(dict(row, error=f'{type(e).__name__}: {e}'[:2000]))
          log(f'{dtype} {phase} S={length} {text} FAILED: {rows[-1]["error"][:300]}')
          continue
        row.update(
          device_s=seconds,
          over_floor=seconds / floor_s,
          net_over_floor=(seconds - overhead_s) / floor_s,
          vs_xla=seconds / xla_s,
          max_abs_diff_vs_reference=float(np.abs(got - want).max()),
          output_sha256=hashlib.sha256(got.tobytes()).hexdigest(),
          **_traced(kernel, args, settings.trace_kernels),
        )
        rows.append(row)
        log(
          f'{dtype:8s} {phase:7s} S={length:6d} {text:14s}'
          f' {1e3 * seconds:9.4f} ms ({seconds / floor_s:7.1f}x floor,'
          f' {(seconds - overhead_s) / floor_s:7.1f}x net of the loop,'
          f' {seconds / xla_s:6.2f}x xla) diff {row["max_abs_diff_vs_reference"]:.2e}'
        )
  return dict(
    **results.header('bench_attention_tiles', command=command),
    interpret=settings.interpret,
    hbm_bytes_per_s=HBM_BYTES_PER_S,
    settings=dict(
      candidates=candidates,
      decode_lengths=list(decode_lengths),
      prefill_lengths=list(prefill_lengths),
      iters=iters,
      trace_kernels=settings.trace_kernels,
      precision=settings.precision,
    ),
    wall_s=time.perf_counter() - started,
    rows=rows,
    quick=settings.quick,
  )
