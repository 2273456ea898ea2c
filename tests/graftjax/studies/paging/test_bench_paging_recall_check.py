"""bench_paging_recall refuses settings it cannot measure before any work."""

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

from graftjax.studies.paging import bench_paging_recall
from graftjax.studies.paging import paging_scale

REPO = pathlib.Path(__file__).resolve().parents[4]
GOOD = bench_paging_recall.Settings(
  model_name='tiny',
  page_tokens=128,
  overlaps=[0, 64],
  boundary_facts=3,
  facts=8,
  absent=4,
  short_pages=20,
  thresholds=[0.0, 0.5],
  chunk_size=64,
  seed=0,
  filler=['x'] * 32,
)


@pytest.mark.parametrize(
  'change, match',
  [
    ({'boundary_facts': 0}, 'boundary_facts must be at least 1, got 0'),
    ({'facts': 1}, 'facts must be at least 2'),
    ({'absent': 0}, 'absent must be at least 2'),
    ({'overlaps': [0, 128]}, r'overlaps must lie in \[0, page_tokens\)'),
    ({'thresholds': []}, 'thresholds'),
    ({'needle_set': 'nope'}, 'needle_set must be one of'),
    ({'rerank_wordings': ['sideways']}, 'rerank_wordings must be some of'),
    ({'rerank_weighting': 'tf'}, 'rerank_weighting must be one of'),
    ({'recall_at': [0]}, 'recall_at must be integers >= 1'),
    ({'rerank': -1}, 'rerank and rerank_rare must be >= 0'),
    ({'weights': [1.5]}, r'weights must lie in \[0, 1\]'),
  ],
)
def test_settings_it_cannot_measure_are_refused_before_the_model_loads(monkeypatch, change, match):
  def never(*args, **kwargs):
    raise AssertionError('the model was loaded')

  monkeypatch.setattr(paging_scale, 'load_model', never)
  bench_paging_recall.check(GOOD)
  with pytest.raises(ValueError, match=match):
    bench_paging_recall.experiment(dataclasses.replace(GOOD, **change))


def test_boundary_facts_zero_is_a_usage_error_of_the_script(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      str(REPO / 'experiments' / 'bench_paging_recall.py'),
      '--boundary_facts=0',
      '--router_model=',
      f'--out={tmp_path / "r.json"}',
    ],
    cwd=REPO,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode != 0 and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
  assert 'boundary_facts must be at least 1, got 0' in proc.stderr
  assert not (tmp_path / 'r.json').exists()
