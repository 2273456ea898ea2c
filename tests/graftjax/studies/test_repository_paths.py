"""Paths the studies compute from their own file name point into this repository."""

import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
  'module, name, want',
  [
    ('graftjax.studies.model.bench_model', 'PEERS', ROOT / 'experiments' / 'peers'),
    ('graftjax.studies.graft.bench_graft', 'PEERS', ROOT / 'experiments' / 'peers'),
    ('graftjax.studies.model.reference_agreement', 'REPO_ROOT', ROOT),
    ('graftjax.studies.position.position_sweep', 'REPO_ROOT', ROOT),
  ],
)
def test_a_study_finds_the_repository(module, name, want):
  path = getattr(importlib.import_module(module), name)
  assert path == want and path.is_dir()
