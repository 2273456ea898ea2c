"""The results page on the `profile` study: Where does the time go on the H200?"""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def render(results: list[page.Result]) -> list[str]:
  out = [
    'Device kernels of one prefill and one decode from a jax trace, summed by name (the'
    " profiler's own overhead is in the wall time). Top kernels by total time.",
  ]
  for r in results:
    d = r.data
    out += [
      '',
      f'**{page.cite(r)}**: {d["dtype"]}, {d["prompt_tokens"]} prompt tokens in chunks of'
      f' {d["chunk_size"]}, {d["decode_tokens"]} decoded.',
      '',
    ]
    rows = []
    for phase, s in d['phases'].items():
      top = ', '.join(
        f'{k["name"][:40]} {k["calls"]}x {k["mean_us"]:.1f} us' for k in s['kernels'][:4]
      )
      rows.append(
        [
          phase,
          f'{s["wall_us"] / 1e3:,.1f}',
          f'{s["device_busy_us"] / 1e3:,.1f}',
          f'{s["kernel_calls"]:,}',
          top,
        ]
      )
    out += page.table(('kernels / phase', 'wall ms', 'device busy ms', 'kernels', 'largest'), rows)
  return out
