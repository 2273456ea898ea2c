"""The committed results page is what the committed result files generate, byte for byte."""

import copy
import json
import pathlib

import pytest

from graftjax import ledger
from graftjax.studies import results_page

RESULTS = pathlib.Path(__file__).resolve().parents[1] / 'experiments' / 'results'


def test_committed_page_is_current():
  committed = (RESULTS / results_page.PAGE_NAME).read_text()
  assert committed == results_page.page(RESULTS), (
    f'experiments/results/README.md is stale: regenerate it with `{results_page.COMMAND}`'
  )


def test_page_is_deterministic():
  results = results_page.load(RESULTS)
  assert results_page.render(results) == results_page.render(list(reversed(results)))


def test_every_committed_result_file_is_on_the_page():
  page = results_page.page(RESULTS)
  for path in RESULTS.rglob('*.json'):
    name = path.relative_to(RESULTS).as_posix()
    if not name.endswith('_demo.json'):
      result = ledger.verify_result(path)
      assert f'`{name}`' in page and result['result_sha256'][:12] in page, name


def test_a_figure_on_the_page_follows_its_file():
  results = results_page.load(RESULTS)
  page = results_page.render(results)
  edited = [copy.deepcopy(r) for r in results]
  (cpu,) = [r for r in edited if r.name == 'bench_model_cpu.json']
  cpu.data['rows']['llamacpp']['prefill_tokens_per_s'] = 123456.0
  assert '123,456.0' not in page
  assert '123,456.0' in results_page.render(edited)


def test_unknown_family_is_listed_with_its_command(tmp_path):
  ledger.write_result(tmp_path / 'flywheel_gsm8k.json', {'command': 'python x.py --out=y', 'n': 1})
  ledger.write_result(tmp_path / 'exactness_demo.json', {'command': 'make demo'})
  page = results_page.page(tmp_path)
  assert '## Other result files' in page
  assert '`flywheel_gsm8k.json`' in page and '`python x.py --out=y`' in page
  assert 'exactness_demo.json' not in page


def test_edited_result_file_is_refused(tmp_path):
  ledger.write_result(tmp_path / 'x.json', {'command': 'c', 'n': 1})
  data = json.loads((tmp_path / 'x.json').read_text())
  data['n'] = 2
  (tmp_path / 'x.json').write_text(json.dumps(data))
  with pytest.raises(ValueError, match='x.json'):
    results_page.page(tmp_path)
