"""Routers abstain at a threshold fitted on one labelled split and reported on a disjoint one."""

import math

import pytest

from graftjax import stats
from graftjax.routing import route


class _Table(route.Router):
  """Ranks by a table: query -> [(entry index, score)]."""

  kind = 'table'

  def __init__(self, table, threshold=None):
    super().__init__(threshold=threshold)
    self.table = table

  def _rank_many(self, queries):
    return [iter(self.table.get(q, ())) for q in queries]


KEYS = [f'k{i}' for i in range(8)]


def _byte_ids(text):
  return [1 + b % 200 for b in text.encode()]


def _router():
  """Deposited queries d<i> score 1.0 on their key, reworded r<i> 0.8 (r6, r7: the wrong
  key), unrelated u<i> 0.3 + 0.05 i on key 0."""
  table = {f'd{i}': [(i, 1.0)] for i in range(8)}
  table |= {f'r{i}': [(i if i < 6 else 0, 0.8)] for i in range(8)}
  table |= {f'u{i}': [(0, 0.3 + 0.05 * i)] for i in range(8)}
  router = _Table(table)
  router.add_many((key, f'text {key}') for key in KEYS)
  return router


QUERIES = route.Queries(
  deposited=[(f'd{i}', KEYS[i]) for i in range(8)],
  reworded=[(f'r{i}', KEYS[i]) for i in range(8)],
  unrelated=[f'u{i}' for i in range(8)],
)


def test_no_router_ships_a_threshold_that_routes_before_it_is_fitted(tiny_model):
  table = _Table({'a stored question': [(0, 0.5)]})
  embedding = route.EmbeddingRouter(tiny_model, chunk_size=8, batch_size=2, encode=_byte_ids)
  for router in (table, route.BM25Router(), embedding):
    router.add('k', 'a stored question')
    with pytest.raises(ValueError, match='has no threshold'):
      router.route('a stored question')
    assert router.route('a stored question', threshold=-math.inf)  # an explicit one routes
  assert route.ExactRouter().route('anything') == []  # exact: hits only on equal text


def test_split_halves_each_group_disjointly_and_reproducibly():
  fit_on, report_on, chosen = route.split(QUERIES, seed=3)
  assert fit_on.counts() == report_on.counts() == {'deposited': 4, 'reworded': 4, 'unrelated': 4}
  for name in ('deposited', 'reworded', 'unrelated'):
    both = [*getattr(fit_on, name), *getattr(report_on, name)]
    assert sorted(both) == sorted(getattr(QUERIES, name))
    assert [getattr(QUERIES, name)[i] for i in chosen['calibration'][name]] == list(
      getattr(fit_on, name)
    )
  assert route.split(QUERIES, seed=3) == (fit_on, report_on, chosen)
  assert route.split(QUERIES, seed=4)[2] != chosen


def test_calibrate_fits_on_one_split_and_reports_on_the_other():
  router = _router()
  found = route.calibrate(router, QUERIES, seed=0, max_false_hit=0.0)
  fit_on, report_on, chosen = route.split(QUERIES, seed=0)
  highest_unrelated = max(0.3 + 0.05 * int(q[1:]) for q in fit_on.unrelated)
  assert found.threshold > highest_unrelated and router.threshold == found.threshold
  assert found.bounded == 'unrelated' and found.split == chosen
  assert found.fitted.false_hit_abstain == stats.rate(0, 4)
  rep = found.report
  assert rep.deposited == stats.rate(4, 4)
  right = sum(int(q[1:]) < 6 for q, _ in report_on.reworded)
  assert rep.reworded == stats.rate(right, 4)
  wrongly = sum(0.3 + 0.05 * int(q[1:]) >= found.threshold for q in report_on.unrelated)
  assert rep.false_hit == stats.rate(wrongly, 4)
  body = found.to_json()
  assert body['threshold'] == found.threshold and body['split']['seed'] == 0
  assert body['sizes']['report'] == {'deposited': 4, 'reworded': 4, 'unrelated': 4}
  assert set(body['report']) == {'threshold', 'deposited', 'reworded', 'false_hit'}
  assert body['report']['false_hit']['low'] == rep.false_hit.low  # Wilson interval kept


def test_without_unrelated_queries_the_fit_bounds_wrong_hits_among_all():
  router = _router()
  queries = route.Queries(QUERIES.deposited, QUERIES.reworded)
  for seed in range(4):
    found = route.calibrate(router, queries, seed=seed, max_false_hit=0.0)
    fit_on, report_on, _ = route.split(queries, seed=seed)
    wrong = any(int(q[1:]) >= 6 for q, _ in fit_on.reworded)  # r6, r7 hit the wrong key
    assert found.bounded == 'all' and found.threshold == (1.0 if wrong else 0.8)
    right = 0 if wrong else sum(int(q[1:]) < 6 for q, _ in report_on.reworded)
    assert found.report.false_hit is None and found.report.reworded.successes == right


def test_report_by_hand():
  rep = route.report(_router(), QUERIES, 0.5)
  assert rep.deposited == stats.rate(8, 8) and rep.reworded == stats.rate(6, 8)
  assert rep.false_hit == stats.rate(4, 8)  # u4..u7 score 0.5..0.65
  assert route.report(_router(), QUERIES, math.inf).to_json()['threshold'] == 'inf'


def test_calibration_refuses_overlapping_or_too_few_queries():
  same = route.Queries(deposited=[('d0', 'k0'), ('d1', 'k1')], reworded=[('D0', 'k0')] * 2)
  with pytest.raises(ValueError, match='in both the calibration and the report split'):
    route.calibrate(_router(), same)
  with pytest.raises(ValueError, match='too few queries'):
    route.calibrate(_router(), route.Queries(deposited=[('d0', 'k0')]))


def _many(unrelated: int, leaky: int = 0):
  """8 deposited (1.0) and 8 reworded (0.8) queries; `unrelated` ones scoring 0.3 + a little
  each, but for `leaky` of the report half (split seed 0) that score 0.9, above every
  reworded query."""
  queries = route.Queries(
    deposited=[(f'd{i}', KEYS[i]) for i in range(8)],
    reworded=[(f'r{i}', KEYS[i]) for i in range(8)],
    unrelated=[f'u{i}' for i in range(unrelated)],
  )
  table = {f'd{i}': [(i, 1.0)] for i in range(8)} | {f'r{i}': [(i, 0.8)] for i in range(8)}
  table |= {f'u{i}': [(0, 0.3 + 1e-4 * i)] for i in range(unrelated)}
  table |= {q: [(0, 0.9)] for q in route.split(queries, seed=0)[1].unrelated[:leaky]}
  router = _Table(table)
  router.add_many((key, f'text {key}') for key in KEYS)
  return router, queries


def test_a_conservative_fit_bounds_held_out_false_hits_by_their_wilson_upper_limit():
  """The point-estimate fit on 25 unrelated questions promised 5% and gave 12% held out."""
  router, queries = _many(146)
  found = route.calibrate(router, queries, max_false_hit=0.05, conservative=True)
  assert found.conservative and found.fitted.false_hit_abstain.high <= 0.05
  assert found.report.false_hit == stats.rate(0, 73)
  bound = found.held_out
  assert bound.met and bound.upper == found.report.false_hit.high <= 0.05 and bound.why is None
  assert found.to_json()['held_out'] == {
    'max_false_hit': 0.05,
    'upper': bound.upper,
    'met': True,
    'needed': 73,
    'why': None,
  }


def test_too_few_unrelated_queries_cannot_bound_and_say_so():
  router, queries = _many(70)
  with pytest.raises(route.BoundError, match=r'with 70 unrelated.*holds 35.*at least 73 \(146'):
    route.calibrate(router, queries, max_false_hit=0.05, conservative=True)
  assert router.threshold is None  # nothing fitted
  found = route.calibrate(router, queries, max_false_hit=0.05)  # the point estimate fits
  assert not found.held_out.met
  assert found.held_out.why.startswith('35 unrelated queries held out: even 0 false hits')
  assert 'at least 73 are needed' in found.held_out.why
  labelled_only = route.Queries(queries.deposited, queries.reworded)
  with pytest.raises(route.BoundError, match='with 16 labelled queries'):
    route.check_bound(labelled_only, max_false_hit=0.05)
  with pytest.raises(route.BoundError, match='must lie in'):
    route.check_bound(queries, max_false_hit=0.0)


def test_false_hits_held_out_above_the_bound_are_reported_as_such():
  router, queries = _many(400, leaky=12)
  found = route.calibrate(router, queries, max_false_hit=0.05, conservative=True)
  assert found.fitted.false_hit_abstain == stats.rate(0, 200)  # the fit half saw none
  assert found.report.false_hit == stats.rate(12, 200)
  assert not found.held_out.met
  assert found.held_out.why == (
    f'12/200 false hits held out: Wilson upper limit {found.report.false_hit.high:.1%} > 5.0%'
  )
