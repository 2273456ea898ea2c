"""Rescore and `ledger.verify_result` on hostile files: every one ends in a named problem.

Never a traceback: a mistyped, missing or absurd field anywhere in a result
is a problem naming the field; a file that is not a result (not UTF-8,
nested too deeply, non-finite numbers) is a problem naming the cause.
"""

import copy
import json

import pytest

from graftjax import ledger
from graftjax.flywheel import rescore
from tests.graftjax.flywheel import test_rescore

HOSTILE_VALUES = ('x', [], {}, None, -1, True, 2**70, 1e308, [[1]], {'a': 'b'})


def _paths(value, where=()):
  """Every path into `value` (dict keys and list indices)."""
  yield where
  if isinstance(value, dict):
    for k, v in value.items():
      yield from _paths(v, (*where, k))
  elif isinstance(value, list):
    for i, v in enumerate(value):
      yield from _paths(v, (*where, i))


def _along(result, path):
  """A copy of `result` whose containers along `path` are new, the rest shared with
  `result`; and the container `path[-1]` indexes in the copy."""
  out = node = copy.copy(result)
  for k in path[:-1]:
    node[k] = copy.copy(node[k])
    node = node[k]
  return out, node


def _replaced(result, path, value):
  out, node = _along(result, path)
  node[path[-1]] = value
  return out


def _removed(result, path):
  out, node = _along(result, path)
  del node[path[-1]]
  return out


ANY = 'any value'
# Fields rescore does not read (or reads as any value of their type), with the hostile values
# it accepts there: a change to them is not a discrepancy. Text is checked against its verdict,
# not its token ids (that needs the tokenizer); energy is recorded only when measured.
NOT_CHECKED = {
  ('experiment',): ANY,
  ('task',): ANY,
  ('inputs',): {"'missing'"},  # a result of `loop.run` alone records none
  ('inputs', 'tokenizer_sha256'): {"'missing'"},  # a model without a tokenizer
  ('inputs', 'items', '*'): {"'x'", "'missing'"},  # any name of a source
  ('budget', 'temperature'): {'1180591620717411303424', '1e+308'},  # any finite one >= 0
  ('attempts', '*', 'route_score'): {"'missing'", '-1', '1180591620717411303424', '1e+308', 'None'},
  ('attempts', '*', 'text'): {"'x'"},
  # Any finite number is a threshold some router could hold (scores are unbounded).
  ('routing', 'BM25Router', 'threshold'): {'-1', '1180591620717411303424', '1e+308'},
  ('routing', 'BM25Router', 'false_hit_abstain'): {"'missing'"},
  ('energy',): {"'missing'", 'None'},
  ('energy', 'device'): ANY,
  ('energy', 'phases'): {'{}'},
  ('energy', 'phases', 'base'): {"'missing'"},
}


def test_any_field_of_any_type_or_missing_is_a_problem_never_a_traceback():
  clean = test_rescore.make_result()
  crashed, silent = [], []
  for path in list(_paths(clean))[1:]:
    pattern = tuple('*' if isinstance(k, int) else k for k in path)
    allowed = NOT_CHECKED.get(pattern, set())
    for value in HOSTILE_VALUES + ('missing',):
      what = repr(value)
      result = _removed(clean, path) if value == 'missing' else _replaced(clean, path, value)
      try:
        found = rescore.check(result)
      except Exception as e:  # noqa: BLE001 - the point: nothing may escape
        crashed.append(f'{path} = {what}: {type(e).__name__}: {e}')
        continue
      if found.ok and result != clean and allowed != ANY and what not in allowed:
        silent.append(f'{path} = {what}')
  assert not crashed, '\n'.join(crashed[:40]) + f'\n({len(crashed)} in all)'
  assert not silent, '\n'.join(silent[:40]) + f'\n({len(silent)} in all)'
  assert clean == test_rescore.make_result()  # the changed copies shared it untouched


def _signed(tmp_path, change):
  result = test_rescore.make_result()
  change(result)
  path = tmp_path / 'result.json'
  ledger.write_result(path, result)
  return path


def _attempt(i, **fields):
  return lambda r: r['attempts'][i].update(fields)


def _drop_phase(*phases):
  def change(r):
    r['attempts'] = [a for a in r['attempts'] if a['phase'] not in phases]
    recurrence = [a for a in r['attempts'] if a['phase'] == 'recurrence']
    r['grafted_vs_prompted']['items'] = r['grafted_vs_prompted']['items'][: len(recurrence)]

  return change


def _refuse_deposits(r):
  for d in r['deposits']:
    d.update(key=None, refused='does not verify')


RESULTS = [  # (case, change to a clean result, the problem it must name)
  ('sample as text', _attempt(0, sample='0'), "attempt 0 (base t/0 sample 0): sample is '0'"),
  ('token ids as text', _attempt(1, token_ids='abc'), "token_ids is 'abc', not a JSON list"),
  ('token id beyond int32', _attempt(1, token_ids=[2**40]), 'token_ids are not int32'),
  ('verdict as a list', _attempt(2, verdict=[True]), 'verdict is [True], not a JSON dict'),
  (
    'verdict gold as numbers',
    _attempt(
      2,
      verdict={'verdict': True, 'extracted': '7', 'gold': [7], 'verifier': 'numeric', 'version': 1},
    ),
    'verdict.gold is not a list of strings',
  ),
  ('item id as a list', _attempt(0, item_id=['t/0']), "item_id is ['t/0'], not a JSON str"),
  ('missing gold', lambda r: r['attempts'][0].pop('gold'), 'missing gold'),
  ('seconds negative', _attempt(0, seconds=-1.0), 'attempts.0.seconds is -1.0, not seconds'),
  ('block key as a list', _attempt(4, block_key=['k']), "block_key is ['k'], not a JSON str"),
  ('answered by a number', _attempt(4, answered_by=3), 'answered_by is 3'),
  ('answered by nobody', _attempt(4, answered_by='me'), "answered by 'me', neither"),
  (
    'context of another length',
    _attempt(4, context_tokens=7),
    'context_tokens 7 != block_tokens 120',
  ),
  ('recurrence sample', _attempt(4, sample=3), 'sample 3, only base attempts have samples'),
  ('budget as a list', lambda r: r.update(budget=[2]), 'budget: is a JSON array'),
  ('budget samples as text', lambda r: r['budget'].update(samples='2'), "samples is '2'"),
  ('budget of no samples', lambda r: r['budget'].update(samples=0), 'samples is 0, not a positive'),
  (
    'budget samples huge',
    lambda r: r['budget'].update(samples=2**70),
    'samples is 1180591620717411303424, not a positive count',
  ),
  ('deposits as an object', lambda r: r.update(deposits={}), 'deposits: missing or not a list'),
  (
    'deposit key as a list',
    lambda r: r['deposits'][0].update(key=['a']),
    "key is ['a'], not a JSON str",
  ),
  (
    'deposit tokens as text',
    lambda r: r['deposits'][0].update(block_tokens='110'),
    "block_tokens is '110'",
  ),
  (
    'compared items as text',
    lambda r: r['grafted_vs_prompted'].update(items=['x']),
    'items[0]: is a JSON string',
  ),
  (
    'compared equality as text',
    lambda r: r['grafted_vs_prompted']['items'][0].update(tokens_equal='yes'),
    "tokens_equal is 'yes'",
  ),
  ('prompt as a list', lambda r: r.update(prompt=[]), 'prompt: is a JSON array'),
  ('no prompt', lambda r: r.pop('prompt'), 'prompt: is a JSON null'),
  ('no routing', lambda r: r.pop('routing'), 'routing: missing'),
  (
    'router as a list',
    lambda r: r['routing'].update(BM25Router=[]),
    'routing.BM25Router: is a JSON array',
  ),
  (
    'rate of text',
    lambda r: r['routing']['BM25Router']['accuracy'].update(successes='1'),
    "successes is '1'",
  ),
  (
    'rate without trials',
    lambda r: r['routing']['BM25Router']['abstain'].pop('trials'),
    'abstain: missing trials',
  ),
  ('energy as a list', lambda r: r.update(energy=[1]), 'energy: is a JSON array'),
  ('energy idle as text', lambda r: r['energy'].update(idle_watts='60'), "idle_watts is '60'"),
  (
    'energy phases as a list',
    lambda r: r['energy'].update(phases=[1]),
    'phases is [1], not a JSON dict',
  ),
  (
    'energy answers as text',
    lambda r: r['energy']['phases']['base'].update(answers='4'),
    "answers is '4'",
  ),
  ('no attempts', lambda r: r.update(attempts=[]), 'vacuous: no base attempt'),
  ('no base attempts', _drop_phase('base'), 'vacuous: no base attempt'),
  ('nothing deposited', _refuse_deposits, 'vacuous: no deposit holds a block'),
  (
    'nothing asked of the library',
    _drop_phase('recurrence', 'transfer_flywheel'),
    'vacuous: no attempt was answered',
  ),
]


@pytest.mark.parametrize('change, problem', [c[1:] for c in RESULTS], ids=[c[0] for c in RESULTS])
def test_a_hostile_result_is_a_named_problem(tmp_path, capsys, change, problem):
  path = _signed(tmp_path, change)
  found = rescore.rescore(path)
  assert found.digest_ok and not found.ok
  assert any(problem in p for p in found.problems), found.problems
  assert rescore.main([str(path)]) == 1
  assert problem in capsys.readouterr().out


def _nested(depth):
  return '{"a": ' * depth + '1' + '}' * depth


FILES = [  # (case, the file's bytes (None: no file, 'dir': a directory), the cause named)
  ('not UTF-8', b'{"task": "\xff\xfe"}', 'not UTF-8'),
  ('nested past the parser', ('[' * 100_000 + ']' * 100_000).encode(), 'nested too deeply'),
  ('nested past the limit', _nested(65).encode(), 'nested deeper than 64'),  # MAX_DEPTH 64
  ('NaN', b'{"seconds": NaN}', 'NaN is not a JSON number'),
  ('infinity', b'{"seconds": -Infinity}', '-Infinity is not a JSON number'),
  ('float beyond range', b'{"a": {"seconds": 1e999}}', 'a.seconds is inf, not a finite number'),
  ('integer of 5000 digits', b'{"sample": ' + b'9' * 5000 + b'}', 'not a result file'),
  ('empty', b'', 'not a result file'),
  ('an array', b'[1, 2]', 'the top level is a JSON array'),
  ('a key twice', b'{"a": 1, "a": 2}', "duplicate key 'a'"),
  ('absent', None, 'cannot be read'),
  ('a directory', 'dir', 'cannot be read'),
]


@pytest.mark.parametrize('data, cause', [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_a_file_that_is_not_a_result_is_an_error_naming_the_cause(tmp_path, data, cause):
  path = tmp_path / 'result.json'
  if data == 'dir':
    path.mkdir()
  elif data is not None:
    path.write_bytes(data)
  with pytest.raises(ledger.ResultError, match=f'result.json: .*{_escaped(cause)}'):
    ledger.verify_result(path)
  found = rescore.rescore(path)
  assert not found.ok and not found.digest_ok
  assert len(found.problems) == 1 and cause in found.problems[0], found.problems


def _escaped(text):
  return text.replace('.', r'\.').replace('[', r'\[')


def test_a_result_that_cannot_be_verified_is_not_written(tmp_path):
  with pytest.raises(ledger.ResultError, match=r'not written: a\.b is nan'):
    ledger.write_result(tmp_path / 'r.json', {'a': {'b': float('nan')}})
  deep = json.loads(_nested(ledger.MAX_DEPTH + 1))
  with pytest.raises(ledger.ResultError, match='nested deeper than 64'):
    ledger.write_result(tmp_path / 'r.json', deep)
  assert not (tmp_path / 'r.json').exists()


# The fields a run records about itself, each given every hostile value: a problem naming the
# field (the values left out are ones the field may hold, or names no check could tell apart).
TYPED = {
  ('inputs',): {"'missing'"},  # a result of `loop.run` alone records none
  ('inputs', 'model_fingerprint'): set(),
  ('inputs', 'items'): set(),
  ('inputs', 'tokenizer_sha256'): {'None', "'missing'"},
  ('prompt',): set(),
  ('prompt', 'prefix'): set(),
  ('prompt', 'prefix_sha256'): set(),
  ('prompt', 'query'): set(),
  ('prompt', 'code'): {'True', "'missing'"},
  ('budget',): set(),
  ('budget', 'samples'): set(),
  ('budget', 'max_new_tokens'): set(),
  ('budget', 'recall_tokens'): set(),
  ('budget', 'rows'): set(),
  ('budget', 'seed'): set(),
  ('budget', 'temperature'): {'1180591620717411303424', '1e+308', '100000000.0'},
  ('routing', 'BM25Router', 'threshold'): {'-1', '1180591620717411303424', '1e+308', '100000000.0'},
  ('attempts', 0, 'seconds'): set(),
  ('grafted_vs_prompted', 'items', 0, 'graft_seconds'): set(),
  ('grafted_vs_prompted', 'items', 0, 'prompted_seconds'): set(),
  ('energy', 'phases', 'base', 'seconds'): set(),
}
VARIANTS = [
  (path, value)
  for path, allowed in TYPED.items()
  for value in HOSTILE_VALUES + ('missing', 1e8)  # 1e8 seconds: over three years
  if repr(value) not in allowed
]


@pytest.mark.parametrize(
  'path, value', VARIANTS, ids=[f'{".".join(map(str, p))}={v!r}' for p, v in VARIANTS]
)
def test_a_mistyped_or_absurd_field_of_the_run_is_a_problem_naming_it(path, value):
  clean = test_rescore.make_result()
  result = _removed(clean, path) if value == 'missing' else _replaced(clean, path, value)
  assert result != clean
  found = rescore.check(result)
  named = str(path[-1])
  assert any(named in p for p in found.problems), found.problems
