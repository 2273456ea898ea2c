"""Timing of jitted calls for the benchmark scripts.

Two clocks: `time_calls` times whole calls from the host (dispatch included,
what a Python caller sees); `time_in_loop` runs the call `iters` times inside
one jitted loop and divides, so a kernel of a few microseconds is not
measured as the host's dispatch overhead.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import jax
from jax import lax
import jax.numpy as jnp


def time_calls(
  fn: Callable[[], jax.Array], *, warmup: int, repeats: int
) -> tuple[list[float], jax.Array]:
  """Wall seconds of `repeats` calls of fn() (after `warmup`, at least one,
  which compiles), each ended by block_until_ready; and the last output."""
  out = None
  for _ in range(max(warmup, 1)):
    out = jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times, out


def time_in_loop(
  fn: Callable[[Sequence[jax.Array]], jax.Array],
  args: Sequence[jax.Array],
  *,
  iters: int,
  repeats: int = 3,
  unroll: int = 10,
) -> float:
  """Seconds per call of fn(args) run `iters` times in one jitted fori_loop.

  Each iteration adds 0 * (the sum of the previous output) to args[0], so
  the call depends on the loop carry and XLA can neither hoist it out of the
  loop nor compute only part of its output (a loop that consumes one output
  element lets XLA's fusions skip the rest, and its XLA `device_s` figures
  come out too small). The sum and that elementwise op
  are part of the time (microseconds for decode shapes), and so is the loop's
  own per-iteration cost (on the GPU, ~10 us: the host reads the loop
  predicate), spread over `unroll` calls per iteration; `loop_overhead`
  measures both. Returns the best of `repeats` loops, after one that
  compiles.
  """
  if iters <= 0:
    raise ValueError(f'iters must be positive, got {iters}')

  def looped(*arrays):
    def body(_, carry):
      first = arrays[0] + (carry * 0).astype(arrays[0].dtype)
      out = fn((first,) + tuple(arrays[1:]))
      return jnp.sum(out.astype(jnp.float32))

    return lax.fori_loop(0, iters, body, jnp.float32(0), unroll=max(1, min(unroll, iters)))

  run = jax.jit(looped)
  jax.block_until_ready(run(*args))
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(run(*args))
    best = min(best, time.perf_counter() - start)
  return best / iters


def loop_overhead(
  args: Sequence[jax.Array], *, iters: int, repeats: int = 3, unroll: int = 10
) -> float:
  """Seconds per iteration of `time_in_loop` around a call that returns its
  first argument: the loop, the carry dependence and the sum, without a
  kernel. Subtract it from `time_in_loop` of a call whose output is about as
  large as args[0] to estimate the call alone."""
  return time_in_loop(lambda arrays: arrays[0], args, iters=iters, repeats=repeats, unroll=unroll)
