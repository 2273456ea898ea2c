"""Device kernels from a jax trace: run a call under the profiler, sum its kernels by name.

`trace(fn)` runs fn once under `jax.profiler.trace` and returns the device's kernel events
(read with `jax.profiler.ProfileData`); `summarize` sums them by name and measures how long
the device was busy. On a CPU backend, XLA's CPU threads stand in for the device (their
events nest: a loop's event holds its body's, so per-name totals overlap there).
"""

from __future__ import annotations

from collections.abc import Callable
import pathlib
import tempfile
import time

import jax

# Lines of a device plane that repeat its kernels under other names (XLA ops, modules).
_SUMMARY_LINES = ('XLA Modules', 'XLA Ops', 'Steps', 'Source')
# On a CPU backend: the threads that run XLA's compiled code.
_CPU_LINES = ('tf_XLAPjRtCpuClient', 'tf_XLAEigen')


def device_events(xspace_path: str) -> list[tuple[str, float, float]]:
  """(name, start_ns, duration_ns) of every kernel on the device planes' stream lines;
  without a device plane (CPU backend), of XLA's CPU client threads' events."""
  from jax.profiler import ProfileData

  planes = list(ProfileData.from_file(xspace_path).planes)
  devices = [p for p in planes if p.name.startswith('/device:')]
  events = []
  for plane in devices or [p for p in planes if p.name == '/host:CPU']:
    for line in plane.lines:
      if line.name.startswith(_SUMMARY_LINES):
        continue
      if not devices and not line.name.startswith(_CPU_LINES):
        continue
      events += [(e.name, e.start_ns, e.duration_ns) for e in line.events if e.duration_ns > 0]
  return events


def busy_ns(events: list[tuple[str, float, float]]) -> float:
  """Length of the union of the events' intervals."""
  total, end = 0.0, float('-inf')
  for _, start, duration in sorted(events, key=lambda e: e[1]):
    stop = start + duration
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


def summarize(events: list[tuple[str, float, float]], *, wall_s: float, top: int) -> dict:
  """Per kernel name: calls and microseconds, largest first; and device busy time."""
  by_name: dict[str, list[float]] = {}
  for name, _, duration in events:
    by_name.setdefault(name, []).append(duration)
  kernels = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))
  return {
    'wall_us': wall_s * 1e6,
    'device_busy_us': busy_ns(events) / 1e3,
    'kernel_calls': len(events),
    'kernels': [
      {'name': name, 'calls': len(d), 'total_us': sum(d) / 1e3, 'mean_us': sum(d) / len(d) / 1e3}
      for name, d in kernels[:top]
    ],
  }


def trace(fn: Callable[[], object]) -> tuple[list[tuple[str, float, float]], float]:
  """Runs fn once under the profiler: (device events, wall seconds)."""
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      wall_s = time.perf_counter() - t0
    (path,) = pathlib.Path(tmp).rglob('*.xplane.pb')
    return device_events(str(path)), wall_s
