"""Figures of position sensitivity, drawn with matplotlib's Agg canvas (no display).

`plot_sensitivity(result, path)` draws, for a `position_sweep.run_sweep`
result, KL mean and max |Δlogit| against the offset M: one line per scheme
and dtype, solid for the relocated graft, dashed for the graft-free control.
The offset axis is symlog, so M = 0 sits at its left end. Values that are
exactly 0 cannot sit on a log axis: they are drawn as markers on a band
labelled 'exactly 0' below it, one row per line, never at an axis floor.
"""

from __future__ import annotations

import os
from typing import Any

from matplotlib import ticker
from matplotlib.backends import backend_agg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
import numpy as np

METRICS = (('kl_mean', 'KL mean (nats)'), ('max_abs_diff', 'max |Δlogit|'))
PLOTTED_ARMS = (
  ('relocated', '-', 'relocated (filled)'),
  ('control', '--', 'control fresh(0) (hollow)'),
)
DTYPE_MARKERS = {'float32': 'o', 'bfloat16': 's'}
DTYPE_SHORT = {'float32': 'f32', 'bfloat16': 'bf16'}


def _series(result: dict[str, Any]) -> list[dict[str, Any]]:
  """One entry per (scheme, dtype, arm): offsets and both metrics, offset-sorted."""
  colors = {s: f'C{i}' for i, s in enumerate(result['schemes'])}
  out = []
  for scheme in result['schemes']:
    for dtype in result['dtypes']:
      cells = sorted(
        (c for c in result['cells'] if (c['scheme'], c['dtype']) == (scheme, dtype)),
        key=lambda c: c['offset'],
      )
      for arm, style, _ in PLOTTED_ARMS:
        out.append(
          {
            'label': f'{scheme} {DTYPE_SHORT.get(dtype, dtype)} {arm}',
            'offsets': np.array([c['offset'] for c in cells], np.float64),
            'values': {m: np.array([c[arm][m] for c in cells], np.float64) for m, _ in METRICS},
            'color': colors[scheme],
            'linestyle': style,
            'marker': DTYPE_MARKERS.get(dtype, 'D'),
            'filled': arm == 'relocated',
          }
        )
  return out


def _marker_style(s: dict[str, Any]) -> dict[str, Any]:
  return {
    'color': s['color'],
    'marker': s['marker'],
    'markersize': 5,
    'markerfacecolor': s['color'] if s['filled'] else 'none',
  }


def _draw_metric(log_ax, zero_ax, series, metric: str, label: str) -> None:
  """Nonzero values on `log_ax` (log y); exact zeros as markers on `zero_ax` rows."""
  for s in series:
    y = s['values'][metric]
    log_ax.plot(
      s['offsets'],
      np.where(y > 0, y, np.nan),
      linestyle=s['linestyle'],
      linewidth=1.2,
      **_marker_style(s),
    )
  for row, s in enumerate(series):
    zero = s['values'][metric] == 0
    zero_ax.plot(s['offsets'][zero], np.full(zero.sum(), row), linestyle='none', **_marker_style(s))
  log_ax.set_yscale('log')
  log_ax.set_ylabel(label)
  log_ax.grid(True, which='major', alpha=0.3)
  zero_ax.set_ylim(len(series) - 0.5, -0.5)
  zero_ax.set_yticks(range(len(series)), [s['label'] for s in series], fontsize=6)
  zero_ax.set_ylabel('exactly 0', rotation=0, ha='right', va='center', labelpad=8)
  zero_ax.yaxis.set_label_coords(-0.02, 1.0 + 0.4 / max(1, len(series)))
  zero_ax.grid(True, axis='x', alpha=0.3)
  offsets = sorted({float(m) for s in series for m in s['offsets']})
  zero_ax.set_xscale('symlog', linthresh=1.0, linscale=0.5)
  zero_ax.set_xlim(-0.4, 1.6 * max(offsets[-1], 1.0))
  zero_ax.set_xticks(offsets, [f'{m:g}' for m in offsets], fontsize=7, rotation=45)
  zero_ax.xaxis.set_minor_locator(ticker.NullLocator())
  zero_ax.set_xlabel('block offset M (symlog: 0 at the left)')


def _legend(fig, result: dict[str, Any]) -> None:
  handles = [
    Line2D([], [], color=f'C{i}', linewidth=2, label=s) for i, s in enumerate(result['schemes'])
  ]
  handles += [
    Line2D(
      [],
      [],
      color='gray',
      linestyle=style,
      marker='o',
      label=label,
      markerfacecolor='gray' if arm == 'relocated' else 'none',
    )
    for arm, style, label in PLOTTED_ARMS
  ]
  handles += [
    Line2D([], [], color='gray', linestyle='none', marker=DTYPE_MARKERS.get(d, 'D'), label=d)
    for d in result['dtypes']
  ]
  fig.legend(
    handles=handles,
    loc='upper center',
    ncol=min(len(handles), 6),
    fontsize=8,
    frameon=False,
    bbox_to_anchor=(0.5, 0.965),
  )


def sensitivity_figure(result: dict[str, Any]) -> Figure:
  """The figure of `plot_sensitivity`: per metric, a log axis above its 'exactly 0' band."""
  series = _series(result)
  band = 0.12 * len(series) + 0.2
  fig = Figure(figsize=(12, 4.6 + band), layout='constrained')
  backend_agg.FigureCanvasAgg(fig)
  grid = fig.add_gridspec(2, 2, height_ratios=(4.0, band))
  for col, (metric, label) in enumerate(METRICS):
    log_ax = fig.add_subplot(grid[0, col])
    zero_ax = fig.add_subplot(grid[1, col], sharex=log_ax)
    _draw_metric(log_ax, zero_ax, series, metric, label)
    log_ax.tick_params(labelbottom=False)
    if col:
      zero_ax.tick_params(labelleft=False)
      zero_ax.set_ylabel('')
  source = ' '.join(str(result[k]) for k in ('model', 'device') if result.get(k))
  title = 'relocated graft and graft-free control vs fresh at M'
  fig.suptitle(f'{source}: {title}' if source else title, y=0.995, va='top', fontsize=11)
  _legend(fig, result)
  fig.get_layout_engine().set(rect=(0, 0, 1, 0.88))
  return fig


def plot_sensitivity(result: dict[str, Any], path: str | os.PathLike) -> Figure:
  """Writes the sensitivity figure of a sweep result as a PNG at `path`; returns it."""
  fig = sensitivity_figure(result)
  fig.savefig(path, dpi=130)
  return fig
