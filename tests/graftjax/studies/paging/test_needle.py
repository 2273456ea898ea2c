"""needle: facts planted at known places, answered paged and by the base model."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

from graftjax.studies.common import corpus
from graftjax.studies.paging import needle
from graftjax.studies.paging import paging_scale


def test_facts_are_planted_whole_at_their_offsets():
  tokenizer = corpus.ByteTokenizer()
  page_ids, planted, _, _ = needle.plant(
    tokenizer, needles=5, page_tokens=160, pages_per_window=2, margin=16, seed=0
  )
  assert page_ids.shape == (6, 160) and len(planted) == 5
  assert len({n.name for n in planted}) == 5 and len({n.number for n in planted}) == 5
  for n in planted:
    text = paging_scale.decode(tokenizer, page_ids[n.page][n.offset :])
    assert text.startswith(n.fact), (text[:60], n.fact)
  assert needle.first_number(' 4821.') == 4821 and needle.first_number('none') is None


@pytest.mark.slow
def test_experiment_runs_both_arms_with_wilson_intervals():
  result = needle.experiment(
    needle.Settings(
      model_name='tiny',
      dtype='float32',
      needles=3,
      page_tokens=128,
      pages_per_window=2,
      answer_tokens=2,
      chunk_size=64,
      question_chunk=8,
    ),
    progress=False,
  )
  s = result['summary']
  assert s['needles'] == 3 and s['stored_pages'] == 4 and s['base_window_tokens'] == 255
  for arm in ('paged', 'base', 'routing_top1'):
    key = arm if arm == 'routing_top1' else f'{arm}_accuracy'
    low, high = s[f'{key}_wilson95']['low'], s[f'{key}_wilson95']['high']
    assert 0 <= low <= s[key] <= high <= 1
  assert s['routing_top1'] == 1.0  # the names are distinct words in a 4-page catalog
  assert s['paged_first_logits_equal_fresh_prefill'] is True
  assert all({'paged_right', 'base_right', 'access_s'} <= set(r) for r in result['rows'])
  json.dumps(result)


def test_needles_join_a_grown_store_and_route_over_all_of_it(tmp_path):
  kwargs = dict(model_name='tiny', dtype='float32')
  grown = paging_scale.experiment(
    paging_scale.Settings(
      **kwargs,
      impl='xla',
      store_dir=tmp_path,
      page_tokens=128,
      local_rows=0,
      window_slots=512,
      sizes=[6],
      queries=2,
      chunk_size=64,
      threads=2,
    ),
    progress=False,
  )
  result = needle.experiment(
    needle.Settings(
      **kwargs,
      store_dir=str(tmp_path),
      needles=2,
      page_tokens=128,
      pages_per_window=2,
      answer_tokens=1,
      chunk_size=64,
      question_chunk=8,
    ),
    progress=False,
  )
  s = result['summary']
  assert s['needle_pages'] == 2 and s['stored_pages'] == 6 + 2
  assert s['stored_tokens'] == grown['summary']['stored_tokens'] + 2 * 128
  assert result['routed_over'] == f'the store at {tmp_path}'
  assert all('routed_right' in r for r in result['rows'])


_ARMS = dict(answer_tokens=1, chunk_size=64, question_chunk=8)
LOCKER = needle.Template(
  fact='The locker of {name} has number {number}.',
  question='Which locker is the one of {name}?',
  answer='The locker of {name} has number',
)


def test_boundary_facts_are_cut_by_plain_pages_and_whole_with_overlap():
  tokenizer = corpus.ByteTokenizer()
  kwargs = dict(needles=4, page_tokens=200, pages_per_window=2, margin=64, seed=1)
  for overlap in (0, 96):
    page_ids, planted, docs, spans = needle.plant(
      tokenizer, **kwargs, placement='boundary', overlap=overlap, templates=(LOCKER,)
    )
    crossing = [n for n in planted if n.at_boundary]
    assert len(crossing) == 2  # the first page of each two-page window
    for n in planted:
      assert paging_scale.decode(tokenizer, docs[n.window][n.span[0] : n.span[1]]) == n.fact
      whole = [
        p
        for p, (w, begin, end) in enumerate(spans)
        if w == n.window and begin <= n.span[0] and n.span[1] <= end
      ]
      assert bool(whole) is (overlap > 0 or not n.at_boundary), (overlap, n)
      assert (n.fact in paging_scale.decode(tokenizer, page_ids[n.page][1:])) is bool(whole)
  assert len(page_ids) > 4 and {n.template for n in planted} == {LOCKER}


def test_templates_haystack_and_placement_are_checked(tmp_path):
  path = tmp_path / 'facts.json'
  path.write_text(json.dumps([dataclasses.asdict(LOCKER), dataclasses.asdict(needle.ACCESS_CODE)]))
  assert needle.load_templates(path) == (LOCKER, needle.ACCESS_CODE)
  assert needle.load_templates('four')[0] == needle.ACCESS_CODE
  for template in needle.load_templates('four'):
    template.check()
  bad = {
    'no name': [{'fact': 'x {number}', 'question': '{name}?', 'answer': '{name}'}],
    'no number': [{'fact': '{name} x', 'question': '{name}?', 'answer': '{name}'}],
    'other field': [{'fact': '{name} {number} {oops}', 'question': '{name}?', 'answer': '{name}'}],
    'not a list': {'fact': '{name} {number}'},
  }
  for rows in bad.values():
    path.write_text(json.dumps(rows))
    with pytest.raises(needle.NeedleError):
      needle.load_templates(path)
  path.write_text('{')
  with pytest.raises(needle.NeedleError, match='not JSON'):
    needle.load_templates(path)
  with pytest.raises(needle.NeedleError, match='cannot read'):
    needle.load_templates(tmp_path / 'missing.json')
  short = tmp_path / 'short.txt'
  short.write_text('too little text\n')
  kwargs = dict(needles=2, page_tokens=128, pages_per_window=2, margin=16, seed=0)
  with pytest.raises(needle.NeedleError, match='haystack holds'):
    needle.plant(corpus.ByteTokenizer(), **kwargs, haystack=[short])
  with pytest.raises(needle.NeedleError, match='router'):
    needle.experiment(
      needle.Settings(model_name='tiny', dtype='float32', router='nope', **kwargs, **_ARMS)
    )
  with pytest.raises(needle.NeedleError, match='placement'):
    needle.plant(corpus.ByteTokenizer(), **kwargs, placement='anywhere')


@pytest.mark.slow
def test_a_users_needle_set_reports_neighbours_boundaries_and_confusions(tmp_path):
  haystack = tmp_path / 'notes.txt'
  haystack.write_text(
    ''.join(f'line {i} of the notes about nothing in particular\n' for i in range(200))
  )
  result = needle.experiment(
    needle.Settings(
      model_name='tiny',
      dtype='float32',
      needles=4,
      page_tokens=128,  # the shapes of the run above: its compiled programs serve
      pages_per_window=2,
      answer_tokens=2,
      chunk_size=64,
      question_chunk=8,
      margin=56,
      templates=(LOCKER, LOCKER, needle.ACCESS_CODE),  # windows: (locker, locker), (code, locker)
      placement='mixed',
      overlap=64,
      haystack=[haystack],
      router='units',
    ),
    progress=False,
  )
  s, rows = result['summary'], result['rows']
  assert result['router'] == 'units'
  assert [r['same_template_neighbours'] for r in rows] == [1, 1, 0, 0]
  assert s['base_accuracy_same_template_neighbour']['n'] == 2
  assert s['base_accuracy_no_same_template_neighbour']['n'] == 2
  assert [r['at_boundary'] for r in rows] == [True, False, True, False]
  assert s['paged_accuracy_at_boundary']['n'] == 2 and s['paged_accuracy_inside_a_page']['n'] == 2
  assert s['stored_pages'] > 4 and result['overlap'] == 64 and result['placement'] == 'mixed'
  assert result['corpus'] == [str(haystack)] and len(result['templates']) == 2
  numbers = {r['number'] for r in rows}
  for r in rows:
    for arm in ('paged', 'base'):
      other = r[f'{arm}_confused_with']
      assert other is None or (
        other != r['name'] and needle.first_number(r[f'{arm}_answer']) in numbers
      )
  assert s['paged_distractor_confusions'] == sum(r['paged_confused_with'] is not None for r in rows)
  assert s['paged_first_logits_equal_fresh_prefill'] is True
  assert 'same-template neighbour' in needle.format_summary(result)
  json.dumps(result)


def test_a_users_needle_set_runs_from_the_command_line(tmp_path):
  templates = tmp_path / 'facts.json'
  templates.write_text(json.dumps([dataclasses.asdict(LOCKER)]))
  haystack = tmp_path / 'notes.txt'
  haystack.write_text(''.join(f'note {i}: nothing of interest here at all\n' for i in range(100)))
  out = tmp_path / 'needle.json'
  script = pathlib.Path(__file__).resolve().parents[4] / 'experiments' / 'needle.py'
  done = subprocess.run(
    [
      sys.executable,
      str(script),
      '--model=tiny',
      '--needles=2',
      '--page_tokens=128',
      '--pages_per_window=2',
      '--answer_tokens=1',
      '--chunk_size=64',
      '--margin=48',
      f'--templates={templates}',
      f'--haystack={haystack}',
      '--placement=boundary',
      '--overlap=48',
      f'--out={out}',
    ],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  result = json.loads(out.read_text())
  assert result['templates'] == [dataclasses.asdict(LOCKER)]
  assert result['corpus'] == [str(haystack)] and result['placement'] == 'boundary'
  assert [r['at_boundary'] for r in result['rows']] == [True, False]


@pytest.mark.slow
def test_the_committed_overlap_run_routes_every_boundary_fact_to_a_page_holding_it():
  """experiments/results/paging/paging_needle_mixed_overlap64_cpu.json: its pages (planted with
  gemma-3-270m's tokenizer; no model runs) routed by units as that run routed them. Two of its
  12 boundary questions tied exactly with the page before, which holds only the question's
  words, and went there by insertion order."""
  from graftjax.models.gemma import gguf
  from graftjax.models.gemma import tokenizer as tokenizer_lib
  from graftjax.routing import units as units_lib

  tokenizer = tokenizer_lib.Tokenizer.from_gguf(gguf.open_gguf(gguf.locate_gguf()).metadata)
  page_ids, planted, _, spans = needle.plant(
    tokenizer,
    needles=24,
    page_tokens=512,
    pages_per_window=6,
    margin=32,
    seed=0,
    templates=needle.TEMPLATE_SETS['four'],
    placement='mixed',
    overlap=64,
  )
  router = units_lib.UnitRouter(threshold=0.0)
  router.add_many(
    (f'needle page {p}', paging_scale.decode(tokenizer, row[1:])) for p, row in enumerate(page_ids)
  )
  boundary = [n for n in planted if n.at_boundary]
  tied = 0
  for n in boundary:
    first, second = router.route(n.question, k=2)
    page = int(first.key.split()[-1])
    assert needle._holds(spans[page], n), (n.name, page)
    tied += first.score == second.score
  assert len(boundary) == 12 and tied >= 2
