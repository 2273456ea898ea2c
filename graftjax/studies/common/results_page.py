"""The results page, `experiments/results/README.md`, generated study by study.

Each folder `experiments/results/<study>/` holds one study: its result JSON at the top level,
the shards and single runs they merge in `runs/`, logs in `logs/`, figures beside the JSON.
The folder declares itself in `study.toml`:

    title = 'Is own-position graft byte-exact?'    # the section heading
    order = 10                                     # where the section goes on the page
    section = 'graftjax.studies.sections.exactness'  # optional: `render(results) -> lines`
    commands = ['python experiments/exactness.py --out=...']  # optional: how to re-run it

Every figure is read from a result file after `ledger.verify_result`; the page names the file
(its path under the results folder) and the first 12 hex digits of its `result_sha256`. A
study without a `section` lists every scalar of each file's summary. Adding a study is a new
folder with its declaration; no list here names the studies. Same files, same bytes.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
import tomllib
from collections.abc import Sequence
from typing import Any

from graftjax import ledger
from graftjax.studies.common import results as results_lib

COMMAND = 'python experiments/results_page.py'
PAGE_NAME = 'README.md'
DECLARATION = 'study.toml'
RUNS = 'runs'  # a study's shards and single runs, merged into its top-level files
_KEYS = {'title': str, 'order': int, 'section': str, 'commands': list}
MAX_ORDER = 10_000  # a section's `order`: 0 to this


class StudyError(ValueError):
  """A results folder that does not declare its study, or declares it wrongly."""


@dataclasses.dataclass(frozen=True)
class Result:
  """One verified result file; `name` is its path under the results folder (posix)."""

  name: str
  data: dict[str, Any]

  @property
  def digest(self) -> str:
    return self.data['result_sha256'][:12]

  @property
  def determinism(self) -> dict[str, Any]:
    """The determinism record, wherever the experiment put it."""
    data = self.data
    if isinstance(data.get('determinism'), dict):
      return data['determinism']
    if isinstance(data.get('config'), dict) and 'jax_version' in data['config']:
      return data['config']
    runs = data.get('runs')
    if isinstance(runs, list) and runs and isinstance(runs[0], dict):
      return runs[0].get('determinism') or {}
    return {}

  @property
  def device(self) -> str:
    det = self.determinism
    kind = det.get('device_kind', '?')
    if kind == 'cpu':
      kind = f'CPU ({det.get("cpu_model", "?")})'
    return f'{kind}, jax {det.get("jax_version", "?")}'


@dataclasses.dataclass(frozen=True)
class Study:
  """One study folder: its declaration, verified results and runs, and its other files.

  `results` are the JSON files at the folder's top level, `runs` those under `runs/`,
  `files` everything else (figures, logs, notes); all names relative to the results folder.
  """

  folder: str
  title: str
  order: int
  section: str | None
  commands: tuple[str, ...]
  results: tuple[Result, ...]
  runs: tuple[Result, ...]
  files: tuple[str, ...]


# ---------------------------------------------------------------------------- formatting


def num(x: float | None) -> str:
  """'0' for an exact zero (never a rounded value), else 3 significant digits."""
  if x is None:
    return '-'
  return '0' if x == 0 else f'{x:.3g}'


def pct(x: float) -> str:
  return f'{100 * x:.1f}%'


def more_time(x: float) -> str:
  """A relative cost `x` (time ratio - 1) as '+52%', '-5%' or, from 2x on, '4.4x'."""
  return f'{1 + x:.1f}x' if x >= 1 else f'{100 * x:+.0f}%'


def yes(flag: bool) -> str:
  return 'yes' if flag else '**no**'


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  cell = lambda c: str(c).replace('|', '\\|')
  lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
  return lines + ['| ' + ' | '.join(cell(c) for c in row) + ' |' for row in rows]


def cite(result: Result) -> str:
  """'`study/file.json` (digest prefix)': how a figure names its file."""
  return f'`{result.name}` ({result.digest})'


def flatten(record: dict[str, Any], prefix: str = '') -> list[tuple[str, Any]]:
  """(dotted name, value) of every non-list leaf of `record`, sorted."""
  out = []
  for k, v in sorted(record.items(), key=lambda kv: str(kv[0])):
    if isinstance(v, dict):
      out += flatten(v, f'{prefix}{k}.')
    elif not isinstance(v, list):
      out.append((f'{prefix}{k}', v))
  return out


def scalars(record: dict[str, Any], *, skip: Sequence[str] = ()) -> list[str]:
  """Every scalar of a summary, by its dotted name (lists left out), as a table."""
  rows = [
    [f'`{k}`', f'{v:,}' if isinstance(v, int) and not isinstance(v, bool) else num(v)]
    if isinstance(v, (int, float)) and not isinstance(v, bool)
    else [f'`{k}`', v]
    for k, v in flatten({k: v for k, v in record.items() if k not in skip})
  ]
  return ['', *table(('summary field', 'value'), rows)] if rows else []


def summaries(results: Sequence[Result]) -> list[str]:
  """The section of a study that declares none: each file's summary scalars."""
  out = []
  for r in results:
    out += [f'{cite(r)}: every scalar of its summary.', *scalars(r.data.get('summary', {})), '']
  return out[:-1]


def _sources(results: Sequence[Result]) -> list[str]:
  return [
    f'- `{r.name}` `{r.digest}`; {r.device};'
    f' `{results_lib.shown_command(r.data.get("command", "?"), f"experiments/results/{r.name}")}`'
    for r in results
  ]


# ---------------------------------------------------------------------------- studies


def _declaration(folder: pathlib.Path) -> dict[str, Any]:
  path = folder / DECLARATION
  if not path.is_file():
    raise StudyError(f'{folder}: no {DECLARATION}; every results folder declares its study')
  try:
    found = tomllib.loads(path.read_text())
  except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
    raise StudyError(f'{path}: not TOML: {e}') from e
  unknown = sorted(set(found) - set(_KEYS))
  if unknown:
    raise StudyError(f'{path}: unknown keys {unknown}; known: {sorted(_KEYS)}')
  for key in ('title', 'order'):
    if key not in found:
      raise StudyError(f'{path}: `{key}` is missing')
  for key, kind in _KEYS.items():
    if key in found and (not isinstance(found[key], kind) or isinstance(found[key], bool)):
      raise StudyError(f'{path}: `{key}` must be a {kind.__name__}, found {found[key]!r}')
  if not all(isinstance(c, str) for c in found.get('commands', [])):
    raise StudyError(f'{path}: `commands` holds something other than strings')
  if problem := _out_of_range(found):
    raise StudyError(f'{path}: {problem}')
  return found


def _one_line(text: str) -> bool:
  return bool(text) and text == text.strip() and '\n' not in text and '\r' not in text


def _out_of_range(found: dict[str, Any]) -> str | None:
  """What of a declaration's well-typed fields is out of range, or None."""
  if not _one_line(found['title']):
    return f'`title` must be one line of text, found {found["title"]!r}'
  if not 0 <= found['order'] <= MAX_ORDER:
    return f'`order` must be from 0 to {MAX_ORDER}, found {found["order"]}'
  section = found.get('section')
  if section is not None and not all(part.isidentifier() for part in section.split('.')):
    return f'`section` must be a module name, dotted and absolute, found {section!r}'
  if bad := [c for c in found.get('commands', []) if not _one_line(c)]:
    return f'`commands` must each be one line of text, found {bad[0]!r}'
  return None


def _verified(root: pathlib.Path, paths) -> tuple[Result, ...]:
  return tuple(Result(p.relative_to(root).as_posix(), ledger.verify_result(p)) for p in paths)


def load_study(root: str | os.PathLike[str], folder: str) -> Study:
  """The study in `root`/`folder`, every result and run verified against its digest."""
  root = pathlib.Path(root)
  where = root / folder
  declared = _declaration(where)
  tops = sorted(where.glob('*.json'))
  runs = sorted((where / RUNS).glob('*.json'))
  seen = {where / DECLARATION, *tops, *runs}
  files = sorted(p.relative_to(root).as_posix() for p in where.rglob('*') if p.is_file())
  return Study(
    folder=folder,
    title=declared['title'],
    order=declared['order'],
    section=declared.get('section'),
    commands=tuple(declared.get('commands', ())),
    results=_verified(root, tops),
    runs=_verified(root, runs),
    files=tuple(f for f in files if root / f not in seen),
  )


def studies(results_dir: str | os.PathLike[str]) -> list[Study]:
  """Every study under `results_dir`, in page order.

  Raises:
    StudyError: a folder without a valid declaration, or a file outside every study folder
      (other than the page).
  """
  root = pathlib.Path(results_dir)
  strays = [p.name for p in root.iterdir() if p.is_file() and p.name != PAGE_NAME]
  if strays:
    raise StudyError(f'{root}: {sorted(strays)} outside every study folder; move each into one')
  found = [load_study(root, p.name) for p in sorted(root.iterdir()) if p.is_dir()]
  return sorted(found, key=lambda s: (s.order, s.folder))


def resolve(root: str | os.PathLike[str], result: Result, recorded: str) -> pathlib.Path:
  """A file a result names by the path it was written to, found in the result's study folder.

  Runs record where they wrote (`outputs`, `--merge=` paths), often a machine's scratch folder;
  the committed copy sits in the study's folder or its `runs/` under the same file name.
  """
  study = pathlib.Path(root) / result.name.split('/')[0]
  name = pathlib.PurePath(recorded).name
  for candidate in (study / name, study / RUNS / name):
    if candidate.is_file():
      return candidate
  raise StudyError(f'{result.name} names {recorded}: no {name} in {study} or its {RUNS}/')


def _section(study: Study) -> list[str]:
  if not study.results:
    return []
  if study.section is None:
    return summaries(study.results)
  where = f'{study.folder}/{DECLARATION}: section {study.section}'
  try:
    module = importlib.import_module(study.section)
  except (Exception, SystemExit) as e:  # the section's code, whatever it does, is named
    raise StudyError(f'{where}: {_failure(e)}') from e
  if not callable(getattr(module, 'render', None)):
    raise StudyError(f'{where} has no render()')
  try:
    lines = module.render(list(study.results))
  except StudyError:
    raise
  except (Exception, SystemExit) as e:
    raise StudyError(f'{where}: render() failed: {_failure(e)}') from e
  if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
    raise StudyError(f'{where}: render() returned {type(lines).__name__}, not a list of lines')
  return lines


def _failure(e: BaseException) -> str:
  if isinstance(e, SystemExit):
    return f'it called sys.exit({e.code!r})'
  return f'{type(e).__name__}: {e}'


def render_study(study: Study) -> list[str]:
  out = ['', f'## {study.title}', '', *_section(study)]
  if study.results:
    out += ['', 'Files (`result_sha256` prefix; device; command):', '', *_sources(study.results)]
  if study.runs:
    out += ['', 'Shards and single runs (merged above by their `result_sha256`):', '']
    out += _sources(study.runs)
  if study.files:
    out += ['', 'Logs, figures and notes:', '', *(f'- [`{f}`]({f})' for f in study.files)]
  if study.commands:
    out += ['', 'Re-run:', '', *(f'- `{c}`' for c in study.commands)]
  return out


def render(found: Sequence[Study]) -> str:
  """The markdown page for `found` (the same studies give the same bytes, in any order)."""
  out = [
    '# Results',
    '',
    f'<!-- Generated by `{COMMAND}` from the study folders here. Do not edit. -->',
    '',
    'One section per study folder (`<study>/study.toml` declares it). Every figure below is'
    ' read from the committed result file named beside it, after checking the file against'
    ' its own `result_sha256` (shown by its first 12 hex digits). Each file also carries the'
    ' command that made it, the pinned configuration (device, jax version, XLA flags, matmul'
    ' precision) and the SHA-256 of its inputs and outputs; paths in those commands are where'
    ' the run wrote, the committed copy is in the study folder under the same name. Bits are'
    ' never compared across devices or jax versions. Re-check a file without running a model:'
    ' `python -c "from graftjax import ledger; ledger.verify_result(\'<file>\')"`;'
    f' regenerate this page: `{COMMAND}`.',
  ]
  for study in sorted(found, key=lambda s: (s.order, s.folder)):
    out += render_study(study)
  return '\n'.join(line.rstrip() for line in out) + '\n'


def page(results_dir: str | os.PathLike[str]) -> str:
  return render(studies(results_dir))


def write(results_dir: str | os.PathLike[str]) -> pathlib.Path:
  """Writes the page to `results_dir`/README.md; returns its path."""
  path = pathlib.Path(results_dir) / PAGE_NAME
  path.write_text(page(results_dir))
  return path
