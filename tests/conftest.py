"""Shared fixtures: the tiny random model (with its byte tokenizer) for most tests, the real one for a few.

The deterministic configuration is pinned before any test touches jax.
"""

from graftjax import determinism

determinism.pin()

import concurrent.futures
import inspect
import os
import pathlib
import resource
import subprocess
import sys

import jax.numpy as jnp
import pytest

from graftjax.models.gemma import model as gemma_model


@pytest.fixture(scope='session')
def tiny_model():
  return gemma_model.tiny()


@pytest.fixture(scope='session')
def real_model():
  return gemma_model.load('gemma3-270m', dtype=jnp.float32)


@pytest.fixture(scope='session')
def text_model():
  """The tiny model with its byte tokenizer ('\\n\\n' one token, as in Gemma's vocabulary)."""
  return gemma_model.tiny()


@pytest.fixture
def tqdm_bars(monkeypatch):
  """Every `tqdm.tqdm` bar opened in the test, in order, each writing to a string."""
  import io
  import tqdm

  opened = []

  class Recorded(tqdm.tqdm):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **{**kwargs, 'file': io.StringIO()})
      opened.append(self)

  monkeypatch.setattr(tqdm, 'tqdm', Recorded)
  return opened


@pytest.fixture(scope='session')
def run_together():
  """A function that runs each command (an argv list) in a process of its own, all at once,
  and returns their `subprocess.CompletedProcess`es (text output captured) in order."""

  def run(*commands):
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
      return list(
        pool.map(
          lambda argv: subprocess.run(argv, capture_output=True, text=True, check=False),
          commands,
        )
      )

  return run


@pytest.fixture(scope='session')
def eight_host_devices():
  """A function that runs a pytest file in a process with 8 forced host devices (the flag
  must be set before jax starts) and asserts that every test in it passed."""

  def run(cases):
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8')
    proc = subprocess.run(
      [sys.executable, '-m', 'pytest', str(cases), '-x', '-q', '-p', 'no:cacheprovider'],
      capture_output=True,
      text=True,
      check=False,
      env=env,
      cwd=pathlib.Path(__file__).parents[1],
      timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert ' passed' in proc.stdout and 'skipped' not in proc.stdout, proc.stdout[-2000:]

  return run


# Fixtures that start other processes: a test using one is marked `subprocess`.
_PROCESS_FIXTURES = ('run_together', 'eight_host_devices', 's3_server', 'gcs_server')


def _sources(item) -> list[str]:
  """The source of the test function and of every fixture it uses."""
  functions = [item.function] + [
    fixture.func for defs in item._fixtureinfo.name2fixturedefs.values() for fixture in defs
  ]
  sources = []
  for function in functions:
    try:
      sources.append(inspect.getsource(function))
    except (OSError, TypeError):
      continue
  return sources


def _uses(item, names) -> bool:
  """Whether the test takes one of the fixtures `names`, directly or by `getfixturevalue`."""
  if any(name in item.fixturenames for name in names):
    return True
  asked = [f'getfixturevalue({quote}{name}{quote})' for name in names for quote in '\'"']
  return any(call in source for source in _sources(item) for call in asked)


def _starts_processes(item) -> bool:
  if _uses(item, _PROCESS_FIXTURES):
    return True
  try:
    source = inspect.getsource(item.function)
  except (OSError, TypeError):
    return False
  return 'subprocess.' in source or 'multiprocessing' in source


def pytest_collection_modifyitems(config, items):
  """Markers the fast tier deselects, found from what a test uses: `real_model` for a test
  taking the real-model fixture, `subprocess` for one that starts processes (the test
  function's own code, or a fixture that starts a server, taken by name or asked for with
  `request.getfixturevalue`). `slow` is written on the test.

  Then the `slow` tests go first, each file's in their order: with two workers the run ends
  on short tests, not with one worker busy on a long one while the other idles."""
  del config
  for item in items:
    if _uses(item, ('real_model',)):
      item.add_marker(pytest.mark.real_model)
    if _starts_processes(item):
      item.add_marker(pytest.mark.subprocess)
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)


# The suite's time by file: wall seconds (setup, call and teardown of every test) and CPU
# seconds (this process and the processes it waited for), summed per file, printed at the end.
_CPU_KEY = pytest.StashKey[float]()
_TOP_FILES = 25


def _cpu_seconds() -> float:
  own, children = (
    resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
  )
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
  """Each phase's report carries its CPU seconds (in `user_properties`, which reach xdist's
  controller): from the end of the previous phase, or the test's start, to this one's end."""
  started = item.stash.get(_CPU_KEY, None)
  now = _cpu_seconds()
  item.stash[_CPU_KEY] = now
  outcome = yield
  if started is not None:
    outcome.get_result().user_properties.append(('cpu_s', now - started))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  item.stash[_CPU_KEY] = _cpu_seconds()
  yield


_FILE_TIMES: dict[str, list[float]] = {}  # file -> [wall seconds, CPU seconds]


def pytest_runtest_logreport(report):
  totals = _FILE_TIMES.setdefault(report.nodeid.split('::')[0], [0.0, 0.0])
  totals[0] += report.duration
  totals[1] += sum(value for name, value in report.user_properties if name == 'cpu_s')


def pytest_terminal_summary(terminalreporter):
  if not _FILE_TIMES:
    return
  rows = sorted(_FILE_TIMES.items(), key=lambda row: -row[1][0])
  wall, cpu = (sum(totals[i] for _, totals in rows) for i in (0, 1))
  write = terminalreporter.write_line
  terminalreporter.section(f'time by file (top {_TOP_FILES} of {len(rows)})')
  write(f'{"wall s":>9} {"cpu s":>9}  file')
  for path, (file_wall, file_cpu) in rows[:_TOP_FILES]:
    write(f'{file_wall:9.1f} {file_cpu:9.1f}  {path}')
  write(f'{wall:9.1f} {cpu:9.1f}  all {len(rows)} files (test time summed over workers)')
