"""The paging docs' routers take a fitted threshold: 0.0 abstains on nothing."""

import pathlib
import re

import numpy as np
import pytest

from graftjax.routing import route as route_lib
from graftjax.routing import units as units_lib

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIRST = ['Amelia', 'Dorian', 'Jasper', 'Xavier', 'Odette', 'Ingrid', 'Tobias', 'Leona']
LAST = ['Abernathy', 'Vasquez', 'Yamamoto', 'Zielinski', 'Okafor', 'Lindqvist', 'Moreau', 'Hale']
FILLER = ' '.join(f'word{i}' for i in range(30))
PAGES = [
  (f'page/{i}', f'{FILLER} {first} {last} teaches {i + 3} classes of Latin. {FILLER}')
  for i, (first, last) in enumerate(zip(FIRST, LAST))
]
ASKED = [
  (f'How many classes does {f} {l} teach?', f'page/{i}')
  for i, (f, l) in enumerate(zip(FIRST, LAST))
]
# Names the store lacks (their first or last name alone is stored).
ABSENT = [f'How many classes does {f} {l} teach?' for f, l in zip(FIRST, LAST[1:] + LAST[:1])]
ABSENT += [f'How many classes does Quentin {l} teach?' for l in LAST]


def test_a_router_at_threshold_zero_abstains_on_nothing_and_a_fitted_one_does():
  unfitted = units_lib.UnitRouter(threshold=0.0, unit_words=16)
  unfitted.add_many(PAGES)
  assert all(unfitted.route(q) for q in ABSENT)  # every absent name goes to some page
  router = units_lib.UnitRouter(threshold=None, unit_words=16)
  router.add_many(PAGES)
  fit = route_lib.calibrate(router, route_lib.Queries(deposited=ASKED, unrelated=ABSENT))
  assert router.threshold == fit.threshold > 0.0
  assert sum(bool(router.route(q)) for q in ABSENT) < len(ABSENT) / 2
  assert [h.key for q, key in ASKED for h in router.route(q)] == [key for _, key in ASKED]


def test_no_documented_router_has_threshold_zero():
  for path in (ROOT / 'docs' / 'paging.md', ROOT / 'graftjax' / 'routing' / 'units.py'):
    text = path.read_text()
    assert not re.findall(r'Router\([^)]*threshold=0\.0', text), path
    assert 'calibrate(' in text, path


def test_the_documented_hybrid_router_takes_no_threshold_until_fitted(tiny_model):
  router = units_lib.HybridRouter(tiny_model, threshold=None, rerank=2, unit_words=16)
  router.add_many(PAGES[:2])
  with pytest.raises(ValueError, match='no threshold'):
    router.route(ASKED[0][0])
  assert router.route(ASKED[0][0], threshold=-np.inf)
