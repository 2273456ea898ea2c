"""The results page on the `kv_bytes` study: KV bytes per cached token, full-size or ring."""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def render(results: list[page.Result]) -> list[str]:
  out = []
  for r in results:
    s = r.data['settings']
    rows = []
    for c in r.data['configs']:
      for cap in c['capacities']:
        rows.append(
          [
            c['name'],
            f'{cap["capacity"]:,}',
            f'{cap["ring_capacity"]:,}',
            f'{cap["full"]["kv_bytes_per_token"]:,.0f}',
            f'{cap["ring"]["kv_bytes_per_token"]:,.0f}',
            f'{cap["ring"]["kv_vs_global_layers"]:.3f}',
            f'{c["slots_that_fit"]["full"]:,}',
            f'{c["slots_that_fit"]["ring"]:,}',
            *(f'{cap["block_bytes"][kind] / 1e9:.3f}' for kind in ('full', 'compact')),
          ]
        )
    out += [
      f'{page.cite(r)}: {s["dtype"]}, one batch row; ring chunks of up to {s["chunk_size"]}'
      f' tokens; slots that fit {s["device_bytes"] / 1e9:.0f} GB beside the weights. A block of'
      ' capacity tokens holds every row of every layer (full, as blocks were) or the rows a'
      ' continuation sees (compact: a global layer every row, a sliding one its last W - 1).',
      '',
      *page.table(
        (
          'config',
          'capacity',
          'ring slots',
          'full B/token',
          'ring B/token',
          'ring vs the global layers own',
          'slots that fit, full',
          'slots that fit, ring',
          'block GB, full',
          'block GB, compact',
        ),
        rows,
      ),
      '',
    ]
  return out
