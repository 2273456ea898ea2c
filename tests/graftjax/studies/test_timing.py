"""graftjax.studies.timing: both clocks return per-call seconds and the output."""

import jax.numpy as jnp
import numpy as np
import pytest

from graftjax.studies import timing


def test_time_calls_returns_times_and_the_output():
  x = jnp.arange(8.0)
  times, out = timing.time_calls(lambda: x * 2, warmup=0, repeats=3)
  assert len(times) == 3 and min(times) > 0
  np.testing.assert_array_equal(out, np.arange(8.0) * 2)


def test_time_in_loop_is_per_call():
  x = jnp.ones((64, 64))
  seconds = timing.time_in_loop(lambda a: a[0] @ a[1], (x, x), iters=5, repeats=1)
  assert 0 < seconds < 1


def test_time_in_loop_refuses_no_iterations():
  with pytest.raises(ValueError, match='iters must be positive'):
    timing.time_in_loop(lambda a: a[0], (jnp.ones(2),), iters=0)
