"""README.md: small, every path it names exists, its example runs, its headlines are on the
results pages."""

import pathlib
import re

import pytest

from graftjax.models.gemma import model as model_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text()
MAX_BYTES = 10_000


def _section(title: str) -> str:
  return README.split(f'\n## {title}\n', 1)[1].split('\n## ', 1)[0]


def _code(section: str, lang: str = '') -> str:
  return re.search(rf'```{lang}\n(.*?)```', _section(section), re.S).group(1)


def test_readme_is_small():
  assert len(README.encode()) <= MAX_BYTES


def _named_paths() -> set[str]:
  """Link targets, path-like `code spans` outside code blocks, and the layout tree."""
  prose = re.sub(r'```.*?```', '', README, flags=re.S)
  found = set(re.findall(r'\]\(([^)#]+)\)', prose))
  for span in re.findall(r'`([^`\s]+)`', prose):
    if '/' in span and not span.startswith(('/', '~', '.venv')) and '(' not in span:
      found.add(span)
  parents: list[tuple[int, str]] = []
  for line in _code('Layout').splitlines():
    if not line.strip():
      continue
    indent = len(line) - len(line.lstrip())
    first, rest = line.split()[0], line[indent:]
    parents = [(i, p) for i, p in parents if i < indent]
    base = parents[-1][1] if parents else ''
    if first.endswith('/') or re.fullmatch(r'[\w.]+\.(py|cfg|toml|md)', first):
      found.add(base + first)
      if first.endswith('/'):
        parents.append((indent, base + first))
      found |= {base + f for f in re.findall(r'\b(\w+\.py)\b', rest) if f != first}
  return found


def test_every_path_the_readme_names_exists():
  paths = _named_paths()
  assert {'experiments/results/README.md', 'models/cache.py', 'graftjax/blocks.py'} <= paths
  missing = sorted(p for p in paths if not (ROOT / p).exists())
  assert not missing


def test_headline_numbers_are_on_the_study_pages():
  pages = sorted((ROOT / 'experiments' / 'results').glob('*/README.md'))
  assert len(pages) >= 10
  page = '\n'.join(p.read_text() for p in pages)
  numbers = re.findall(r'\*\*([^*]+)\*\*', _section('Headline results'))
  numbers = [n for n in numbers if not n.startswith('not ')]
  assert len(numbers) >= 8
  for number in numbers:
    assert number in page, number


def test_python_example_runs_on_the_tiny_model(monkeypatch, tmp_path):
  code = _code('From Python', 'python').replace('/tmp/graftjax_blocks', str(tmp_path / 'blocks'))
  tiny = model_lib.tiny()  # with its byte tokenizer
  monkeypatch.setattr(model_lib, 'load', lambda *a, **k: tiny)
  exec(compile(code, 'README.md', 'exec'), {})


@pytest.mark.slow
@pytest.mark.real_model
def test_python_example_runs_on_the_real_model(real_model, monkeypatch, tmp_path):
  code = _code('From Python', 'python').replace('/tmp/graftjax_blocks', str(tmp_path / 'blocks'))
  monkeypatch.setattr(model_lib, 'load', lambda *a, **k: real_model)  # loaded once per session
  exec(compile(code, 'README.md', 'exec'), {})
