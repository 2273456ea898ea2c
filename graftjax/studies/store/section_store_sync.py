"""The results page on the `store_sync` study: a catalog's sync cost, and moved blocks."""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def _sync(r: page.Result) -> list[str]:
  d = r.data
  rows = [
    [
      row['phase'],
      f'{row["listed"]:,}',
      f'{row["manifests_read"]:,}',
      f'{row["added"]:,}',
      page.num(row['sync_s']),
      page.num(row['sync_list_s']),
      page.num(row['listing_alone_s']),
    ]
    for row in d['rows']
  ]
  s = d['summary']
  head = (
    f'**Catalog sync** on {d["backend"]}, {page.cite(r)}: {d["blocks"]:,} small synthetic'
    f' blocks ({d["objects_listed"]:,} objects listed at the end), then {d["new"]:,} more.'
    ' Only the manifests of blocks not seen before are read; every sync lists the store'
    f' (every object of every block), the floor of its cost: the no-op'
    f' sync took {page.num(s["noop_sync_s"])} s, the listing alone {page.num(s["listing_s"])} s;'
    f' a manifest read cost {page.num(s["full_ms_per_manifest"])} ms in the full sync.'
  )
  return [
    head,
    '',
    *page.table(
      (
        'sync',
        'blocks listed',
        'manifests read',
        'rows added',
        'sync s',
        'its listing s',
        'listing alone s',
      ),
      rows,
    ),
    '',
  ]


def _graft(r: page.Result) -> list[str]:
  d, s = r.data, r.data['summary']
  line = (
    f'**A block moved between machines** ({d["model"]}), {page.cite(r)}: deposited on'
    f' {d["deposited_on"]}, grafted on {d["grafted_on"]}. Block files identical:'
    f' {page.yes(s["block_files_equal"])}; grafted logits byte-equal to a fresh prefill there:'
    f' {page.yes(s["grafted_equals_fresh_here"])}; fresh logits equal to the depositing'
    f" machine's: {page.yes(s['fresh_equals_depositing_machines_fresh'])}."
  )
  return [line, '']


def render(results: list[page.Result]) -> list[str]:
  out = []
  for r in results:
    mode = r.data.get('mode')
    if r.data.get('experiment') == 'bench_store_sync':
      out += _sync(r)
    elif mode == 'graft':
      out += _graft(r)
    else:
      out += [f'{page.cite(r)}: every scalar of its summary.', *page.scalars(r.data['summary']), '']
  return out[:-1]
