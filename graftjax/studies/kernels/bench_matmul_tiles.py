"""A sweep of the matmul kernel's tiles and launch knobs at a model's shapes.

The library of experiments/bench_matmul_tiles.py. `sweep(...)` times every candidate
'block_m,block_n,block_k,num_warps,num_stages' of `kernels.matmul` on each projection of
a model (gemma-3-270m by default; decode: 1 row; prefill: a chunk) against XLA's dot, and
records whether its output is bit-equal to the default tiles' output: which knobs are free
(speed only) and which change the numerics.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import ledger
from graftjax.kernels import dots
from graftjax.kernels import matmul
from graftjax.models.gemma import config as config_lib
from graftjax.studies.common import results
from graftjax.studies.common import timing

DEFAULT = '64,64,32,4,3'


def projection_shapes(config: config_lib.GemmaConfig) -> tuple[tuple[str, int, int], ...]:
  """(name, K, N) of each projection of `config`'s model (a layer's and the unembedding)."""
  attention = config.num_heads * config.head_dim
  return (
    ('q', config.embed_dim, attention),
    ('kv', config.embed_dim, config.num_kv_heads * config.head_dim),
    ('o', attention, config.embed_dim),
    ('gate_up', config.embed_dim, config.hidden_dim),
    ('down', config.hidden_dim, config.embed_dim),
    ('unembed', config.embed_dim, config.vocab_size),
  )


def parse_candidate(text: str) -> dict[str, int]:
  """`matmul.matmul` keywords of 'block_m,block_n,block_k,num_warps,num_stages'."""
  keys = ('block_m', 'block_n', 'block_k', 'num_warps', 'num_stages')
  try:
    numbers = [int(x) for x in text.split(',')]
    if len(numbers) != len(keys):
      raise ValueError
  except ValueError as e:
    raise ValueError(f'candidate {text!r} must be {",".join(keys)}') from e
  return dict(zip(keys, numbers))


def _max_error(got: jax.Array, exact: np.ndarray) -> float:
  return float(np.abs(np.asarray(got, np.float64) - exact).max())


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `sweep` runs (experiments/bench_matmul_tiles.py builds it from its flags): its
  arguments, as its docstring describes them."""

  dtypes: Sequence[str]
  rows: Sequence[int]
  candidates: Sequence[str]
  iters: int
  time_budget_s: float
  shapes: Sequence[str] | None = None
  model: str = 'gemma3-270m'
  default: str = DEFAULT
  precision: str = 'highest'
  interpret: bool = False


def sweep(
  settings: Settings,
  *,
  log=print,
  command: str | None = None,
) -> dict:
  """Times every candidate (and XLA) per dtype, row count and shape; the result.

  The `default` tiles (`DEFAULT` unless given) run first in each case; every candidate's
  `bits_equal_default` says whether its output has the same bytes. Every
  product (XLA's too) is at `precision` (a name in `dots.NAMES`); each row's
  `max_abs_error` is against the float64 product.

  Raises:
    ValueError: for a malformed candidate or an unknown shape name.
  """
  for text in (settings.default, *settings.candidates):
    parse_candidate(text)
  dot_precision = dots.from_name(settings.precision)
  projections = projection_shapes(config_lib.get_config(settings.model))
  known = {name for name, _, _ in projections}
  if settings.shapes and set(settings.shapes) - known:
    raise ValueError(
      f'unknown shapes {sorted(set(settings.shapes) - known)}; known: {sorted(known)}'
    )
  cases = [s for s in projections if not settings.shapes or s[0] in settings.shapes]
  started = time.perf_counter()
  out_rows = []
  for dtype in settings.dtypes:
    for m in settings.rows:
      for name, k, n in cases:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((m, k)), dtype)
        w = jnp.asarray(rng.standard_normal((k, n)) * k**-0.5, dtype)
        base = dict(dtype=dtype, M=m, shape=name, K=k, N=n, precision=settings.precision)
        exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
        xla = jax.jit(lambda x, w: matmul.matmul_reference(x, w, precision=dot_precision))
        xla_s = timing.time_in_loop(lambda a: xla(*a), (x, w), iters=settings.iters)
        out_rows.append(
          dict(base, impl='xla', device_s=xla_s, max_abs_error=_max_error(xla(x, w), exact))
        )
        log(f'{dtype:8s} M={m:4d} {name:8s} xla {1e6 * xla_s:9.2f} us')
        want = None
        for text in dict.fromkeys((settings.default, *settings.candidates)):
          row = dict(base, impl='pallas', candidate=text)
          if time.perf_counter() - started > settings.time_budget_s:
            out_rows.append(dict(row, skipped='time budget spent'))
            continue
          knobs = parse_candidate(text)
          kernel = jax.jit(
            lambda x, w, knobs=knobs: matmul.matmul(
              x, w, precision=dot_precision, interpret=settings.interpret, **knobs
            )
          )
          try:
            got = kernel(x, w)
            seconds = timing.time_in_loop(lambda a, f=kernel: f(*a), (x, w), iters=settings.iters)
          except Exception as e:
            out_rows.append(dict(row, error=f'{type(e).__name__}: {e}'[:500]))
            log(f'{dtype} M={m} {name} {text} FAILED: {out_rows[-1]["error"][:200]}')
            continue
          digest = ledger.sha256_array(got)
          want = digest if text == settings.default else want
          row.update(
            device_s=seconds,
            vs_xla=seconds / xla_s,
            output_sha256=digest,
            bits_equal_default=digest == want,
            max_abs_error=_max_error(got, exact),
          )
          out_rows.append(row)
          log(
            f'{dtype:8s} M={m:4d} {name:8s} {text:16s} {1e6 * seconds:9.2f} us'
            f' ({seconds / xla_s:5.2f}x xla) equal={digest == want}'
          )
  return {
    **results.header('bench_matmul_tiles', command=command),
    'interpret': settings.interpret,
    'settings': dict(
      dtypes=list(settings.dtypes),
      rows=list(settings.rows),
      candidates=list(settings.candidates),
      default=settings.default,
      model=settings.model,
      shapes=[s[0] for s in cases],
      precision=settings.precision,
      iters=settings.iters,
    ),
    'rows': out_rows,
    'wall_s': time.perf_counter() - started,
  }
