"""Every error the project defines derives from `GraftjaxError` and is named `...Error`."""

import importlib
import inspect
import pathlib
import types

import pytest

from graftjax.errors import GraftjaxError

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = {
  'graftjax': ROOT / 'graftjax',
  'graftjax.models': ROOT / 'models',
  'graftjax.kernels': ROOT / 'kernels',
}
# Runs as a standard-library-only program inside the code sandboxes: it cannot import
# graftjax, and its errors never leave the sandbox (the verifier reads a verdict, not them).
SANDBOX_PROGRAMS = {'graftjax.flywheel.code_harness'}


def _module_names():
  for package, folder in PACKAGES.items():
    for path in sorted(folder.rglob('*.py')):
      parts = path.relative_to(folder).with_suffix('').parts
      if path.name == '__init__.py':
        parts = parts[:-1]
      yield '.'.join((package, *parts))


def misfits(module: types.ModuleType) -> list[str]:
  """The public exception classes `module` defines that do not derive from GraftjaxError or
  whose names do not end in 'Error'."""
  out = []
  for name, cls in vars(module).items():
    if not (inspect.isclass(cls) and issubclass(cls, BaseException)):
      continue
    if cls.__module__ != module.__name__ or cls is GraftjaxError or name.startswith('_'):
      continue  # a private class is a module's own signal: it never reaches a caller
    if not issubclass(cls, GraftjaxError) or not name.endswith('Error'):
      out.append(f'{module.__name__}.{name}')
  return out


def test_every_project_error_derives_from_the_root():
  names = [n for n in _module_names() if n not in SANDBOX_PROGRAMS]
  assert len(names) > 100
  found, bad = 0, []
  for name in names:
    module = importlib.import_module(name)
    classes = [c for c in vars(module).values() if inspect.isclass(c)]
    found += sum(issubclass(c, GraftjaxError) and c.__module__ == name for c in classes)
    bad += misfits(module)
  assert bad == []
  assert found > 40


def test_the_check_finds_a_stray_error():
  module = types.ModuleType('graftjax.fake')
  exec(
    'class Stray(ValueError): pass\n'
    'class Named(ValueError): pass\n'
    'class BadName(GraftjaxError): pass\n'
    'class _Signal(Exception): pass\n',
    {'__name__': 'graftjax.fake', 'GraftjaxError': GraftjaxError},
    vars(module),
  )
  assert misfits(module) == ['graftjax.fake.Stray', 'graftjax.fake.Named', 'graftjax.fake.BadName']


def test_one_clause_catches_the_project_and_the_builtin_still_does(tmp_path):
  from graftjax import store
  from graftjax.models.gemma import schemes

  with pytest.raises(GraftjaxError, match='unknown position scheme'):
    schemes.get('no-such-scheme')
  with pytest.raises(ValueError, match='unknown position scheme'):
    schemes.get('no-such-scheme')
  with pytest.raises(GraftjaxError):
    store.BlockStore(tmp_path / 'store').get('0' * 64)
