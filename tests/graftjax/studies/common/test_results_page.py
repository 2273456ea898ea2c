"""The results page: generated study by study, the committed page current byte for byte."""

import copy
import dataclasses
import json
import pathlib
import re

import pytest

from graftjax import ledger
from graftjax.studies.common import results as results_lib
from graftjax.studies.common import results_page

RESULTS = pathlib.Path(__file__).resolve().parents[4] / 'experiments' / 'results'


def _study(root, folder, declaration=None, **fields):
  """Makes `root`/`folder` a study declared by `fields` (or by the raw `declaration` text)."""
  where = root / folder
  (where / 'runs').mkdir(parents=True, exist_ok=True)
  fields = {'title': f'The {folder} study', 'order': 1, **fields}
  text = declaration
  if text is None:
    text = ''.join(f'{k} = {json.dumps(v)}\n' for k, v in fields.items())
  (where / results_page.DECLARATION).write_text(text)
  return where


def _page(root, folder):
  """The generated page of the study in `root`/`folder`."""
  return results_page.pages(root)[f'{folder}/{results_page.PAGE_NAME}']


def test_committed_pages_are_current():
  assert not results_page.stale(RESULTS), (
    f'a page under experiments/results is stale: regenerate them with `{results_page.COMMAND}`'
  )


def test_a_stale_or_missing_page_is_found(tmp_path):
  _study(tmp_path, 'first')
  _study(tmp_path, 'second')
  written = results_page.write(tmp_path)
  assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
    'README.md',
    'first/README.md',
    'second/README.md',
  ]
  assert not results_page.stale(tmp_path)
  (tmp_path / 'first' / 'README.md').write_text('edited\n')
  (tmp_path / 'second' / 'README.md').unlink()
  assert results_page.stale(tmp_path) == [
    tmp_path / 'first/README.md',
    tmp_path / 'second/README.md',
  ]


def test_pages_are_deterministic():
  found = results_page.studies(RESULTS)
  assert results_page.render(found) == results_page.render(list(reversed(found)))


def _off_their_page(root, pages):
  """Committed files under `root` that their study's page in `pages` does not name (with the
  digest prefix, for a result)."""
  missing = []
  for path in sorted(root.rglob('*')):
    name = path.relative_to(root).as_posix()
    if path.is_dir() or path.name in (results_page.PAGE_NAME, results_page.DECLARATION):
      if not (path.name == results_page.PAGE_NAME and '/logs/' in name):
        continue
    page = pages[f'{name.split("/")[0]}/{results_page.PAGE_NAME}']
    here = name.split('/', 1)[1]
    if f'[`{name}`]({here})' not in page:
      missing.append(name)
    elif path.suffix == '.json' and '/logs/' not in name:
      if ledger.verify_result(path)['result_sha256'][:12] not in page:
        missing.append(name)
  return missing


def test_every_committed_file_is_on_its_study_page():
  assert not _off_their_page(RESULTS, results_page.pages(RESULTS))


def test_a_file_left_off_its_page_is_found(tmp_path):
  where = _study(tmp_path, 'novel')
  ledger.write_result(where / 'novel_gsm8k.json', {'command': 'python x.py', 'summary': {'n': 7}})
  (where / 'plot.png').write_bytes(b'png')
  pages = results_page.pages(tmp_path)
  assert not _off_their_page(tmp_path, pages)
  page = pages['novel/README.md']
  dropped = {**pages, 'novel/README.md': page.replace('[`novel/plot.png`](plot.png)', '')}
  assert _off_their_page(tmp_path, dropped) == ['novel/plot.png']
  digest = ledger.verify_result(where / 'novel_gsm8k.json')['result_sha256'][:12]
  undigested = {**pages, 'novel/README.md': page.replace(digest, '')}
  assert _off_their_page(tmp_path, undigested) == ['novel/novel_gsm8k.json']


def _fits_one_screen(index):
  return len(index.splitlines()) <= 40


def test_the_index_fits_one_screen_and_links_every_study():
  index = results_page.pages(RESULTS)[results_page.PAGE_NAME]
  assert _fits_one_screen(index)
  for study in results_page.studies(RESULTS):
    assert f'- [{study.title}]({study.folder}/README.md): ' in index, study.folder
  assert (RESULTS / results_page.PAGE_NAME).read_text() == index


def test_an_index_of_too_many_studies_does_not_fit(tmp_path):
  for i in range(40):
    _study(tmp_path, f'study{i:02d}', order=i)
  assert not _fits_one_screen(results_page.pages(tmp_path)[results_page.PAGE_NAME])


def test_the_index_counts_each_studys_files_and_devices(tmp_path):
  where = _study(tmp_path, 'novel')
  gpu = {'device_kind': 'Toy GPU', 'jax_version': '0.0.1'}
  ledger.write_result(where / 'a.json', {'command': 'c', 'determinism': gpu})
  ledger.write_result(where / 'b.json', {'command': 'c', 'determinism': CPU})
  ledger.write_result(where / 'runs' / 'c.json', {'command': 'c', 'determinism': gpu})
  _study(tmp_path, 'empty')
  index = results_page.pages(tmp_path)[results_page.PAGE_NAME]
  assert '- [The novel study](novel/README.md): 2 result files and 1 run on CPU, Toy GPU' in index
  assert '- [The empty study](empty/README.md): no result files yet' in index


def test_a_sections_finding_leads_its_index_line(tmp_path, monkeypatch):
  (tmp_path / 'finding_section.py').write_text(
    'def render(results):\n  return []\n'
    'def finding(results):\n  return f"{sum(r.data[\'n\'] for r in results)} equal"\n'
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  results = tmp_path / 'results'
  where = _study(results, 'novel', section='finding_section')
  for name, n in (('a', 2), ('b', 3)):
    ledger.write_result(where / f'{name}.json', {'command': 'c', 'n': n, 'determinism': CPU})
  index = results_page.pages(results)[results_page.PAGE_NAME]
  assert '- [The novel study](novel/README.md): 5 equal; 2 result files on CPU' in index


def test_every_study_is_declared_with_a_section_and_a_command():
  for study in results_page.studies(RESULTS):
    assert study.section and study.commands, study.folder


def test_a_figure_on_the_page_follows_its_file():
  found = results_page.studies(RESULTS)
  page = results_page.render(found)['cpu_speed/README.md']
  (cpu,) = [s for s in found if s.folder == 'cpu_speed']
  (result,) = [copy.deepcopy(r) for r in cpu.results if r.name.endswith('bench_model_cpu.json')]
  result.data['rows']['llamacpp']['prefill_tokens_per_s'] = 123456.0
  edited = [dataclasses.replace(s, results=(result,)) if s is cpu else s for s in found]
  assert '123,456.0' not in page
  assert '123,456.0' in results_page.render(edited)['cpu_speed/README.md']


def test_a_study_is_a_folder_and_its_declaration(tmp_path):
  first = _study(tmp_path, 'novel', order=2, commands=['python x.py --out=y'])
  ledger.write_result(first / 'novel_gsm8k.json', {'command': 'python x.py', 'summary': {'n': 7}})
  ledger.write_result(first / 'runs' / 'novel_shard0.json', {'command': 'python x.py --shard=0'})
  (first / 'logs').mkdir()
  (first / 'logs' / 'run.json').write_text('{"not": "a result"}')  # logs are never read
  (first / 'logs' / 'README.md').write_text('From a toy machine.\n')
  (first / 'plot.png').write_bytes(b'png')
  _study(tmp_path, 'earlier', order=1)
  index = results_page.pages(tmp_path)[results_page.PAGE_NAME]
  assert index.index('[The earlier study](earlier/README.md)') < index.index('[The novel study]')
  page = _page(tmp_path, 'novel')
  assert page.startswith('# The novel study\n')
  assert '[results](../README.md)' in page
  for named in (
    '[`novel/novel_gsm8k.json`](novel_gsm8k.json)',
    '| summary field | value |',
    '| `n` | 7 |',
    '[`novel/runs/novel_shard0.json`](runs/novel_shard0.json)',
    '[`novel/logs/run.json`](logs/run.json)',
    '- [`novel/logs/README.md`](logs/README.md): where the logs came from',
    '[`novel/plot.png`](plot.png)',
    '- `python x.py --out=experiments/results/novel/y`',
  ):
    assert named in page, named
  assert 'novel_gsm8k' not in _page(tmp_path, 'earlier')


@pytest.mark.parametrize(
  ('declaration', 'says'),
  [
    (None, 'no study.toml'),
    ('title = "t"\n', '`order` is missing'),
    ('title = "t"\norder = "1"\n', "`order` must be a int, found '1'"),
    ('title = "t"\norder = true\n', '`order` must be a int, found True'),
    ('title = "t"\norder = 1\nfamily = "x"\n', "unknown keys ['family']"),
    ('title = "t"\norder = 1\ncommands = [1]\n', 'other than strings'),
    ('title = t\n', 'not TOML'),
    ('title = "t"\norder = 1\ncommands = ' + '[' * 5000 + ']' * 5000, 'nested too deeply'),
    ('title = "t"\norder = ' + '9' * 5000 + '\n', 'not TOML: Exceeds the limit'),
    ('title = "t"\norder = 1\nsection = "graftjax.studies.sections.nope"\n', 'sections.nope'),
    ('title = "t"\norder = 1\nsection = "graftjax.ledger"\n', 'has no render'),
  ],
)
def test_a_folder_that_does_not_declare_its_study_is_refused(tmp_path, declaration, says):
  where = tmp_path / 'study'
  where.mkdir()
  ledger.write_result(where / 'x.json', {'command': 'c'})
  if declaration is not None:
    (where / results_page.DECLARATION).write_text(declaration)
  with pytest.raises(results_page.StudyError, match=says.replace('[', r'\[').replace(']', r'\]')):
    results_page.pages(tmp_path)


SECTIONS = {
  'exiting_section': 'import sys\nsys.exit(0)\n',
  'raising_section': 'def render(results):\n  raise KeyError("summary")\n',
  'exiting_render': 'import sys\ndef render(results):\n  sys.exit(3)\n',
  'text_render': 'def render(results):\n  return "not lines"\n',
  'raising_finding': 'def render(results):\n  return []\ndef finding(results):\n  1 / 0\n',
  'lines_finding': 'def render(results):\n  return []\ndef finding(results):\n  return "a\\nb"\n',
}


@pytest.mark.parametrize(
  ('fields', 'says'),
  [
    ('title = ""\norder = 1', "`title` must be one line of text, found ''"),
    ('title = "two\\nlines"\norder = 1', '`title` must be one line'),
    ('title = "t"\norder = -1', '`order` must be from 0 to 10000, found -1'),
    ('title = "t"\norder = 1_000_000_000', '`order` must be from 0 to 10000'),
    ('title = "t"\norder = nan', '`order` must be a int, found nan'),
    ('title = "t"\norder = 1\nsection = ""', "`section` must be a module name.*found ''"),
    ('title = "t"\norder = 1\nsection = ".sections.x"', "found '.sections.x'"),
    ('title = "t"\norder = 1\nsection = "graftjax/studies"', "found 'graftjax/studies'"),
    ('title = "t"\norder = 1\ncommands = [""]', '`commands` must each be one line'),
    ('title = "t"\norder = 1\nsection = "exiting_section"', r'called sys.exit\(0\)'),
    ('title = "t"\norder = 1\nsection = "raising_section"', "render.. failed: KeyError: 'summ"),
    ('title = "t"\norder = 1\nsection = "exiting_render"', r'render.. failed.*sys.exit\(3\)'),
    ('title = "t"\norder = 1\nsection = "text_render"', 'returned str, not a list of lines'),
    ('title = "t"\norder = 1\nsection = "raising_finding"', 'finding.. failed: ZeroDivision'),
    ('title = "t"\norder = 1\nsection = "lines_finding"', "finding.. returned 'a.nb', not one"),
  ],
)
def test_a_declaration_out_of_range_or_a_failing_section_is_a_study_error(
  tmp_path, monkeypatch, fields, says
):
  for name, code in SECTIONS.items():
    (tmp_path / f'{name}.py').write_text(code)
  monkeypatch.syspath_prepend(str(tmp_path))
  results = tmp_path / 'results'
  where = _study(results, 'study', declaration=fields + '\n')
  ledger.write_result(where / 'x.json', {'command': 'c'})
  with pytest.raises(results_page.StudyError, match=says):
    results_page.pages(results)


def test_a_file_outside_every_study_is_refused(tmp_path):
  ledger.write_result(tmp_path / 'exactness_cpu.json', {'command': 'c'})
  with pytest.raises(results_page.StudyError, match='exactness_cpu.json'):
    results_page.pages(tmp_path)


def test_edited_result_file_is_refused(tmp_path):
  where = _study(tmp_path, 'x')
  ledger.write_result(where / 'x.json', {'command': 'c', 'n': 1})
  data = json.loads((where / 'x.json').read_text())
  data['n'] = 2
  (where / 'x.json').write_text(json.dumps(data))
  with pytest.raises(ValueError, match='x.json'):
    results_page.pages(tmp_path)


def test_a_recorded_output_path_resolves_in_its_study(tmp_path):
  where = _study(tmp_path, 'paging')
  (where / 'plot.png').write_bytes(b'png')
  ledger.write_result(where / 'r.json', {'outputs': {'/scratch/plot.png': 'x'}})
  (study,) = results_page.studies(tmp_path)
  (result,) = study.results
  assert results_page.resolve(tmp_path, result, '/scratch/plot.png') == where / 'plot.png'
  with pytest.raises(results_page.StudyError, match='other.png'):
    results_page.resolve(tmp_path, result, 'experiments/results/other.png')


def _rate(successes, trials, low, high):
  return {
    'successes': successes,
    'trials': trials,
    'rate': successes / trials,
    'low': low,
    'high': high,
    'confidence': 0.95,
  }


def _phase(items, rate, tokens, seconds=1.0):
  return {
    'items': items,
    'accuracy': rate,
    'decode_tokens': items * tokens,
    'decode_tokens_per_answer': float(tokens),
    'seconds_per_answer': seconds,
  }


CPU = {'device_kind': 'cpu', 'cpu_model': 'Toy CPU', 'jax_version': '0.0.1'}


def _flywheel(energy):
  attempt = lambda phase, i, who=None: {
    'phase': phase,
    'item_id': f'mgs/eng/{i}',
    'answered_by': who,
  }
  return {
    'command': 'python experiments/flywheel.py --templates=0',
    'experiment': 'flywheel',
    'determinism': CPU,
    'model': 'gemma3-270m',
    'dtype': 'float32',
    'budget': {'samples': 4, 'max_new_tokens': 256, 'recall_tokens': 16},
    'attempts': [attempt('transfer_flywheel', i, 'flywheel') for i in range(5)]
    + [attempt('transfer_base', i) for i in range(7)],
    'summary': {
      'base': _phase(60, _rate(3, 60, 0.0171, 0.1366), 240),
      'recurrence': _phase(57, _rate(51, 57, 0.7896, 0.9497), 9.25),
      'recurrence_items': 57,
      'recurrence_base_decode_tokens': 54321,
      'transfer_base': _phase(7, _rate(0, 7, 0.0, 0.3543), 256),
      'transfer_flywheel': _phase(7, _rate(6, 7, 0.4869, 0.9743), 77),
    },
    'routing': {
      'BM25Router': {
        'threshold': 0.5,
        'accuracy': _rate(6, 7, 0.4869, 0.9743),
        'false_hit': _rate(1, 7, 0.0257, 0.5131),
        'false_hit_abstain': None,
        'abstain': _rate(0, 7, 0.0, 0.3543),
      },
      'ExactRouter': {
        'threshold': 'inf',
        'accuracy': None,
        'false_hit': _rate(0, 7, 0.0, 0.3543),
        'false_hit_abstain': None,
        'abstain': _rate(7, 7, 0.6457, 1.0),
      },
    },
    'grafted_vs_prompted': {
      'summary': {
        'items': 57,
        'logits_byte_equal': 56,
        'tokens_equal': 57,
        'graft_seconds_median': 0.125,
        'prompted_seconds_median': 0.5,
      },
      'items': [],
    },
    'energy': energy,
  }


def test_flywheel_section_renders_a_minimal_file(tmp_path):
  energy = {
    'device': 'Toy GPU',
    'scope': 'GPU board only (toy)',
    'idle_watts': 71.5,
    'phases': {
      'base': {'joules_per_answer': 812.0},
      'recurrence': {'joules_per_answer': 9.75},
    },
  }
  where = _study(tmp_path, 'flywheel', section='graftjax.studies.flywheel.section_flywheel')
  ledger.write_result(where / 'flywheel_toy_h200.json', _flywheel(energy))
  ledger.write_result(where / 'flywheel_toy_cpu.json', _flywheel(None))
  page = _page(tmp_path, 'flywheel')
  assert 'Re-scored now' in page
  for figure in (
    '51/57 = 89.5% [79.0%, 95.0%]',  # recurrence accuracy, Wilson interval
    '| 9.25 |',  # decode tokens per answer
    '54,321',  # the base model's spend on the recurrence items
    '3/60 = 5.0%',  # the base model on the deposited items
    '0/7 = 0.0% [0.0%, 35.4%] | 6/7 = 85.7% [48.7%, 97.4%] | flywheel higher',
    '| 5 |',  # transfer answers that went through a block
    '| mgs |',  # the held-out set
    '| BM25Router | 0.5 | 6/7',
    '| ExactRouter | inf | - |',
    '| 56/57 | 57/57 | 0.125 | 0.5 | 0.25 |',
    '812',
    '9.75',
    'GPU board only (toy)',
    '4 x 256 / 16',
  ):
    assert figure in page, figure
  assert page == _page(tmp_path, 'flywheel')


def test_flywheel_page_follows_the_file_and_says_when_energy_is_absent(tmp_path):
  data = _flywheel(None)
  data['summary']['transfer_base'] = _phase(7, _rate(6, 7, 0.4869, 0.9743), 256)
  data['summary']['transfer_flywheel'] = _phase(7, _rate(0, 7, 0.0, 0.3543), 77)
  where = _study(tmp_path, 'flywheel', section='graftjax.studies.flywheel.section_flywheel')
  ledger.write_result(where / 'flywheel_toy.json', data)
  page = _page(tmp_path, 'flywheel')
  assert '**base higher**' in page  # a negative result is kept
  assert 'No file here was measured' in page


def test_flywheel_page_shows_a_code_task_without_re_running_its_code(tmp_path):
  data = _flywheel(None)
  data['verifier'] = {'name': 'code', 'version': 2}
  data['attempts'] = []  # no held-out items: no transfer row
  data['summary']['transfer_base'] = data['summary']['transfer_flywheel'] = {'items': 0}
  data['deposits'] = [{'key': 'a', 'source': 'self'}] + [{'key': 'b', 'source': 'reference'}] * 3
  report = {
    'deposited': _rate(31, 32, 0.8430, 0.9944),
    'reworded': _rate(25, 32, 0.6121, 0.8898),
    'false_hit': _rate(4, 100, 0.0157, 0.0984),
  }
  data['routing'] = {'BM25Router': {'calibration': {'threshold': 0.43, 'report': report}}}
  where = _study(tmp_path, 'flywheel', section='graftjax.studies.flywheel.section_flywheel')
  ledger.write_result(where / 'flywheel_code.json', data)
  page = _page(tmp_path, 'flywheel')
  assert 'not re-run as the page is made' in page
  assert '| 1 own + 3 canonical | 51/57 = 89.5% [79.0%, 95.0%] | 56/57 |' in page
  assert (
    '| BM25Router | 0.43 | 31/32 = 96.9% [84.3%, 99.4%] | 25/32 = 78.1% [61.2%, 89.0%] |' in page
  )
  assert '| ? |' not in page


def test_compose_section_renders_a_minimal_file(tmp_path):
  exact = {'total': 5, 'logits_byte_equal': 4, 'cache_byte_equal': 5, 'max_abs_logit_diff': 0.25}
  data = {
    'command': 'python experiments/compose.py --templates=0',
    'experiment': 'flywheel_compose',
    'determinism': CPU,
    'model': 'gemma3-270m',
    'dtype': 'float32',
    'base_tokens': 0,
    'deposits': [{'key': 'a', 'source': 'reference'}, {'key': None, 'source': 'reference'}],
    'refusals': {'xla': 'composition is exact only on Pallas. Under XLA it is not'},
    'not_asked': {'recall': 2, 'held_out': 3},
    'summary': {
      'exactness': {'k3/shifted': exact},
      'recall': {'k1': _phase(5, _rate(5, 5, 0.5655, 1.0), 4), 'k3': {'items': 0}},
      'held_out': {'top1': _phase(5, _rate(1, 5, 0.0362, 0.6245), 99)},
      'held_out_top1_is_template': _rate(4, 5, 0.3755, 0.9638),
      'paired': {'k1 vs k3': {'items': 5, 'only_first': 2, 'only_second': 1}},
    },
  }
  where = _study(tmp_path, 'compose', section='graftjax.studies.flywheel.section_flywheel_compose')
  ledger.write_result(where / 'flywheel_compose_toy.json', data)
  page = _page(tmp_path, 'compose')
  assert 'Re-scored now' not in page  # not given to rescore
  for figure in (
    '| k3/shifted | 4/5 | 5/5 | 0.25 |',
    '| recurring (recall) | k1 | 5 | 5/5 = 100.0% [56.5%, 100.0%] | 4 |',
    '| recurring (recall) | k3 | 0 | - | - |',
    '| held-out (solve) | top1 | 5 | 1/5 = 20.0% [3.6%, 62.5%] | 99 |',
    '| k1 vs k3 | 5 | 2 | 1 |',
    'own template: 4/5 = 80.0%',
    '1 reference, 1 refused',
    'not asked before the deadline: 2 recurring, 3 held-out',
    'XLA refused: "composition is exact only on Pallas."',
  ):
    assert figure in page, figure


def test_paging_section_renders_minimal_files(tmp_path):
  where = _study(tmp_path, 'paging', section='graftjax.studies.paging.section_paging')
  route_row = lambda router, n, us: {
    'router': router,
    'entries': n,
    'queries': 9,
    'lookup_median_s': us * 1e-6,
    'lookup_p90_s': 2 * us * 1e-6,
    'route_median_s': us * 1e-6 / 2,
    'sqlite_get_median_s': 1e-6,
    'index_build_s': 0.01,
    'catalog_bytes': 4096,
    'top1_own_piece': 1.0,
  }
  ledger.write_result(
    where / 'paging_route_toy.json',
    {
      'command': 'python experiments/bench_paging_route.py',
      'experiment': 'bench_paging_route',
      'determinism': CPU,
      'timing': 'toy medians',
      'rows': [route_row('bm25', 10, 70.0), route_row('bm25', 10000, 91.0)],
      'summary': {
        'lookup_median_s': {'bm25': {'10': 7e-5, '10000': 9.1e-5, 'largest_over_smallest': 1.3}}
      },
    },
  )
  pagein_row = lambda n, page_in, recompute: {
    'tokens': n,
    'page_in_s': page_in,
    'recompute_s': recompute,
    'query_logits_byte_equal': True,
    'page_bytes_per_token': 3072.0,
    'block_bytes_per_token': 18432.0,
  }
  ledger.write_result(
    where / 'paging_pagein_toy.json',
    {
      'command': 'python experiments/bench_paging_pagein.py',
      'experiment': 'bench_paging_pagein',
      'determinism': CPU,
      'model': 'tiny',
      'dtype': 'float32',
      'chunk_size': 512,
      'timing': 'toy medians',
      'summary': {
        'crossover_tokens': 1536.0,
        'choice': {'128': 'recompute', '8192': 'page_in'},
      },
      'rows': [pagein_row(128, 0.0421, 0.0252), pagein_row(8192, 0.25, 1.5)],
      'versus_llamacpp_state_file': {
        '1024': {
          'llamacpp_state_file_bytes': 4000000,
          'block_float32_over_llamacpp': 4.6,
          'page_float32_over_llamacpp': 0.77,
          'page_bfloat16_over_llamacpp': 0.38,
        }
      },
    },
  )
  ledger.write_result(
    where / 'paging_scale_toy.json',
    {
      'command': 'python experiments/bench_paging_scale.py',
      'experiment': 'paging_scale',
      'determinism': CPU,
      'summary': {
        'stored_tokens': 3_300_000,
        'window_slots': 32_768,
        'access_latency_s': {'10': 0.1, '100': 0.11, '1000': 0.1, '10000': 0.125},
        'device_bytes_in_use': {'10': 123456789, '10000': 123456789},
      },
    },
  )
  ledger.write_result(
    where / 'paging_needle_toy.json',
    {
      'command': 'python experiments/paging_needle.py',
      'experiment': 'paging_needle',
      'determinism': CPU,
      'summary': {'paged': {'accuracy': 0.875}, 'questions': 64},
    },
  )
  page = _page(tmp_path, 'paging')
  for figure in (
    '| bm25 | 10,000 | 91 | 182 |',
    'bm25 1.30x',
    '| 128 | 0.042 | 0.025 | recompute | yes | 3,072 | 18,432 | 6.0x |',
    'Crossover: page-in is faster from 1,536 tokens.',
    '| 1,024 | 4,000,000 | 4.60 | 0.77 | 0.38 |',
    '3,300,000 tokens stored behind a window of 32,768 slots (100.7x the window)',
    '| 10,000 | 0.125 |',
    'largest deviation from the smallest store: 25.0%; **not met**',
    '`device_bytes_in_use.10000` | 123,456,789',
    '`paged.accuracy` | 0.875',
    '`questions` | 64',
  ):
    assert figure in page, figure


def test_a_relative_cost_keeps_its_sign():
  assert results_page.more_time(0.07) == '+7%'
  assert results_page.more_time(-0.05) == '-5%'
  assert results_page.more_time(3.4) == '4.4x'


def test_commands_show_the_committed_path_not_the_machines():
  """A result's --out names the committed file; other machine paths show their last part."""
  shown = results_lib.shown_command(
    'CKPT=/root/ckpt python experiments/relocation.py --model=/root/ckpt/small --samples=3'
    ' --out=/root/out/r.json --store=$OUT/store --cache=~/cache /tmp/extra',
    'experiments/results/relocation/r.json',
  )
  assert shown == (
    'CKPT=<path>/ckpt python experiments/relocation.py --model=<path>/small --samples=3'
    ' --out=experiments/results/relocation/r.json --store=<path>/store --cache=<path>/cache'
    ' <path>/extra'
  )
  assert not results_lib.machine_paths(shown)


def test_a_path_naming_a_committed_file_shows_where_it_is_committed():
  files = {
    'a.json': 'experiments/results/s/runs/a.json',
    'b.json': 'experiments/results/s/runs/b.json',
  }
  shown = results_lib.shown_command(
    'python x.py --merge=/root/out/a.json,experiments/results/runs/b.json,/root/out/c.json'
    ' --model=a.json --out=/root/out/r.json',
    'experiments/results/s/r.json',
    files,
  )
  assert shown == (
    'python x.py --merge=experiments/results/s/runs/a.json,experiments/results/s/runs/b.json,'
    '<path>/c.json --model=a.json --out=experiments/results/s/r.json'
  )


def _missing_results_paths(text):
  """The paths under experiments/results that `text` names and the repository lacks."""
  named = re.findall(r'experiments/results/[^\s`,;)\]|]*', text)
  return sorted({p for p in named if not (RESULTS.parents[1] / p).exists()})


def test_every_results_path_a_page_names_is_committed():
  pages = results_page.pages(RESULTS)
  assert sum(text.count('experiments/results/') for text in pages.values()) > 100
  assert not {n: m for n, text in pages.items() if (m := _missing_results_paths(text))}
  assert _missing_results_paths('--merge=experiments/results/runs/x.json,') == [
    'experiments/results/runs/x.json'
  ]


def test_a_declared_command_shows_committed_paths(tmp_path):
  _study(tmp_path, 'novel', commands=['python x.py --store=/tmp/s --out=$OUT/r.json'])
  assert '- `python x.py --store=<path>/s --out=experiments/results/novel/r.json`' in _page(
    tmp_path, 'novel'
  )


def _committed_texts():
  """Every page under experiments/results, and every other markdown note there."""
  return {p.relative_to(RESULTS).as_posix(): p.read_text() for p in sorted(RESULTS.rglob('*.md'))}


def test_no_page_or_note_shows_a_machine_path():
  texts = {**_committed_texts(), **results_page.pages(RESULTS)}
  assert {'README.md', 'scale/README.md', 'relocation/position_findings.md'} <= set(texts)
  shown = {name: results_lib.machine_paths(text) for name, text in texts.items()}
  assert not {name: paths for name, paths in shown.items() if paths}


@pytest.mark.parametrize(
  ('text', 'found'),
  [
    ('`python x.py --out=/root/out/r.json`', ['/root/out/r.json']),
    ('wrote /tmp/gj_store/a.bin, then', ['/tmp/gj_store/a.bin']),
    ('--out=$OUT/paging.json', ['$OUT/paging.json']),
    ('--out=${OUT}/paging.json', ['${OUT}/paging.json']),
    ('(~/cache/jax)', ['~/cache/jax']),
    ('[page](../README.md), 50/50, https://example.com/a, <path>/r.json, logs/x.log', []),
  ],
)
def test_machine_paths_are_found(text, found):
  assert results_lib.machine_paths(text) == found


def test_a_section_that_shows_a_machine_path_is_refused(tmp_path, monkeypatch):
  (tmp_path / 'leaky_section.py').write_text(
    'def render(results):\n  return ["wrote /root/out/x.json"]\n'
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  where = _study(tmp_path / 'results', 'leaky', section='leaky_section')
  ledger.write_result(where / 'x.json', {'command': 'c'})
  with pytest.raises(results_page.StudyError, match=r'leaky/README.md.*/root/out/x.json'):
    results_page.pages(tmp_path / 'results')


def _logs_without_a_readme(root):
  """The `logs/` folders under `root` without a README.md that says where their logs came from."""
  return [
    logs.relative_to(root).as_posix()
    for logs in sorted(root.glob('*/logs'))
    if not (logs / 'README.md').is_file() or not (logs / 'README.md').read_text().strip()
  ]


def test_every_logs_folder_says_where_its_logs_came_from():
  assert len(list(RESULTS.glob('*/logs'))) >= 5
  assert not _logs_without_a_readme(RESULTS)


def test_a_logs_folder_without_a_readme_is_found(tmp_path):
  for study in ('told', 'untold', 'blank'):
    (tmp_path / study / 'logs').mkdir(parents=True)
    (tmp_path / study / 'logs' / 'run.log').write_text('raw')
  (tmp_path / 'told' / 'logs' / 'README.md').write_text('From experiments/device/x.sh on a GPU.\n')
  (tmp_path / 'blank' / 'logs' / 'README.md').write_text('\n')
  assert _logs_without_a_readme(tmp_path) == ['blank/logs', 'untold/logs']


def _slug(heading):
  """GitHub's anchor for a markdown heading."""
  return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def _broken_results_links(doc, text):
  """Links in `text` (of the file `doc`) into experiments/results whose file, or whose anchor
  on a page, is not there."""
  broken = []
  for target in re.findall(r'\]\(([^)\s]*experiments/results/[^)\s]*)\)', text):
    path, _, anchor = target.partition('#')
    where = (doc.parent / path).resolve()
    if not where.exists():
      broken.append(target)
    elif anchor:
      headings = re.findall(r'^#+ (.*)$', where.read_text(), flags=re.M)
      if anchor not in {_slug(h) for h in headings}:
        broken.append(target)
  return broken


def test_every_link_into_the_results_pages_resolves():
  root = RESULTS.parents[1]
  docs = [root / 'README.md', *sorted((root / 'docs').glob('*.md'))]
  docs += sorted((root / 'notebooks').glob('*.ipynb'))
  linked = {d.name: re.findall(r'\]\([^)]*experiments/results/', d.read_text()) for d in docs}
  assert sum(map(len, linked.values())) >= 5
  assert not {d.name: b for d in docs if (b := _broken_results_links(d, d.read_text()))}


def test_a_link_to_a_missing_page_or_section_is_found():
  doc = RESULTS.parents[1] / 'docs' / 'x.md'
  text = (
    '[ok](../experiments/results/exactness/README.md),'
    ' [gone](../experiments/results/README.md#is-own-position-graft-byte-exact-cpu-and-h200),'
    ' [moved](../experiments/results/nowhere/README.md),'
    ' [section](../experiments/results/exactness/README.md#is-own-position-graft-byte-exact-cpu-and-h200)'
  )
  assert _broken_results_links(doc, text) == [
    '../experiments/results/README.md#is-own-position-graft-byte-exact-cpu-and-h200',
    '../experiments/results/nowhere/README.md',
  ]
