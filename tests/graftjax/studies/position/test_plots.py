"""The sensitivity plot: a PNG is written, and exact zeros go to the 'exactly 0' band."""

import numpy as np

from graftjax.studies.position import plots

SCHEMES = ('rope', 'alibi')
OFFSETS = (0, 1, 64, 4096)


def _arm(value: float) -> dict:
  return {
    'kl_mean': value,
    'kl_max': value,
    'max_abs_diff': 10 * value,
    'byte_equal': int(value == 0),
    'samples': 1,
    'argmax_flips': 0,
    'rows': 4,
  }


def _result() -> dict:
  cells = []
  for scheme in SCHEMES:
    for m in OFFSETS:
      moved = 0.0 if scheme == 'alibi' or m == 0 else 1e-9 * (1 + m)
      cells.append(
        {
          'scheme': scheme,
          'dtype': 'float32',
          'offset': m,
          'relocated': _arm(moved),
          'control': _arm(moved / 2),
          'own_position': _arm(0.0),
        }
      )
  return {
    'schemes': list(SCHEMES),
    'dtypes': ['float32'],
    'offsets': list(OFFSETS),
    'cells': cells,
    'model': 'synthetic',
  }


def test_png_is_written(tmp_path):
  path = tmp_path / 'sensitivity.png'
  plots.plot_sensitivity(_result(), path)
  assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_zeros_are_drawn_on_the_band_not_on_the_log_axis(tmp_path):
  fig = plots.plot_sensitivity(_result(), tmp_path / 'sensitivity.png')
  log_axes = [ax for ax in fig.axes if ax.get_yscale() == 'log']
  bands = [ax for ax in fig.axes if ax.get_ylabel() == 'exactly 0']
  assert len(log_axes) == 2 and bands
  for ax in log_axes:
    ys = np.concatenate([line.get_ydata() for line in ax.get_lines()])
    assert np.all(np.isnan(ys) | (ys > 0))  # no zero, no invented floor
    assert np.sum(~np.isnan(ys)) == 2 * 3  # rope: relocated and control at M = 1, 64, 4096
  band = bands[0]
  zeros = sum(len(line.get_xdata()) for line in band.get_lines())
  assert zeros == 2 * 1 + 2 * len(OFFSETS)  # rope at M = 0; alibi everywhere (two arms each)
  assert [t.get_text() for t in band.get_yticklabels()][0] == 'rope f32 relocated'
  assert band.get_xscale() == 'symlog'
