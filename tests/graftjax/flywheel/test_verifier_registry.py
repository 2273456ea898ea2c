"""Open verifiers: registered by name and version, recorded in each verdict, re-run by rescore."""

import json
import re
import sys

import pytest

from graftjax import ledger
from graftjax.flywheel import rescore
from graftjax.flywheel import verifiers

from tests.graftjax.flywheel import test_rescore


def contains(text, gold):
  """A user's rules: some gold answer appears in the text, commas aside."""
  gold = [g.replace(',', '') for g in gold]
  return verifiers.Check(any(g in text.replace(',', '') for g in gold), gold=gold)


USER_MODULE = f"""
from graftjax.flywheel import verifiers
from {__name__} import contains

verifiers.register('contains', 3, contains)
"""


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
  """Each test registers into a copy of the registry."""
  monkeypatch.setattr(verifiers, '_REGISTRY', dict(verifiers._REGISTRY))


def test_a_registered_verifier_records_its_name_and_version():
  exact = verifiers.register('exact', 2, lambda text, gold: text.strip() in gold)
  verdict = exact(' Paris ', ['Paris'])
  assert verdict == verifiers.Verdict(True, None, ('Paris',), 'exact', 2)
  assert verifiers.get('exact', 2) is exact and verifiers.get('exact') is exact
  assert ('exact', 2) in verifiers.registered()
  assert verifiers.Verdict.from_json(verdict.to_json()) == verdict
  assert 'detail' not in verdict.to_json()


def test_a_check_carries_extracted_gold_and_detail():
  def upper(text, gold):
    return verifiers.Check(False, text.upper(), [g.upper() for g in gold], 'timed out')

  verdict = verifiers.register('upper', 1, upper)('a', ['b'])
  assert verdict.to_json() == {
    'verdict': False,
    'extracted': 'A',
    'gold': ['B'],
    'verifier': 'upper',
    'version': 1,
    'detail': 'timed out',
  }
  assert verifiers.Verdict.from_json(verdict.to_json()) == verdict


def test_versions_coexist_and_the_newest_is_the_default():
  v1 = verifiers.register('exact', 1, lambda text, gold: text in gold)
  v2 = verifiers.register('exact', 2, lambda text, gold: text.strip() in gold)
  assert verifiers.get('exact') is v2 and verifiers.get('exact', 1) is v1
  with pytest.raises(verifiers.VerifierError, match=r'versions \[1, 2\].*version 3'):
    verifiers.get('exact', 3)


def test_another_definition_under_a_taken_name_and_version_is_refused():
  def check(text, gold):
    return text in gold

  verifiers.register('exact', 1, check)
  verifiers.register('exact', 1, check)  # the same definition again: fine
  with pytest.raises(verifiers.VerifierError, match='already registered'):
    verifiers.register('exact', 1, lambda text, gold: True)
  with pytest.raises(verifiers.VerifierError, match='already registered'):
    verifiers.register('numeric', verifiers.NUMERIC.version, check)


@pytest.mark.parametrize(
  ('name', 'version', 'fn', 'match'),
  [
    ('', 1, lambda t, g: True, 'non-empty name'),
    ('x', 0, lambda t, g: True, 'version >= 1'),
    ('x', True, lambda t, g: True, 'integer version'),
    ('x', 1, 'not a function', 'not callable'),
  ],
)
def test_a_malformed_registration_is_refused(name, version, fn, match):
  with pytest.raises(verifiers.VerifierError, match=match):
    verifiers.register(name, version, fn)


def test_a_check_of_the_wrong_type_is_named():
  bad = verifiers.register('bad', 1, lambda text, gold: 'yes')
  with pytest.raises(verifiers.VerifierError, match="'bad' v1 returned str"):
    bad('x', ['x'])


def test_an_unknown_verifier_names_the_way_to_register_it():
  with pytest.raises(verifiers.VerifierError, match='--verifiers=MODULE'):
    verifiers.get('last_word', 3)


def _user_result(tmp_path, monkeypatch, module):
  """The rescore test's result, every verdict written by a user's module's verifier."""
  (tmp_path / f'{module}.py').write_text(USER_MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  check = verifiers.Registered('contains', 3, contains)  # not registered here
  result = test_rescore.make_result()
  for a in result['attempts']:
    a['verdict'] = check(a['text'], (a['gold'],)).to_json()
  path = tmp_path / 'result.json'
  ledger.write_result(path, result)
  return path


def test_rescore_imports_only_the_modules_the_user_names(tmp_path, monkeypatch, capsys):
  path = _user_result(tmp_path, monkeypatch, 'user_verifiers_a')
  found = rescore.rescore(path)
  assert any("unknown verifier 'contains'" in p for p in found.problems), found.problems
  assert 'user_verifiers_a' not in sys.modules  # a result's names never import anything
  assert rescore.main(['--verifiers=user_verifiers_a', str(path)]) == 0
  out = capsys.readouterr().out
  assert 'verifier contains v3 registered by --verifiers' in out and 'OK: 9 attempts' in out
  again = rescore.rescore(path)
  assert again.ok and again.reverified['recurrence'] == 1


def test_rescore_reruns_the_user_verifier(tmp_path, monkeypatch):
  path = _user_result(tmp_path, monkeypatch, 'user_verifiers_b')
  result = json.loads(path.read_text())
  result['attempts'][0]['verdict']['verdict'] = True  # the rules say no
  ledger.write_result(path, result)
  assert rescore.main(['--verifiers=user_verifiers_b', str(path)]) == 1
  found = rescore.rescore(path)
  assert any('verdict.verdict recorded True, re-verified False' in p for p in found.problems)


def test_rescore_names_a_verifier_module_that_cannot_load(tmp_path, monkeypatch, capsys):
  (tmp_path / 'broken_verifiers.py').write_text('raise RuntimeError("no such rules")\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert rescore.main(['--verifiers=broken_verifiers', str(tmp_path / 'r.json')]) == 2
  err = capsys.readouterr().err
  assert "cannot import 'broken_verifiers': RuntimeError: no such rules" in err
  assert rescore.main(['--verifiers=no_such_module_here', str(tmp_path / 'r.json')]) == 2


class _AlwaysEqual(str):
  """A string that claims to equal anything (a verifier that would fake a pass)."""

  def __eq__(self, other):
    return True

  def __ne__(self, other):
    return False

  __hash__ = str.__hash__


def _cheat(text, gold):
  return verifiers.Check(contains(text, gold).verdict, extracted=_AlwaysEqual('anything'))


def _exits(text, gold):
  raise SystemExit(0)


def _raises(text, gold):
  raise RuntimeError('rules broke')


HOSTILE_MODULE = f"""
from graftjax.flywheel import verifiers
from {__name__} import {{name}}

verifiers.register('contains', 3, {{name}})
"""


@pytest.mark.parametrize(
  'name, says',
  [
    ('_exits', r'verifier contains v3: it called sys.exit\(0\)'),
    ('_raises', 'verifier contains v3: RuntimeError: rules broke'),
    ('_cheat', "extracted is 'anything', not a JSON str"),
  ],
)
def test_a_verifier_that_exits_raises_or_cheats_fails_the_rescore(
  tmp_path, monkeypatch, capsys, name, says
):
  path = _user_result(tmp_path, monkeypatch, f'user_verifiers_{name}')
  result = json.loads(path.read_text())
  result['attempts'][0]['verdict']['extracted'] = 'forged'  # only a cheat would accept it
  ledger.write_result(path, result)
  (tmp_path / f'hostile{name}.py').write_text(HOSTILE_MODULE.format(name=name))
  assert rescore.main([f'--verifiers=hostile{name}', str(path)]) == 1
  assert re.search(says, capsys.readouterr().out)


def test_a_verifier_module_that_calls_sys_exit_is_named(tmp_path, monkeypatch, capsys):
  (tmp_path / 'exiting_verifiers.py').write_text('import sys\nsys.exit(0)\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert rescore.main(['--verifiers=exiting_verifiers', str(tmp_path / 'r.json')]) == 2
  assert r"cannot import 'exiting_verifiers': it called sys.exit(0)" in capsys.readouterr().err
