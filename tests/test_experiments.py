"""The experiment scripts' shape, their shared result header, and quiet logging.

Every `experiments/*.py` is a thin absl main over a library function: the run
command in its docstring, flags at module level with the shared names
(`--model`, `--dtype`, `--impl`, `--out`), a `main(argv)` that rejects stray
arguments, calls a study's function (`graftjax.studies.<study>`) with the flag values, prints
and writes the result; and `cli.run(main)`, which keeps library logs (orbax,
jax) at WARNING unless `--verbosity` asks for more. A script defines no
function but `main` (no helpers, no lambdas, no classes: tables and summaries
are formatted by the library too), so what it computes can be imported and
tested without running it.
"""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from graftjax import ledger
from graftjax.studies.common import results

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / 'experiments').glob('*.py'))
# Names other scripts once used for what the shared flags name.
RETIRED_FLAGS = {'dtypes', 'output', 'out_dir', 'output_dir', 'result', 'out_path', 'config'}
DEFINE = re.compile(r'^DEFINE_')
# Scripts other work owns, not yet moved into the library (thin them, then drop them here).


def _tree(path: pathlib.Path) -> ast.Module:
  return ast.parse(path.read_text())


def _flag_names(tree: ast.Module) -> list[str]:
  names = []
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and DEFINE.match(node.func.attr)
      and node.args
      and isinstance(node.args[0], ast.Constant)
    ):
      names.append(node.args[0].value)
  return names


@pytest.mark.parametrize('path', SCRIPTS, ids=lambda p: p.name)
def test_script_is_a_thin_absl_main(path):
  tree = _tree(path)
  doc = ast.get_docstring(tree) or ''
  assert f'python experiments/{path.name}' in doc, 'the run command belongs in the docstring'
  mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == 'main']
  assert len(mains) == 1 and [a.arg for a in mains[0].args.args] == ['argv']
  first = mains[0].body[0]
  assert isinstance(first, ast.If) and 'len(argv) > 1' in ast.unparse(first.test)
  assert 'UsageError' in ast.unparse(first.body[0]), 'main must reject stray arguments'
  guard = tree.body[-1]
  assert isinstance(guard, ast.If) and ast.unparse(guard.body[0]) == 'cli.run(main)'
  # Flags are declared at module level only.
  for node in tree.body:
    if isinstance(node, ast.FunctionDef):
      assert not _flag_names(node), f'{node.name} defines flags'


@pytest.mark.parametrize('path', SCRIPTS, ids=lambda p: p.name)
def test_script_defines_no_function_but_main(path):
  tree = _tree(path)
  defined = [
    getattr(node, 'name', type(node).__name__)
    for node in ast.walk(tree)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
  ]
  assert defined == ['main'], (
    f'move {[d for d in defined if d != "main"]} into its study under graftjax/studies/'
  )
  (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
  calls = {ast.unparse(n.func) for n in ast.walk(main) if isinstance(n, ast.Call)}
  assert any(c.split('.')[0] in _studies_imported(tree) for c in calls), 'main calls no library'


def _studies_imported(tree: ast.Module) -> set[str]:
  return {
    alias.asname or alias.name
    for node in tree.body
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('graftjax.studies.')
    for alias in node.names
    if alias.name not in ('cli', 'results', 'impl_flags')
  }


@pytest.mark.parametrize('path', SCRIPTS, ids=lambda p: p.name)
def test_script_uses_the_shared_flag_names_and_result_writer(path):
  source = path.read_text()
  names = _flag_names(_tree(path))
  assert not RETIRED_FLAGS & set(names), f'use --model/--dtype/--impl/--out, not {names}'
  assert 'ledger.write_result' not in source, (
    'write results with graftjax.studies.common.results.write'
  )
  assert "shlex.join(['python']" not in source, 'the command line comes from results.header'


def test_header_and_write_record_what_a_result_needs(tmp_path):
  table = tmp_path / 'table.txt'
  table.write_text('a table\n')
  head = results.header('demo', inputs={'x_sha256': '0' * 64}, command='python demo.py')
  assert list(head) == ['experiment', 'command', 'determinism', 'inputs']
  assert head['command'] == 'python demo.py'
  for key in ('xla_flags', 'jax_version', 'jaxlib_version', 'cpu_kind', 'device_kind'):
    assert key in head['determinism']
  lines = []
  digest = results.write(
    tmp_path / 'r.json', {**head, 'figure': 1}, outputs=[table], log=lines.append
  )
  verified = ledger.verify_result(tmp_path / 'r.json')
  assert verified['result_sha256'] == digest
  assert verified['outputs'] == {str(table): ledger.sha256_bytes(b'a table\n')}
  assert lines == [f'wrote {tmp_path / "r.json"} (sha256 {digest})']
  assert results.command_line(['x.py', '--out=a b']) == "python x.py '--out=a b'"


# A main that goes through the params cache's orbax calls (save, then the
# restore path of `checkpoint.load_params`) under `cli.run`.
_LOAD_PARAMS_MAIN = textwrap.dedent(
  """
  import json, sys
  import numpy as np
  from graftjax.studies.common import cli

  def main(argv):
    import orbax.checkpoint as ocp
    from graftjax.models.gemma import checkpoint
    params = {'embedding': np.ones((4, 2), np.float32), 'final_norm': np.ones(2, np.float32),
              'layers': ({'q': np.zeros((2, 2), np.float32)},)}
    entry = checkpoint.cache_root() / 'params' / f'fake-v{checkpoint.CONVERSION_VERSION}'
    ocp.PyTreeCheckpointer().save(entry / 'params', params)
    (entry / 'params_digest.json').write_text(
        json.dumps({'params_sha256': checkpoint.params_digest(params)}))
    checkpoint.load_params('unused.gguf', 'fake')
    print('loaded')

  cli.run(main)
  """
)


def _run_load_params(tmp_path, *flags):
  script = tmp_path / 'load_params_main.py'
  script.write_text(_LOAD_PARAMS_MAIN)
  cache = tmp_path / f'cache{len(flags)}'
  env = dict(os.environ, GRAFTJAX_CACHE=str(cache), JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [sys.executable, str(script), *flags],
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0 and 'loaded' in proc.stdout, proc.stderr[-3000:]
  return [line for line in proc.stderr.splitlines() if re.match(r'I\d{4} ', line)]


def test_params_cache_load_logs_nothing_at_default_verbosity(tmp_path):
  assert _run_load_params(tmp_path) == []


def test_verbosity_flag_still_shows_library_info(tmp_path):
  info = _run_load_params(tmp_path, '--verbosity=0')
  assert any('checkpoint' in line for line in info), info


_BM25_MAIN = textwrap.dedent(
  """
  from graftjax.routing import route
  from graftjax.studies.common import cli

  def main(argv):
    router = route.BM25Router(threshold=0.0)
    router.add_many([('a', 'the capital of Zorbia'), ('b', 'the language of Quantar')])
    print(router.route('the capital of Zorbia')[0].key, router.route('the of')) # 'the of': empty

  cli.run(main)
  """
)


def test_bm25_logs_nothing_at_default_verbosity(tmp_path):
  """bm25s sets its own logger to DEBUG ('Building index from IDs', 'The query is empty')."""
  script = tmp_path / 'bm25_main.py'
  script.write_text(_BM25_MAIN)

  def stderr(*flags):
    proc = subprocess.run(
      [sys.executable, str(script), *flags],
      capture_output=True,
      text=True,
      env=dict(os.environ, JAX_PLATFORMS='cpu'),
      cwd=REPO,
      timeout=300,
      check=False,
    )
    assert proc.returncode == 0 and proc.stdout.startswith('a []'), proc.stderr[-3000:]
    return proc.stderr

  assert 'Building index' not in stderr() and 'query is empty' not in stderr()
  assert 'Building index' in stderr('--verbosity=1')  # asked for: shown


def test_a_script_rejects_stray_arguments():
  proc = subprocess.run(
    [sys.executable, str(REPO / 'experiments' / 'position_findings.py'), 'stray'],
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert proc.returncode != 0 and "unexpected arguments: ['stray']" in proc.stderr


# ---------------------------------------------------------------------------- every file is used

# Where a script counts as referenced: text a reader or a run goes through.
REFERRERS = (
  'README.md',
  'Makefile',
  'setup.cfg',
  'docs',
  'tests',
  'notebooks',
  'graftjax',
  'models',
  'kernels',
  'scripts',
  'experiments',
)
EXPERIMENT_FILES = sorted(
  p
  for p in (REPO / 'experiments').rglob('*')
  if p.is_file()
  and p.suffix in ('.py', '.sh')
  and 'results' not in p.relative_to(REPO).parts
  and '__pycache__' not in p.parts
)
DEVICE_SCRIPTS = sorted((REPO / 'experiments' / 'device').glob('*.sh'))


def _referring_text(skip: pathlib.Path) -> str:
  texts = []
  for name in REFERRERS:
    root = REPO / name
    paths = [root] if root.is_file() else root.rglob('*')
    for path in paths:
      if (
        path.is_file()
        and path != skip
        and path.suffix in ('', '.md', '.py', '.sh', '.toml', '.cfg', '.ipynb')
        and not {'logs', '__pycache__'} & set(path.parts)
      ):
        texts.append(path.read_text(errors='replace'))
  return '\n'.join(texts)


@pytest.mark.parametrize('path', EXPERIMENT_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_experiment_file_is_referenced(path):
  """A script under experiments/ is named by a doc, a test, a study's declaration or a script."""
  name = path.relative_to(REPO).as_posix()
  text = _referring_text(path)
  # A top-level experiment by its path; one in a sub-folder (device/, peers/) may be named
  # by the folder's code beside it, by file name.
  named = (name, name.split('/', 1)[1]) + ((path.name,) if name.count('/') > 1 else ())
  assert any(n in text for n in named), f'{name} is referenced nowhere'


@pytest.mark.parametrize('path', EXPERIMENT_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_experiment_file_parses(path):
  if path.suffix == '.py':
    compile(path.read_text(), str(path), 'exec')
    return
  proc = subprocess.run(['bash', '-n', str(path)], capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
  'path', [p for p in DEVICE_SCRIPTS if p.name != 'common.sh'], ids=lambda p: p.name
)
def test_a_device_script_makes_one_study_that_names_it(path):
  text = path.read_text()
  assert 'source experiments/device/common.sh' in text
  (study,) = re.findall(r'^study_out (\w+)$', text, flags=re.M)
  declaration = REPO / 'experiments' / 'results' / study / 'study.toml'
  assert f'experiments/device/{path.name}' in declaration.read_text()


def _device_commands() -> dict[str, set[str]]:
  """The flags each experiment is given by the device scripts: {script: {flag}}."""
  found: dict[str, set[str]] = {}
  for path in DEVICE_SCRIPTS:
    text = path.read_text().replace('\\\n', ' ')
    for script, args in re.findall(r'python (experiments/\w+\.py)([^\n;|>]*)', text):
      found.setdefault(script, set()).update(re.findall(r'--(\w+)', args))
  return found


@pytest.mark.slow  # one process per experiment script, about 90 s on 2 cores
@pytest.mark.parametrize('script', sorted(_device_commands()))
def test_device_scripts_pass_only_flags_their_experiment_defines(script):
  proc = subprocess.run(
    [sys.executable, str(REPO / script), '--helpfull'],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
    cwd=REPO,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  known = set(re.findall(r'--(?:\[no\])?(\w+)', proc.stdout))
  assert known, proc.stderr[-2000:]
  assert not _device_commands()[script] - known


@pytest.mark.parametrize('path', SCRIPTS, ids=lambda p: p.name)
def test_result_paths_a_script_names_are_in_a_study_folder(path):
  """Default `--out` paths and the run commands in docstrings write into a declared study."""
  for folder in re.findall(r'experiments/results/(\w+)/', path.read_text()):
    assert (REPO / 'experiments' / 'results' / folder / 'study.toml').is_file(), folder
  for name in re.findall(r'experiments/results/([^/\s\'"`]+\.json)', path.read_text()):
    pytest.fail(f'{name} is outside every study folder')


# ---------------------------------------------------------------- --model: names and folders

# Scripts whose --model is no Gemma checkpoint, or that load one model only, by its reason.
OWN_MODELS = {
  'train_small.py': 'trains a model of its own sizes; relocation.py takes the folder it writes',
  'reference_agreement.py': "compares with transformers and llama.cpp on the 270M's GGUF",
}
# Calls by which a study loads a model's weights.
LOADS = re.compile(r'load_named\(|gemma_model\.load\(|paging_scale\.load_model\(|load_trained\(')
RECORDS = re.compile(r'results\.model_inputs\(|harness\.result_inputs\(')


def _study_sources(tree: ast.Module) -> str:
  """The source of every study module `tree` imports (graftjax.studies.X import Y)."""
  texts = []
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('graftjax.studies.'):
      for alias in node.names:
        path = REPO / node.module.replace('.', '/') / f'{alias.name}.py'
        if path.is_file() and node.module != 'graftjax.studies.common':
          texts.append(path.read_text())
  return '\n'.join(texts)


def _model_flag_call(tree: ast.Module) -> str | None:
  """'define' or 'define_config' when `tree` defines --model with `model_flag`, else None."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and ast.unparse(node.func).startswith('model_flag.define'):
      return ast.unparse(node.func).split('.')[1]
  return None


def _model_flag_name(tree: ast.Module) -> str:
  """The name of the flag `model_flag` defines in `tree` ('model' unless `name=` says)."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and ast.unparse(node.func).startswith('model_flag.define'):
      return next((k.value.value for k in node.keywords if k.arg == 'name'), 'model')
  raise AssertionError('no model_flag flag')


def _takes_a_folder(path: pathlib.Path) -> bool:
  return _model_flag_call(_tree(path)) == 'define'


MODEL_SCRIPTS = [p for p in SCRIPTS if _takes_a_folder(p)]


@pytest.mark.parametrize('path', SCRIPTS, ids=lambda p: p.name)
def test_every_model_flag_is_the_shared_one(path):
  """--model comes from `model_flag` (a name or a folder, checked at parsing; or a config
  name); a script whose study loads weights takes a folder and records its digests."""
  tree = _tree(path)
  if path.name in OWN_MODELS:
    return
  assert 'model' not in _flag_names(tree), 'define --model with graftjax.studies.common.model_flag'
  studies = _study_sources(tree)
  if LOADS.search(studies):
    assert _model_flag_call(tree) == 'define', (
      f'{path.name} loads a model: its --model takes a checkpoint folder (model_flag.define)'
    )
  if _model_flag_call(tree) == 'define':
    assert RECORDS.search(studies), (
      f"{path.name}'s result must record the weights' and tokenizer's digests"
      ' (results.model_inputs)'
    )


def test_the_walk_finds_the_scripts_that_load_a_model():
  names = {p.name for p in MODEL_SCRIPTS}
  assert {'flywheel.py', 'relocation.py', 'route_calibration.py', 'bench_model.py'} <= names
  assert {'scheme_agreement.py', 'needle.py', 'portable_block.py'} <= names
  assert not names & {'kv_bytes.py', 'bench_matmul_tiles.py', 'results_page.py'}


def _experiment(script, *flags, timeout=900):
  return subprocess.run(
    [sys.executable, str(REPO / 'experiments' / script), *flags],
    cwd=REPO,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


@pytest.mark.slow  # one process per script, refused while parsing flags (about 5 s each)
@pytest.mark.parametrize(
  'path',
  MODEL_SCRIPTS + [p for p in SCRIPTS if _model_flag_call(_tree(p)) == 'define_config'],
  ids=lambda p: p.name,
)
def test_a_mistyped_folder_is_a_flag_error_naming_it(path, tmp_path):
  typo = tmp_path / 'my-gemma-typo'
  proc = _experiment(path.name, f'--{_model_flag_name(_tree(path))}={typo}', timeout=300)
  assert proc.returncode != 0 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  assert 'Flags parsing error' in proc.stderr and str(typo) in proc.stderr


# The flags of a short run on the tiny checkpoint folder; every script that takes a folder
# has one (None where a run is not cheap, with the reason: its digests are checked statically).
TINY_RUNS = {
  # Pads its questions with ' please' to exact token counts: the fixture's small vocabulary
  # cuts the word into several tokens and misses them.
  'bench_answer.py': None,
  'bench_cpu_paths.py': ['--tokens=16', '--capacity=64', '--pallas_tokens=16'],
  'bench_graft.py': ['--prefix_tokens=16', '--chunk_size=8', '--repeats=1', '--recompute_max=16'],
  'bench_model.py': [
    '--prompt_tokens=16',
    '--decode_tokens=2',
    '--chunk_size=8',
    '--dtype=float32',
  ],
  'bench_paging_context.py': [
    '--pages=4',
    '--page_tokens=16',
    '--k=2',
    '--capacity=512',
    '--queries=2',
    '--tier_pages=4',
  ],
  'bench_paging_recall.py': None,  # builds its stores and fits its routers: half an hour
  'bench_paging_pagein.py': ['--tokens=16', '--chunk_size=8', '--repeats=1'],
  'exactness.py': None,  # tests/graftjax/studies/common/test_checkpoint_cli.py runs it
  'flywheel.py': None,  # tests/graftjax/studies/common/test_checkpoint_cli.py runs it
  'needle.py': None,  # tests/graftjax/studies/common/test_checkpoint_cli.py runs it
  'flywheel_compose.py': None,  # solves GSM-Symbolic items first: minutes on two cores
  'invariance.py': [
    '--samples=1',
    '--prefix_tokens=8',
    '--continuation_tokens=2',
    '--chunk_sizes=1,2',
    '--batch_sizes=1',
  ],
  'kernel_determinism.py': ['--samples=1', '--prefix_tokens=8', '--quick'],
  'paging_scale.py': None,  # plans a page store over the standard library first: minutes
  'portable_block.py': None,  # two modes over a folder: run below
  'prefix_reuse.py': None,  # an 8-shot GSM8K context first; tests/graftjax/prefix/test_study.py
  'relocation.py': [
    '--samples=1',
    '--block_tokens=8',
    '--continuation_tokens=2',
    '--chunk_size=8',
    '--offsets=0,3',
    '--composition_offsets=',
    '--scheme=rope',
  ],
  # GSM-Symbolic template 3 enumerates its value combinations for about 100 s: not here.
  'route_calibration.py': ['--templates=0-2,4', '--unrelated=8', '--conservative=false'],
  'scheme_agreement.py': ['--samples=1', '--tokens=8', '--scheme=rope_f64'],
  'slot_moves.py': ['--tokens=8', '--chunk_size=8', '--capacity=64', '--slots=1'],
}


def test_every_script_that_takes_a_folder_has_a_tiny_run():
  assert set(TINY_RUNS) == {p.name for p in MODEL_SCRIPTS}


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  """A tiny Gemma 3 exported as a Hugging Face folder with its own tokenizer files."""
  from graftjax.models.gemma import config as config_lib
  from graftjax.models.gemma import model as gemma_model
  from graftjax.models.gemma import safetensors_io
  from tests.models.gemma import tokenizer_files

  vocab = tokenizer_files.small_vocabulary()
  folder = tmp_path_factory.mktemp('my-gemma')
  source = gemma_model.random(config_lib.tiny(vocab_size=vocab.vocab_size), seed=5)
  safetensors_io.save(source.params, source.config, folder)
  tokenizer_files.write_all(folder, vocab)
  return folder


def _recorded(inputs, folder):
  from graftjax.models.gemma import model as gemma_model

  loaded = gemma_model.load(weights=folder)
  assert inputs['params_sha256'] == loaded.params_digest
  assert inputs['tokenizer_sha256'] == loaded.tokenizer.digest()
  assert 'gguf_sha256' not in inputs


@pytest.mark.slow  # one experiment process each on the tiny checkpoint folder
@pytest.mark.parametrize('script', sorted(s for s, run in TINY_RUNS.items() if run is not None))
def test_a_script_runs_on_a_checkpoint_folder_and_records_its_digests(script, checkpoint, tmp_path):
  out = tmp_path / 'result.json'
  proc = _experiment(script, f'--model={checkpoint}', *TINY_RUNS[script], f'--out={out}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  _recorded(json.loads(out.read_text())['inputs'], checkpoint)


@pytest.mark.slow  # deposit and graft: two processes on the tiny checkpoint folder
def test_portable_block_records_the_folders_digests(checkpoint, tmp_path):
  from graftjax.studies.store import portable_block

  moved = tmp_path / 'moved'
  flags = [f'--model={checkpoint}', '--prefix_tokens=16', '--continuation_tokens=2']
  flags += ['--chunk_size=8', '--dtype=float32', '--impl=xla', f'--dir={moved}']
  for mode, out in (('deposit', moved / portable_block.RECORD), ('graft', tmp_path / 'g.json')):
    proc = _experiment('portable_block.py', f'--mode={mode}', *flags, f'--out={out}')
    assert proc.returncode == 0, proc.stderr[-3000:]
    _recorded(json.loads(out.read_text())['inputs'], checkpoint)
