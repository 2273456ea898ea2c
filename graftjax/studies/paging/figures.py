"""Figures of the paging scale study (`paging_scale`), drawn with matplotlib's Agg canvas."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
from matplotlib.backends import backend_agg
from matplotlib.figure import Figure


def scale_figure(result: dict[str, Any]):
  """Access latency (median, p10-p90) and memory against pages stored (log axes).

  Memory: the device's bytes in use where `memory_stats()` gives them, the
  bytes of live jax arrays always, and the store's bytes on disk for scale.
  """
  rows = result['rows']
  n = np.array([r['pages'] for r in rows], np.float64)
  fig = Figure(figsize=(10, 4), layout='constrained')
  backend_agg.FigureCanvasAgg(fig)
  left, right = fig.subplots(1, 2)
  ms = lambda key: np.array([r[key] * 1e3 for r in rows])
  left.fill_between(n, ms('access_p10_s'), ms('access_p90_s'), alpha=0.2, label='p10-p90')
  left.plot(n, ms('access_median_s'), 'o-', label='access (median)')
  for key, label in (
    ('route_median_s', 'route'),
    ('read_verify_median_s', 'read + verify'),
    ('install_median_s', 'install'),
  ):
    left.plot(n, ms(key), '.--', linewidth=1, label=label)
  left.set_xscale('log')
  left.set_xlabel('pages stored')
  left.set_ylabel('ms per query')
  left.set_ylim(bottom=0)
  left.grid(True, alpha=0.3)
  left.legend(fontsize=8)
  mib = lambda values: np.array(values, np.float64) / 2**20
  stats = [r['device_memory']['memory_stats'] or {} for r in rows]
  if all('bytes_in_use' in s for s in stats):
    right.plot(n, mib([s['bytes_in_use'] for s in stats]), 'o-', label='device bytes in use')
  right.plot(
    n, mib([r['device_memory']['live_array_bytes'] for r in rows]), 's-', label='live jax arrays'
  )
  right.plot(n, mib([r['disk']['bytes'] for r in rows]), '^:', color='gray', label='store on disk')
  right.set_xscale('log')
  right.set_yscale('log')
  right.set_xlabel('pages stored')
  right.set_ylabel('MiB')
  right.grid(True, alpha=0.3)
  right.legend(fontsize=8)
  platform = rows[0]['device_memory']['platform'] if rows else '?'
  fig.suptitle(
    f'{result["model"]} {result["dtype"]} on {platform}: pages of'
    f' {result["summary"]["page_tokens"]} tokens, window {result["summary"]["window_slots"]:,}'
    ' slots',
    fontsize=10,
  )
  return fig


def write_figure(result: dict[str, Any], out: str | os.PathLike) -> list[pathlib.Path]:
  """The figure as a PNG beside `out` (same stem); [] when nothing was measured yet."""
  if not result['rows']:
    return []
  path = pathlib.Path(out).with_suffix('.png')
  scale_figure(result).savefig(path, dpi=120)
  return [path]
