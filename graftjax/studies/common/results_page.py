"""The results pages: an index, `experiments/results/README.md`, and one page per study.

Each folder `experiments/results/<study>/` holds one study: its result JSON at the top level,
the shards and single runs they merge in `runs/`, logs in `logs/` (with a README.md saying
where they came from), figures beside the JSON, and its generated page, `README.md`. The
folder declares itself in `study.toml`:

    title = 'Is own-position graft byte-exact?'    # the page's heading and the index's link
    order = 10                                     # where the study goes in the index
    section = 'graftjax.studies.graft.section_exactness'  # optional: `render(results) -> lines`
    commands = ['python experiments/exactness.py --out=...']  # optional: how to re-run it

Every figure is read from a result file after `ledger.verify_result`; a page names the file
(its path under the results folder) and the first 12 hex digits of its `result_sha256`, and
shows each command with the committed path of what it wrote, never a path of the machine that
ran it. A study without a `section` lists every scalar of each file's summary; a section with
`finding(results) -> str` opens the index's line on the study with what its files found.
Adding a study is a new folder with its declaration; no list here names the studies. Same
files, same bytes.
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
from graftjax.errors import GraftjaxError
from graftjax.studies.common import results as results_lib

COMMAND = 'python experiments/results_page.py'
PAGE_NAME = 'README.md'  # the index in the results folder, and each study's page in its folder
INDEX_LINK = f'../{PAGE_NAME}'  # the index, from a study's page
RESULTS_PATH = 'experiments/results'  # the results folder, from the repository's root
DECLARATION = 'study.toml'
RUNS = 'runs'  # a study's shards and single runs, merged into its top-level files
LOGS = 'logs'  # a study's raw logs, and a README.md saying where they came from
_KEYS = {'title': str, 'order': int, 'section': str, 'commands': list}
MAX_ORDER = 10_000  # a section's `order`: 0 to this


class StudyError(GraftjaxError, ValueError):
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
  def kind(self) -> str:
    """The device kind alone: 'CPU', or the accelerator's name."""
    kind = self.determinism.get('device_kind', '?')
    return 'CPU' if kind == 'cpu' else str(kind)

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


def _here(name: str) -> str:
  """A file's link from its study's page: `name` (under the results folder) less the study."""
  return name.split('/', 1)[1]


def _committed(study: Study) -> dict[str, str]:
  """{file name: its path from the repository's root} of every file of `study`."""
  names = [r.name for r in study.results + study.runs] + list(study.files)
  return {pathlib.PurePosixPath(n).name: f'{RESULTS_PATH}/{n}' for n in names}


def _sources(study: Study, results: Sequence[Result]) -> list[str]:
  shown = lambda r: results_lib.shown_command(
    r.data.get('command', '?'), f'{RESULTS_PATH}/{r.name}', _committed(study)
  )
  return [
    f'- [`{r.name}`]({_here(r.name)}) `{r.digest}`; {r.device}; `{shown(r)}`' for r in results
  ]


# ---------------------------------------------------------------------------- studies


def _declaration(folder: pathlib.Path) -> dict[str, Any]:
  path = folder / DECLARATION
  if not path.is_file():
    raise StudyError(f'{folder}: no {DECLARATION}; every results folder declares its study')
  try:
    found = tomllib.loads(path.read_text())
  except RecursionError:
    raise StudyError(f'{path}: not TOML: nested too deeply to parse') from None
  except ValueError as e:  # TOMLDecodeError, not UTF-8, an integer past Python's digit limit
    raise StudyError(f'{path}: not TOML: {str(e)[:200]}') from e
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
  seen = {where / DECLARATION, where / PAGE_NAME, *tops, *runs}
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
  """Every study under `results_dir`, in index order.

  Raises:
    StudyError: a folder without a valid declaration, or a file outside every study folder
      (other than the index).
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


def _section_module(study: Study) -> tuple[Any, str]:
  """The study's section module and where it is declared (for errors)."""
  where = f'{study.folder}/{DECLARATION}: section {study.section}'
  try:
    module = importlib.import_module(study.section)
  except (Exception, SystemExit) as e:  # the section's code, whatever it does, is named
    raise StudyError(f'{where}: {_failure(e)}') from e
  if not callable(getattr(module, 'render', None)):
    raise StudyError(f'{where} has no render()')
  return module, where


def _call(where: str, name: str, function, study: Study):
  try:
    return function(list(study.results))
  except StudyError:
    raise
  except (Exception, SystemExit) as e:
    raise StudyError(f'{where}: {name}() failed: {_failure(e)}') from e


def _section(study: Study) -> list[str]:
  if not study.results:
    return []
  if study.section is None:
    return summaries(study.results)
  module, where = _section_module(study)
  lines = _call(where, 'render', module.render, study)
  if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
    raise StudyError(f'{where}: render() returned {type(lines).__name__}, not a list of lines')
  return lines


def finding(study: Study) -> str | None:
  """What the study's files found, in one line, where its section says (`finding(results)`);
  None where it does not."""
  if not study.results or study.section is None:
    return None
  module, where = _section_module(study)
  if not callable(getattr(module, 'finding', None)):
    return None
  line = _call(where, 'finding', module.finding, study)
  if not isinstance(line, str) or not _one_line(line):
    raise StudyError(f'{where}: finding() returned {line!r}, not one line of text')
  return line


def _failure(e: BaseException) -> str:
  if isinstance(e, SystemExit):
    return f'it called sys.exit({e.code!r})'
  return f'{type(e).__name__}: {e}'


def _shown(study: Study, command: str) -> str:
  """A declared command as its page shows it: its `--out` in the study's committed folder."""
  out = [w.partition('=')[2] for w in command.split() if w.startswith('--out=')]
  committed = f'{RESULTS_PATH}/{study.folder}/{pathlib.PurePosixPath(out[0]).name}' if out else ''
  return results_lib.shown_command(command, committed, _committed(study))


def render_study(study: Study) -> list[str]:
  """The body of a study's page: its section, then its files, logs and commands."""
  out = _section(study)
  if study.results:
    out += [
      '',
      'Files (`result_sha256` prefix; device; command):',
      '',
      *_sources(study, study.results),
    ]
  if study.runs:
    out += ['', 'Shards and single runs (merged above by their `result_sha256`):', '']
    out += _sources(study, study.runs)
  if study.files:
    readme = f'{study.folder}/{LOGS}/{PAGE_NAME}'
    out += ['', 'Logs, figures and notes:', '']
    if readme in study.files:
      out.append(f'- [`{readme}`]({_here(readme)}): where the logs came from')
    out += [f'- [`{f}`]({_here(f)})' for f in study.files if f != readme]
  if study.commands:
    out += ['', 'Re-run:', '', *(f'- `{_shown(study, c)}`' for c in study.commands)]
  return out


def study_page(study: Study) -> str:
  """The markdown page of one study, `<study>/README.md`."""
  out = [
    f'# {study.title}',
    '',
    f'<!-- Generated by `{COMMAND}` from this folder and its {DECLARATION}. Do not edit. -->',
    '',
    f'Study `{study.folder}`, one of the [results]({INDEX_LINK}). Every figure below is read'
    ' from the committed result file named beside it, after checking the file against its own'
    ' `result_sha256` (shown by its first 12 hex digits). Bits are never compared across'
    ' devices or jax versions.',
  ]
  body = render_study(study)
  out += ['', *body[1:]] if body and not body[0] else ['', *body]
  return _text(out)


def devices(study: Study) -> list[str]:
  """The device kinds the study's files ran on, sorted ('CPU' for any CPU)."""
  return sorted({r.kind for r in study.results + study.runs})


def headline(study: Study) -> str:
  """The index's line on a study: its `finding` where its section has one, then how many
  result files and runs, on which devices."""
  if not study.results:
    return 'no result files yet'
  files = f'{len(study.results)} result file{"s" if len(study.results) > 1 else ""}'
  runs = f' and {len(study.runs)} run{"s" if len(study.runs) > 1 else ""}' if study.runs else ''
  found = finding(study)
  return f'{found + "; " if found else ""}{files}{runs} on {", ".join(devices(study))}'


def index(found: Sequence[Study]) -> str:
  """The index page, `README.md`: one line per study, linked to its page."""
  out = [
    '# Results',
    '',
    f'<!-- Generated by `{COMMAND}` from the study folders here. Do not edit. -->',
    '',
    'One page per study folder (`<study>/study.toml` declares it). Every figure on a page is'
    ' read from a committed result file named beside it, after checking the file against its'
    ' own `result_sha256` (shown by its first 12 hex digits). Each file also carries the command'
    ' that made it, the pinned configuration (device, jax version, XLA flags, matmul precision)'
    ' and the SHA-256 of its inputs and outputs; a page shows each command with the committed'
    " path of what it wrote, and a study's `logs/README.md` says where its raw logs came from."
    ' Bits are never compared across devices or jax versions.',
    '',
    'Re-check a file without running a model:'
    ' `python -c "from graftjax import ledger; ledger.verify_result(\'<file>\')"`;'
    f' regenerate these pages: `{COMMAND}` (`--check` only compares).',
    '',
    *(
      f'- [{s.title}]({s.folder}/{PAGE_NAME}): {headline(s)}'
      for s in sorted(found, key=lambda s: (s.order, s.folder))
    ),
  ]
  return _text(out)


def _text(lines: Sequence[str]) -> str:
  return '\n'.join(line.rstrip() for line in lines) + '\n'


def render(found: Sequence[Study]) -> dict[str, str]:
  """{page path under the results folder: markdown} for `found`: the index and each study's
  page (the same studies give the same bytes, in any order).

  Raises:
    StudyError: a page would show a path of the machine that ran a command.
  """
  out = {PAGE_NAME: index(found)}
  for study in sorted(found, key=lambda s: (s.order, s.folder)):
    out[f'{study.folder}/{PAGE_NAME}'] = study_page(study)
  for name, text in out.items():
    if shown := results_lib.machine_paths(text):
      raise StudyError(f'{name} would show machine paths {shown[:3]}; show committed paths')
  return out


def pages(results_dir: str | os.PathLike[str]) -> dict[str, str]:
  """Every page of `results_dir`, by its path under it."""
  return render(studies(results_dir))


def stale(results_dir: str | os.PathLike[str]) -> list[pathlib.Path]:
  """The pages on disk under `results_dir` that are missing or differ from what is generated."""
  root = pathlib.Path(results_dir)
  return [
    root / name
    for name, text in pages(root).items()
    if not (root / name).is_file() or (root / name).read_text() != text
  ]


def write(results_dir: str | os.PathLike[str]) -> list[pathlib.Path]:
  """Writes every page under `results_dir` (the index and each study's README.md)."""
  root = pathlib.Path(results_dir)
  written = []
  for name, text in pages(root).items():
    (root / name).write_text(text)
    written.append(root / name)
  return written
