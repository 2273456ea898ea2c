"""The prefix-reuse study on the tiny model (short prompts in place of the workloads), and its
page section over the committed result."""

import pathlib

import pytest

from graftjax import ledger
from graftjax.studies.common import results_page
from graftjax.studies.prefix import prefix_reuse
from graftjax.studies.prefix import section_prefix_reuse
from graftjax.studies.prefix import workloads

RESULT = (
  pathlib.Path(__file__).resolve().parents[3]
  / 'experiments/results/prefix_reuse/prefix_reuse_cpu.json'
)


def test_the_study_records_exact_logits_and_the_anchor(monkeypatch):
  head = list(range(3, 40))
  monkeypatch.setattr(
    prefix_reuse,
    'prompts',
    lambda model, settings: {'shared': [head + [50, 51], head + [60], head + [60, 61, 62]]},
  )
  settings = prefix_reuse.Settings(model='tiny', span=8, chunk_size=4, capacity=64, anchor_grid=16)
  result = prefix_reuse.experiment(settings)
  rows = result['workloads']['shared']['requests']
  assert [r['hit'] for r in rows] == [0, 36, 36]  # 37 shared tokens on the chunk grid of 4
  assert [r['anchor_hit'] for r in rows] == [0, 32, 32]
  assert rows[2]['found'] == 36  # under XLA only whole chunks are deposited
  assert result['summary']['logits_equal'] == 3
  assert all(r['sha256_reuse'] == r['sha256_cold'] for r in rows)


def test_workloads_extend_turn_by_turn():
  class Bytes:
    def encode(self, text, add_bos):
      return ([2] if add_bos else []) + list(text.encode())

  turns = workloads.turns(Bytes(), count=3)
  assert all(b[: len(a)] == a for a, b in zip(turns, turns[1:]))
  shots = workloads.fewshot(Bytes(), requests=2)
  assert shots[0][:1000] == shots[1][:1000]


@pytest.mark.skipif(not RESULT.exists(), reason='no committed prefix_reuse result yet')
def test_the_section_renders_the_committed_result():
  data = ledger.verify_result(RESULT)
  result = results_page.Result('prefix_reuse/prefix_reuse_cpu.json', data)
  lines = section_prefix_reuse.render([result])
  requests = sum(len(w['requests']) for w in data['workloads'].values())
  assert sum(line.startswith('| ') for line in lines) == 2 + requests  # header, rule, rows
  assert data['summary']['logits_equal'] == data['summary']['requests']
  assert 'logits equal in' in section_prefix_reuse.finding([result])
