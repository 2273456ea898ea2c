"""Accelerator energy from NVML's total-energy counter, per phase of a run.

`nvmlDeviceGetTotalEnergyConsumption` counts millijoules since the driver
loaded and updates every 20-100 ms, so a phase is measured only over a
window of at least `MIN_WINDOW_S`, and the idle baseline (watts measured
while nothing runs, times the phase's duration) is subtracted. Scope: the
GPU board only (no host CPU, memory or cooling), as ML.ENERGY/Zeus report.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

MIN_WINDOW_S = 1.0


def available() -> str | None:
  """None when an NVIDIA device can be read, else why not."""
  try:
    import pynvml

    pynvml.nvmlInit()
    pynvml.nvmlDeviceGetTotalEnergyConsumption(pynvml.nvmlDeviceGetHandleByIndex(0))
  except Exception as e:  # no package, no driver, no device
    return f'NVML energy counter unavailable: {type(e).__name__}: {e}'
  return None


class Meter:
  """Energy of named phases on device `index`, idle baseline subtracted."""

  def __init__(self, index: int = 0, *, idle_seconds: float = 5.0):
    import pynvml

    pynvml.nvmlInit()
    self._nvml = pynvml
    self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    self.device = pynvml.nvmlDeviceGetName(self._handle)
    self.phases: dict[str, dict[str, Any]] = {}
    window = {}
    with self._window(window):
      time.sleep(idle_seconds)
    self.idle_watts = window['joules'] / window['seconds']

  def _joules(self) -> float:
    return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0

  @contextlib.contextmanager
  def _window(self, out: dict[str, float]) -> Iterator[None]:
    """Fills `out` with the joules and seconds of the block, over at least MIN_WINDOW_S."""
    start_j, start_t = self._joules(), time.perf_counter()
    yield
    while time.perf_counter() - start_t < MIN_WINDOW_S:  # the counter's resolution
      time.sleep(0.05)
    out.update(joules=self._joules() - start_j, seconds=time.perf_counter() - start_t)

  @contextlib.contextmanager
  def phase(self, name: str, *, answers: int) -> Iterator[None]:
    """Measures the block's energy; `answers` divides it into joules per answer."""
    window = {}
    with self._window(window):
      yield
    above_idle = window['joules'] - self.idle_watts * window['seconds']
    self.phases[name] = {
      **window,
      'joules_above_idle': above_idle,
      'answers': answers,
      'joules_per_answer': above_idle / answers if answers else None,
    }

  def to_json(self) -> dict[str, Any]:
    return {
      'device': self.device,
      'scope': 'GPU board only (NVML total energy counter); host CPU, memory and cooling excluded',
      'idle_watts': self.idle_watts,
      'min_window_s': MIN_WINDOW_S,
      'phases': self.phases,
    }
