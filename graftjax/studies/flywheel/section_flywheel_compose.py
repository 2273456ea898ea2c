"""The results page on the `flywheel_compose` study:

Composing the top-k routed blocks side by side.
"""

from __future__ import annotations

from graftjax.studies.common import results_page as page
from graftjax.studies.flywheel import section_flywheel as flywheel


def render(results: list[page.Result]) -> list[str]:
  out = [
    'Deposited blocks composed side by side (`graftjax.compose`: rope_relative, one'
    ' attention segment per block, pages of whole Pallas splits); each deposited item asked'
    ' again after its own block and k - 1 BM25-routed distractors (`k<k>`: own block last, next'
    ' to the query; `_own_first`: furthest from it), held-out instances of the templates (never'
    ' deposited) after the top-1 and top-3 routed blocks'
    " (best last). Exactness: the query's logits (SHA-256 of their bytes) and the cache against"
    ' a fresh block-attention prefill of the same layout, packed from slot 0 and shifted by one'
    ' page. Intervals are Wilson 95%; method: docs/composition.md.',
    '',
  ]
  for r in results:
    d = r.data
    sources = [x['source'] if x.get('key') else 'refused' for x in d['deposits']]
    counts = ', '.join(f'{sources.count(s)} {s}' for s in sorted(set(sources)))
    not_asked = d.get('not_asked', {})
    base = (
      f'after one greedy base attempt of {d["base_tokens"]} tokens per item'
      if d['base_tokens']
      else "no base attempts: each deposit is the dataset's reference solution"
    )
    out += [
      f'{page.cite(r)}: `{d["model"]}` {d["dtype"]} on {r.device.split(",")[0]}; deposits: {counts}'
      f' ({base}); not asked before the deadline: {not_asked.get("recall", 0)} recurring,'
      f' {not_asked.get("held_out", 0)} held-out. XLA refused: "'
      f'{d["refusals"]["xla"].split(". ")[0]}."',
      '',
    ]
    rows = [
      [
        name,
        f'{e["logits_byte_equal"]}/{e["total"]}',
        f'{e["cache_byte_equal"]}/{e["total"]}',
        page.num(e['max_abs_logit_diff']),
      ]
      for name, e in d['summary']['exactness'].items()
    ]
    out += page.table(
      ('k / layout', 'query logits byte-equal', 'cache byte-equal', 'max abs logit diff'), rows
    )
    s = d['summary']
    rows = []
    for group, label in (('recall', 'recurring (recall)'), ('held_out', 'held-out (solve)')):
      for arm, a in s[group].items():
        rows.append(
          [label, arm, a['items'], flywheel.rate(a.get('accuracy')), flywheel.phase_tokens(a)]
          if a['items']
          else [label, arm, 0, '-', '-']
        )
    out += [''] + page.table(
      ('questions', 'blocks', 'items', 'accuracy', 'decode tokens / answer'), rows
    )
    paired = [
      [pair, p['items'], p['only_first'], p['only_second']] for pair, p in s['paired'].items()
    ]
    top1 = s.get('held_out_top1_is_template')
    out += [
      '',
      'Paired over the same items: answered right by the first arm only, by the second only;'
      f' held-out top-1 routed to its own template: {flywheel.rate(top1)}.',
      '',
      *page.table(('arms', 'items', 'only first right', 'only second right'), paired),
      '',
    ]
  return out
