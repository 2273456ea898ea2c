r"""Which attention tile sizes to fix: a sweep of `BlockSizes` and launch knobs.

    python experiments/bench_attention_tiles.py            # GPU
    python experiments/bench_attention_tiles.py --quick    # CPU smoke test

The tile sizes decide the bits (see graftjax.kernels.attention), so each
dtype gets one fixed default; this script measures the candidates, on the
device clock (`graftjax.studies.timing.time_in_loop`), at gemma-3-270m shapes
(N=4, K=1, H=256): decode (T = 1) over S in --decode_lengths cached slots and
prefill T = S in --prefill_lengths, against the bandwidth floor (K and V read
once: 2 S H itemsize bytes over 4.3e12 B/s) and the XLA reference. Every
candidate is also checked against the reference (max |difference|).

A candidate is "block_q,block_k,block_s,num_warps" or, with the pipelining
stages of the two kernels (speed knobs: the rows' output digests show whether
they change bits), "...,num_stages,combine_stages" (--float32 / --bfloat16
lists). Writes experiments/results/bench_attention_tiles_<backend>.json.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import dataclasses  # pylint: disable=g-import-not-at-top,wrong-import-position
import hashlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import pathlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import time
from typing import Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from graftjax.kernels import attention as attention_lib
from graftjax.studies import cli
from graftjax.studies import results
from graftjax.studies import timing

HBM_BYTES_PER_S = 4.3e12  # H200
HEADS, KV_HEADS, HEAD_DIM = 4, 1, 256  # gemma-3-270m

_QUICK = flags.DEFINE_bool('quick', False, 'Tiny sizes, interpret mode off GPU.')
_FLOAT32 = flags.DEFINE_list(
  'float32',
  [
    '4,32,256,4',
    '4,32,256,8',
    '4,16,256,8',
    '4,32,128,4',
    '4,32,128,8',
    '4,16,128,8',
    '4,32,512,8',
  ],
  'float32 candidates: block_q,block_k,block_s,num_warps.',
)
_BFLOAT16 = flags.DEFINE_list(
  'bfloat16',
  [
    '4,64,512,4',
    '4,64,512,8',
    '4,64,256,4',
    '4,64,256,8',
    '4,64,1024,8',
    '4,32,256,4',
    '4,32,128,4',
  ],
  'bfloat16 candidates: block_q,block_k,block_s,num_warps.',
)
_DECODE_LENGTHS = flags.DEFINE_list('decode_lengths', ['1024', '32768'], 'Decode S.')
_PREFILL_LENGTHS = flags.DEFINE_list('prefill_lengths', ['4096'], 'Prefill T = S.')
_ITERS = flags.DEFINE_integer('iters', 50, 'Calls per timed loop (decode).')
_TIME_BUDGET_S = flags.DEFINE_float('time_budget_s', 300.0, 'Skip the rest after this long.')
_OUT = flags.DEFINE_string('out', None, 'Result JSON (default by backend).')


def _candidate(text: str) -> tuple[attention_lib.BlockSizes, dict[str, int]]:
  """(tile sizes, pipelining stages) of 'q,k,s,warps[,stages,combine_stages]'."""
  try:
    numbers = [int(x) for x in text.split(',')]
    if len(numbers) not in (4, 6):
      raise ValueError
  except ValueError as e:
    raise app.UsageError(
      f'candidate {text!r} must be block_q,block_k,block_s,num_warps[,num_stages,combine_stages]'
    ) from e
  sizes = attention_lib.BlockSizes(*numbers[:3], num_warps=numbers[3])
  stages = {}
  if len(numbers) == 6:
    stages = dict(num_stages=numbers[4], combine_stages=numbers[5])
  return sizes, stages


def _case(phase: str, length: int, dtype: str):
  num_q = 1 if phase == 'decode' else length
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((1, num_q, HEADS, HEAD_DIM)) * HEAD_DIM**-0.5, dtype)
  k = jnp.asarray(rng.standard_normal((1, length, KV_HEADS, HEAD_DIM)), dtype)
  v = jnp.asarray(rng.standard_normal((1, length, KV_HEADS, HEAD_DIM)), dtype)
  q_pos = jnp.arange(length - num_q, length, dtype=jnp.int32)[None]
  k_pos = jnp.arange(length, dtype=jnp.int32)[None]
  return q, k, v, q_pos, k_pos


def sweep(
  *,
  candidates: dict[str, list[str]],
  decode_lengths: Sequence[int],
  prefill_lengths: Sequence[int],
  iters: int,
  time_budget_s: float,
  interpret: bool,
  log=print,
  command: str | None = None,
) -> dict:
  """Times every candidate on every case; returns the JSON-ready result."""
  started = time.perf_counter()
  rows = []
  cases = [('decode', n) for n in decode_lengths] + [('prefill', n) for n in prefill_lengths]
  for dtype, texts in candidates.items():
    item = jnp.dtype(dtype).itemsize
    for phase, length in cases:
      args = _case(phase, length, dtype)
      floor_s = 2 * length * KV_HEADS * HEAD_DIM * item / HBM_BYTES_PER_S
      loops = iters if phase == 'decode' else max(1, iters // 10)
      reference = jax.jit(attention_lib.attention_reference)
      want = np.asarray(reference(*args).astype(jnp.float32))
      base = dict(
        dtype=dtype, phase=phase, S=length, T=1 if phase == 'decode' else length, floor_s=floor_s
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
        )
      )
      log(
        f'{dtype:8s} {phase:7s} S={length:6d} xla {1e3 * xla_s:9.4f} ms'
        f' ({xla_s / floor_s:7.1f}x floor)'
      )
      for text in texts:
        sizes, stages = _candidate(text)
        row = dict(
          base, impl='pallas', candidate=text, block_sizes=dataclasses.asdict(sizes), stages=stages
        )
        if time.perf_counter() - started > time_budget_s:
          rows.append(dict(row, skipped='time budget spent'))
          continue
        kernel = jax.jit(
          lambda *a, sizes=sizes, stages=stages: attention_lib.attention(
            *a, block_sizes=sizes, interpret=interpret, **stages
          )
        )
        try:
          got = np.asarray(kernel(*args).astype(jnp.float32))
          seconds = timing.time_in_loop(lambda a, f=kernel: f(*a), args, iters=loops)
        except Exception as e:  # pylint: disable=broad-exception-caught
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
    interpret=interpret,
    hbm_bytes_per_s=HBM_BYTES_PER_S,
    settings=dict(
      candidates=candidates,
      decode_lengths=list(decode_lengths),
      prefill_lengths=list(prefill_lengths),
      iters=iters,
    ),
    wall_s=time.perf_counter() - started,
    rows=rows,
  )


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  interpret = jax.default_backend() != 'gpu'
  candidates = {'float32': _FLOAT32.value, 'bfloat16': _BFLOAT16.value}
  for texts in candidates.values():
    for text in texts:
      _candidate(text)  # fail early on a malformed one
  if _QUICK.value:
    candidates = {dtype: texts[:1] for dtype, texts in candidates.items()}
    decode, prefill, iters = [64], [64], 2
  else:
    decode = [int(n) for n in _DECODE_LENGTHS.value]
    prefill = [int(n) for n in _PREFILL_LENGTHS.value]
    iters = _ITERS.value
  result = sweep(
    candidates=candidates,
    decode_lengths=decode,
    prefill_lengths=prefill,
    iters=iters,
    time_budget_s=_TIME_BUDGET_S.value,
    interpret=interpret,
  )
  result['quick'] = _QUICK.value
  out = pathlib.Path(
    _OUT.value or f'experiments/results/bench_attention_tiles_{jax.default_backend()}.json'
  )
  failed = [r for r in result['rows'] if 'error' in r]
  print(f'{len(result["rows"])} rows, {len(failed)} failed, {result["wall_s"]:.1f} s')
  results.write(out, result)


if __name__ == '__main__':
  cli.run(main)
