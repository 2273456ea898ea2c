"""The import graph: layers point one way and no module imports itself back.

kernels <- models <- method (graftjax.*) <- studies, with the error root
(`graftjax.errors`, which imports nothing) below them all. Lazy imports inside
functions count too. A package's `__init__` is a node of the package's name
(`graftjax.store` re-exports its modules); `from P import m` of a module `m`
is an edge to `P.m` alone, not to `P`.
"""

import ast
import configparser
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {
  'graftjax': ROOT / 'graftjax',
  'graftjax.models': ROOT / 'models',
  'graftjax.kernels': ROOT / 'kernels',
}
LAYERS = (
  ('graftjax.errors', 0),
  ('graftjax.kernels.', 0),
  ('graftjax.models.', 1),
  ('graftjax.studies.', 3),
)


def _modules() -> dict[str, pathlib.Path]:
  found = {}
  for package, folder in PACKAGES.items():
    for path in folder.rglob('*.py'):
      parts = path.relative_to(folder).with_suffix('').parts
      if path.name == '__init__.py':
        parts = parts[:-1]
      found['.'.join((package,) + parts)] = path
  return found


def _layer(module: str) -> int:
  return next((layer for prefix, layer in LAYERS if module.startswith(prefix)), 2)


def _imports(path: pathlib.Path, modules) -> set[str]:
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = {f'{node.module}.{a.name}' for a in node.names}
      out |= (names & set(modules)) or {node.module}
  return out & set(modules)


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {m: _imports(p, modules) - {m} for m, p in modules.items()}


def _upward(graph) -> list[tuple[str, str]]:
  return sorted((a, b) for a, deps in graph.items() for b in deps if _layer(b) > _layer(a))


def _cycles(graph) -> list[list[str]]:
  state, cycles = {}, []

  def visit(node, stack):
    state[node] = 'open'
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == 'open':
        cycles.append(stack[stack.index(dep) :] + [dep])
      elif dep not in state:
        visit(dep, stack + [dep])
    state[node] = 'done'

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])
  return cycles


def _within(module: str, package: str) -> bool:
  return module == package or module.startswith(package + '.')


def _path_into(graph, source: str, target: str) -> list[str] | None:
  """An import chain from a module of package `source` to one of package `target` (lazy
  imports too, through any module between), or None if there is none."""
  starts = sorted(m for m in graph if _within(m, source))
  came_from = {m: None for m in starts}
  queue = list(starts)
  while queue:
    node = queue.pop(0)
    if _within(node, target):
      chain = [node]
      while came_from[chain[-1]] is not None:
        chain.append(came_from[chain[-1]])
      return chain[::-1]
    for dep in sorted(graph.get(node, ())):
      if dep not in came_from:
        came_from[dep] = node
        queue.append(dep)
  return None


# Paging and the flywheel are siblings: both build on the shared routers and composition, and
# neither (nor what they share) reaches the other.
SIBLINGS = ('graftjax.flywheel', 'graftjax.paging')
SHARED = ('graftjax.routing', 'graftjax.compose', 'graftjax.stats', 'graftjax.sqlite_index')


def test_paging_and_the_flywheel_are_siblings():
  graph = _graph()
  pairs = [(a, b) for a in SIBLINGS for b in SIBLINGS if a != b]
  pairs += [(shared, sibling) for shared in SHARED for sibling in SIBLINGS]
  chains = {pair: _path_into(graph, *pair) for pair in pairs}
  assert {pair: chain for pair, chain in chains.items() if chain} == {}


def test_the_sibling_check_sees_what_it_looks_for():
  graph = _graph()
  assert all(any(_within(m, shared) for m in graph) for shared in SHARED)
  assert 'graftjax.routing.route' in graph['graftjax.paging.catalog']
  assert 'graftjax.compose' in graph['graftjax.paging.context']
  assert 'graftjax.routing.route' in graph['graftjax.routing.units']
  bad = {
    'graftjax.paging.a': {'graftjax.routing.b'},
    'graftjax.routing.b': {'graftjax.x'},
    'graftjax.x': {'graftjax.flywheel.c'},
  }
  chain = ['graftjax.paging.a', 'graftjax.routing.b', 'graftjax.x', 'graftjax.flywheel.c']
  assert _path_into(bad, 'graftjax.paging', 'graftjax.flywheel') == chain
  assert _path_into(bad, 'graftjax.routing', 'graftjax.flywheel') == chain[1:]
  assert _path_into(bad, 'graftjax.flywheel', 'graftjax.paging') is None
  assert _path_into(bad, 'graftjax.pag', 'graftjax.flywheel') is None  # whole names only


def test_layers_point_one_way():
  assert not _upward(_graph())


def test_no_import_cycle():
  assert not _cycles(_graph())


def test_the_checks_see_what_they_look_for():
  graph = _graph()
  assert 'graftjax.models.cache' in graph['graftjax.blocks']
  assert 'graftjax.store.blockstore' in graph['graftjax.store']
  assert 'graftjax.store' in graph['graftjax.restore']
  bad = {'graftjax.models.a': {'graftjax.studies.b'}, 'graftjax.studies.b': {'graftjax.models.a'}}
  assert _upward(bad) == [('graftjax.models.a', 'graftjax.studies.b')]
  assert _cycles(bad) == [['graftjax.models.a', 'graftjax.studies.b', 'graftjax.models.a']]


def test_the_error_root_imports_nothing():
  assert _graph()['graftjax.errors'] == set()
  assert 'graftjax.errors' in _graph()['graftjax.models.gemma.schemes']


def test_test_modules_have_unique_names():
  """pytest imports test files by basename (no __init__.py): two of one name stop collection."""
  names = [p.name for p in (ROOT / 'tests').rglob('test_*.py')]
  assert len(names) > 50
  assert sorted({n for n in names if names.count(n) > 1}) == []


SHARED_STUDY_HELPERS = 'common'  # graftjax/studies/common: what several studies share


def _study_shape_faults(studies: pathlib.Path) -> list[str]:
  """What breaks 'one study, one folder' under `studies`: a module beside the folders, a folder
  without a documented `__init__.py`, no shared package."""
  faults = [f'{p.name} is a module outside any study' for p in studies.glob('*.py')]
  faults = [f for f in faults if not f.startswith('__init__.py ')]
  folders = [p for p in sorted(studies.iterdir()) if p.is_dir() and p.name != '__pycache__']
  for folder in folders:
    init = folder / '__init__.py'
    if not init.is_file() or not ast.get_docstring(ast.parse(init.read_text())):
      faults.append(f'{folder.name}/ has no __init__.py with a docstring')
  if SHARED_STUDY_HELPERS not in {p.name for p in folders}:
    faults.append(f'no shared package {SHARED_STUDY_HELPERS}/')
  return faults


def test_one_study_one_folder():
  studies = ROOT / 'graftjax' / 'studies'
  assert len([p for p in studies.iterdir() if p.is_dir()]) >= 5
  assert _study_shape_faults(studies) == []


def test_the_study_shape_check_sees_what_it_looks_for(tmp_path):
  (tmp_path / '__init__.py').write_text('"""Studies."""\n')
  (tmp_path / 'paging').mkdir()
  (tmp_path / 'paging' / '__init__.py').write_text('')
  (tmp_path / 'bench_x.py').write_text('')
  assert _study_shape_faults(tmp_path) == [
    'bench_x.py is a module outside any study',
    'paging/ has no __init__.py with a docstring',
    f'no shared package {SHARED_STUDY_HELPERS}/',
  ]


def test_the_flywheel_method_imports_no_study():
  graph = _graph()
  assert 'graftjax.flywheel.tasks' in graph['graftjax.flywheel.loop']
  assert 'graftjax.flywheel.loop' in graph['graftjax.studies.flywheel.harness']
  assert not [
    (a, b)
    for a, deps in graph.items()
    if a == 'graftjax.flywheel' or a.startswith('graftjax.flywheel.')
    for b in deps
    if b.startswith('graftjax.studies')
  ]


MAX_KEYWORDS = 10  # past this a study's entry point takes a frozen settings dataclass


def _long_signatures(modules) -> set[str]:
  out = set()
  for name, path in modules.items():
    for node in ast.parse(path.read_text()).body:
      if isinstance(node, ast.FunctionDef) and not node.name.startswith('_'):
        args = node.args
        if len(args.posonlyargs + args.args + args.kwonlyargs) > MAX_KEYWORDS:
          out.add(f'{name}.{node.name}')
  return out


def test_long_study_entry_points_take_settings(tmp_path):
  studies = {m: p for m, p in _modules().items() if m.startswith('graftjax.studies.')}
  assert _long_signatures(studies) == set()
  # The check can fail: eleven parameters, positional or keyword, are found; ten and a
  # private helper's are not.
  fake = tmp_path / 'fake.py'
  fake.write_text(
    'def long(a, b, *, c, d, e, f, g, h, i, j, k): ...\n'
    'def mixed(a, b, c, d, e, f, g, h, i, j, /, k): ...\n'
    'def short(a, b, *, c, d, e, f, g, h, i, j): ...\n'
    'def _helper(a, b, *, c, d, e, f, g, h, i, j, k): ...\n'
  )
  assert _long_signatures({'fake': fake}) == {'fake.long', 'fake.mixed'}


def test_setup_cfg_lists_every_package():
  """A package missing from setup.cfg imports from an editable install but not from a wheel."""
  config = configparser.ConfigParser()
  config.read(ROOT / 'setup.cfg')
  listed = set(config['options']['packages'].split())
  found = {
    '.'.join((package, *init.parent.relative_to(folder).parts))
    for package, folder in PACKAGES.items()
    for init in folder.rglob('__init__.py')
  }
  assert 'graftjax.routing' in found
  assert sorted(found - listed) == [] and sorted(listed - found) == []
