"""graftjax.studies.common.timing: both clocks return per-call seconds and the output."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.studies.common import timing


def test_time_calls_returns_times_and_the_output():
  x = jnp.arange(8.0)
  times, out = timing.time_calls(lambda: x * 2, warmup=0, repeats=3)
  assert len(times) == 3 and min(times) > 0
  np.testing.assert_array_equal(out, np.arange(8.0) * 2)


def test_time_in_loop_is_per_call(monkeypatch):
  """The best loop's seconds divided by iters, on a scripted clock (no wall-clock
  threshold: how fast this machine is must not decide the test)."""
  x = jnp.ones((64, 64))
  assert timing.time_in_loop(lambda a: a[0] @ a[1], (x, x), iters=5, repeats=1) > 0
  ticks = iter([0.0, 1.0, 5.0, 5.5, 10.0, 10.75])  # loops of 1.0, 0.5 and 0.75 s
  monkeypatch.setattr(timing, 'time', types.SimpleNamespace(perf_counter=lambda: next(ticks)))
  seconds = timing.time_in_loop(lambda a: a[0] @ a[1], (x, x), iters=5, repeats=3)
  assert seconds == 0.5 / 5


def test_time_in_loop_refuses_no_iterations():
  with pytest.raises(ValueError, match='iters must be positive'):
    timing.time_in_loop(lambda a: a[0], (jnp.ones(2),), iters=0)
