"""Speed of the invariant Pallas kernels against their XLA references.

The library of experiments/bench_kernels.py. `run_benchmarks(...)` times attention (prefill,
decode, sliding window), rotary, rms_norm and matmul at gemma-3-270m shapes, on the host and
device clocks, as fractions of the H200's bandwidth and peak, with the largest |pallas -
xla| difference per case.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from graftjax.kernels import attention as attention_lib
from graftjax.kernels import matmul as matmul_lib
from graftjax.kernels import rmsnorm as rmsnorm_lib
from graftjax.kernels import rotary as rotary_lib
from graftjax.studies.common import results
from graftjax.studies.common import timing

HBM_BYTES_PER_S = 4.3e12  # H200
BF16_DENSE_FLOPS = 7.9e14  # H200, dense bfloat16
HEADS, KV_HEADS, HEAD_DIM = 4, 1, 256  # gemma-3-270m
HIDDEN, MLP = 640, 2048
ROPE_THETA = 1_000_000.0
KERNELS = ('attention', 'rotary', 'rms_norm', 'matmul')
# --quick: tiny sizes, a smoke test.
QUICK = dict(lengths=[128], aux_lengths=[1, 64], window=32, warmup=1, repeats=2, loop_iters=2)


def _attention_cases(lengths, dtypes, window, xla_max_length, interpret):
  """(name, phase, dtype, shape, flops, bytes, {impl: thunk-maker}) tuples."""
  cases = []
  for dtype in dtypes:
    item = jnp.dtype(dtype).itemsize
    for phase in ('prefill', 'decode'):
      for length in lengths:
        windows = [None]
        if phase == 'prefill' and window and dtype == 'bfloat16':
          windows.append(window)
        for win in windows:
          num_q = length if phase == 'prefill' else 1
          capacity = length
          q_pos = np.arange(capacity - num_q, capacity, dtype=np.int32)
          k_pos = np.arange(capacity, dtype=np.int32)
          vis = np.minimum(q_pos + 1, capacity).astype(np.int64)
          if win:
            vis = np.minimum(vis, win)
          pairs = int(vis.sum())
          flops = 4 * HEADS * HEAD_DIM * pairs  # QK^T and PV, 2 FLOPs a MAC
          bytes_ = (
            2 * num_q * HEADS * HEAD_DIM * item  # q, out
            + 2 * capacity * KV_HEADS * HEAD_DIM * item  # k, v
            + 4 * (num_q + capacity)
          )  # positions

          def make(num_q=num_q, capacity=capacity, q_pos=q_pos, k_pos=k_pos, dtype=dtype):
            rng = np.random.default_rng(0)
            q = jnp.asarray(
              rng.standard_normal((1, num_q, HEADS, HEAD_DIM)) * HEAD_DIM**-0.5, dtype
            )
            k = jnp.asarray(rng.standard_normal((1, capacity, KV_HEADS, HEAD_DIM)), dtype)
            v = jnp.asarray(rng.standard_normal((1, capacity, KV_HEADS, HEAD_DIM)), dtype)
            return q, k, v, jnp.asarray(q_pos[None]), jnp.asarray(k_pos[None])

          impls = {
            'pallas': lambda a, win=win: attention_lib.attention(
              *a, window=win, interpret=interpret
            ),
          }
          if phase == 'decode' or length <= xla_max_length:
            impls['xla'] = lambda a, win=win: attention_lib.attention_reference(*a, window=win)
          name = 'attention' if not win else f'attention_window{win}'
          shape = dict(B=1, T=num_q, S=capacity, N=HEADS, K=KV_HEADS, H=HEAD_DIM, window=win)
          cases.append((name, phase, dtype, shape, flops, bytes_, make, impls))
  return cases


def _norm_impls(interpret, norm_warps):
  """'pallas' (the default launch), 'pallas_warps<n>' for every other warp count, 'xla'."""
  impls = {'pallas': lambda a: rmsnorm_lib.rms_norm(*a, interpret=interpret)}
  for warps in norm_warps:
    if warps != 4:
      impls[f'pallas_warps{warps}'] = lambda a, warps=warps: rmsnorm_lib.rms_norm(
        *a, num_warps=warps, interpret=interpret
      )
  impls['xla'] = lambda a: rmsnorm_lib.rms_norm_reference(*a)
  return impls


def _aux_cases(kernels, lengths, dtypes, interpret, norm_dim=HIDDEN, norm_warps=(4,)):
  cases = []
  for dtype in dtypes:
    item = jnp.dtype(dtype).itemsize
    for tokens in lengths:
      phase = 'decode' if tokens == 1 else 'prefill'
      if 'rotary' in kernels:

        def make_rotary(tokens=tokens, dtype=dtype):
          rng = np.random.default_rng(0)
          x = jnp.asarray(rng.standard_normal((1, tokens, HEADS, HEAD_DIM)), dtype)
          pos = jnp.arange(tokens, dtype=jnp.int32)[None]
          return x, pos

        elems = tokens * HEADS * HEAD_DIM
        cases.append(
          (
            'rotary',
            phase,
            dtype,
            dict(B=1, T=tokens, N=HEADS, H=HEAD_DIM),
            3 * elems,
            2 * elems * item + 4 * tokens,
            make_rotary,
            {
              'pallas': lambda a: rotary_lib.apply_rotary(
                *a, theta=ROPE_THETA, interpret=interpret
              ),
              'xla': lambda a: rotary_lib.apply_rotary_reference(*a, theta=ROPE_THETA),
            },
          )
        )
      if 'rms_norm' in kernels:

        def make_norm(tokens=tokens, dtype=dtype):
          rng = np.random.default_rng(0)
          x = jnp.asarray(rng.standard_normal((tokens, norm_dim)), dtype)
          w = jnp.asarray(1 + 0.1 * rng.standard_normal(norm_dim), jnp.float32)
          return x, w

        elems = tokens * norm_dim
        cases.append(
          (
            'rms_norm',
            phase,
            dtype,
            dict(M=tokens, D=norm_dim),
            4 * elems,
            2 * elems * item + 4 * norm_dim,
            make_norm,
            _norm_impls(interpret, norm_warps),
          )
        )
      if 'matmul' in kernels:

        def make_matmul(tokens=tokens, dtype=dtype):
          rng = np.random.default_rng(0)
          x = jnp.asarray(rng.standard_normal((tokens, HIDDEN)), dtype)
          w = jnp.asarray(rng.standard_normal((HIDDEN, MLP)) * HIDDEN**-0.5, dtype)
          return x, w

        cases.append(
          (
            'matmul',
            phase,
            dtype,
            dict(M=tokens, K=HIDDEN, N=MLP),
            2 * tokens * HIDDEN * MLP,
            (tokens * HIDDEN + HIDDEN * MLP + tokens * MLP) * item,
            make_matmul,
            {
              'pallas': lambda a: matmul_lib.matmul(*a, interpret=interpret),
              'xla': lambda a: matmul_lib.matmul_reference(*a),
            },
          )
        )
  return cases


def _bytes(a: jax.Array) -> bytes:
  return np.asarray(a).tobytes()


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `run_benchmarks` runs (experiments/bench_kernels.py builds it from its flags): its
  arguments, as its docstring describes them."""

  lengths: Sequence[int]  # attention: prefill T = S, and decode cache sizes S
  aux_lengths: Sequence[int]  # token counts for rotary, rms_norm and matmul
  kernels: Sequence[str] = KERNELS
  dtypes: Sequence[str] = ('float32', 'bfloat16')
  window: int = 512  # of the windowed prefill case (0: none)
  xla_max_length: int = 16384  # no XLA attention prefill above this T
  warmup: int = 2  # untimed calls per case
  repeats: int = 10  # timed calls per case
  loop_iters: int = 100  # calls per device-clock loop of cases under 5 ms (0: host clock only)
  time_budget_s: float = 170.0  # the remaining cases are skipped after this long
  norm_dim: int = HIDDEN
  norm_warps: Sequence[int] = (4,)
  interpret: bool | None = None  # None: off GPU
  quick: bool = False


def run_benchmarks(
  settings: Settings,
  *,
  log: Callable[[str], None] = print,
  command: str | None = None,
) -> dict[str, Any]:
  """Times every case; returns the JSON-ready result.

  `quick` (a smoke test, interpret mode off GPU) replaces the sizes and repeats by
  `QUICK`'s. rms_norm runs over `norm_dim` features, at each of `norm_warps` (the default
  launch, 4, is 'pallas'; every other variant records whether its bytes equal it).
  """
  kernels, dtypes = settings.kernels, settings.dtypes
  lengths, aux_lengths, window = settings.lengths, settings.aux_lengths, settings.window
  warmup, repeats, loop_iters = settings.warmup, settings.repeats, settings.loop_iters
  if settings.quick:
    lengths, aux_lengths, window = QUICK['lengths'], QUICK['aux_lengths'], QUICK['window']
    warmup, repeats, loop_iters = QUICK['warmup'], QUICK['repeats'], QUICK['loop_iters']
  unknown = set(kernels) - set(KERNELS)
  if unknown:
    raise ValueError(f'unknown kernels {sorted(unknown)}; known: {KERNELS}')
  interpret = settings.interpret
  if interpret is None:
    interpret = jax.default_backend() != 'gpu'
  cases = []
  if 'attention' in kernels:
    cases += _attention_cases(lengths, dtypes, window, settings.xla_max_length, interpret)
  cases += _aux_cases(
    kernels, aux_lengths, dtypes, interpret, settings.norm_dim, settings.norm_warps
  )

  started = time.perf_counter()
  rows = []
  for name, phase, dtype, shape, flops, bytes_, make, impls in cases:
    args = None
    outs = {}
    overheads = {}  # loop iterations -> seconds; the same for every impl
    for impl, fn in impls.items():
      row = dict(
        kernel=name, impl=impl, phase=phase, dtype=dtype, shape=shape, flops=flops, bytes=bytes_
      )
      if time.perf_counter() - started > settings.time_budget_s:
        row['skipped'] = f'time budget of {settings.time_budget_s} s spent'
        rows.append(row)
        continue
      try:
        if args is None:
          args = make()
        times, out = timing.time_calls(lambda fn=fn: fn(args), warmup=warmup, repeats=repeats)
        outs[impl] = out
        median = statistics.median(times)
        # Short calls again on the device clock (no host dispatch per call).
        iters = min(loop_iters, int(0.2 / median)) if median < 0.005 else 0
        device_s = timing.time_in_loop(fn, args, iters=iters) if iters else median
        if iters and iters not in overheads:
          overheads[iters] = timing.loop_overhead(args, iters=iters)
        overhead_s = overheads.get(iters, 0.0)
        # The call alone: the loop's own cost taken off (never below 1 ns).
        kernel_s = max(device_s - overhead_s, 1e-9)
        row.update(
          median_s=median,
          min_s=min(times),
          repeats=repeats,
          device_s=device_s,
          loop_iters=iters,
          loop_overhead_s=overhead_s,
          kernel_s=kernel_s,
          hbm_fraction=bytes_ / kernel_s / HBM_BYTES_PER_S,
          bf16_peak_fraction=flops / kernel_s / BF16_DENSE_FLOPS,
        )
        log(
          f'{name:22s} {phase:7s} {dtype:8s} {impl:6s} {shape}'
          f' {1e3 * median:9.3f} ms (device {1e3 * device_s:9.4f} ms,'
          f' loop {1e3 * overhead_s:7.4f} ms)'
          f'  hbm {row["hbm_fraction"]:6.3f}'
          f'  peak {row["bf16_peak_fraction"]:6.3f}'
        )
      except Exception as e:
        row['error'] = f'{type(e).__name__}: {e}'[:2000]
        log(f'{name} {phase} {dtype} {impl} {shape} FAILED: {row["error"]}')
      rows.append(row)
    if 'pallas' in outs and 'xla' in outs:
      diff = float(
        jnp.max(jnp.abs(outs['pallas'].astype(jnp.float32) - outs['xla'].astype(jnp.float32)))
      )
      for row in rows[-len(impls) :]:
        row['max_abs_diff_pallas_vs_xla'] = diff
        if row['impl'].startswith('pallas_') and row['impl'] in outs:
          row['bits_equal_pallas'] = _bytes(outs[row['impl']]) == _bytes(outs['pallas'])
    args = outs = None  # this case's arrays go before the next case's are made
  return dict(
    **results.header('bench_kernels', command=command),
    interpret=interpret,
    peaks=dict(hbm_bytes_per_s=HBM_BYTES_PER_S, bf16_dense_flops=BF16_DENSE_FLOPS),
    settings=dict(
      kernels=list(kernels),
      lengths=list(lengths),
      aux_lengths=list(aux_lengths),
      dtypes=list(dtypes),
      window=window,
      xla_max_length=settings.xla_max_length,
      warmup=warmup,
      repeats=repeats,
      loop_iters=loop_iters,
      norm_dim=settings.norm_dim,
      norm_warps=list(settings.norm_warps),
    ),
    wall_s=time.perf_counter() - started,
    cases=rows,
    quick=settings.quick,
  )
