"""Where a prefill and a decode spend their time: device kernels from a jax trace.

The library of experiments/profile_model.py. `experiment(...)` traces one prefill and one
decode of the model (seeded random weights) under each kernel set (`device_trace`) and sums
the device's kernels by name: calls, total and mean time, and how much of the phase's wall
time the device was busy (the rest is launch gaps and host).
"""

from __future__ import annotations

from collections.abc import Callable
import functools

import jax.numpy as jnp

from graftjax.models.gemma import config as config_lib
from graftjax.studies.model import bench_model
from graftjax.studies.common import device_trace
from graftjax.studies.common import results


def experiment(
  *,
  dtype: str,
  impls: list[str],
  model_name: str = 'gemma3-270m',
  prompt_tokens: int,
  decode_tokens: int,
  chunk_size: int,
  top: int = 30,
  command: str | None = None,
  log: Callable[[str], None] = functools.partial(print, flush=True),
) -> dict:
  """Per kernel set: the prefill's and the decode's device kernels, summed by name."""
  base = bench_model.random_model(model_name, jnp.dtype(dtype))
  prompt = bench_model.random_prompt(base.config, prompt_tokens)
  phases = {}
  for impl in impls:
    prefill, decode = bench_model.phases(
      base.with_impl(impl), prompt, chunk_size=chunk_size, decode_tokens=decode_tokens
    )
    decode(*prefill())  # compile both
    events, wall_s = device_trace.trace(prefill)
    phases[f'{impl}_prefill'] = device_trace.summarize(events, wall_s=wall_s, top=top)
    last, cache = prefill()
    events, wall_s = device_trace.trace(lambda: decode(last, cache))
    phases[f'{impl}_decode'] = device_trace.summarize(events, wall_s=wall_s, top=top)
    for phase in ('prefill', 'decode'):
      s = phases[f'{impl}_{phase}']
      log(
        f'{impl} {phase}: wall {s["wall_us"]:.0f} us, device busy {s["device_busy_us"]:.0f} us, '
        f'{s["kernel_calls"]} kernels'
      )
  inputs = {'config': model_name, 'random_weights_seed': 0}
  return {
    **results.header('profile_model', inputs=inputs, command=command),
    'dtype': dtype,
    'prompt_tokens': prompt_tokens,
    'decode_tokens': decode_tokens,
    'chunk_size': chunk_size,
    'impls': list(impls),
    'ops': list(config_lib.OPS),
    'phases': phases,
  }
