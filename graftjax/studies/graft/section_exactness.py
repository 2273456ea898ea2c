"""The results page on the `exactness` study: Is own-position graft byte-exact?"""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def finding(results: list[page.Result]) -> str:
  """Byte-equal samples of each run, with its model, dtype and device."""
  runs = [
    f'{run["model"]} {run["dtype"]} {g["byte_equal"]}/{g["samples"]} ({r.kind})'
    for r in results
    for run in r.data['runs']
    for g in [run['summary']['fresh_vs_grafted']]
  ]
  return 'grafted == fresh, byte-equal samples: ' + ', '.join(runs)


def render(results: list[page.Result]) -> list[str]:
  rows = []
  for r in results:
    for run in r.data['runs']:
      s = run['summary']
      graft = s['fresh_vs_grafted']
      other = s.get('fresh_vs_grafted_other_process')
      roll = s.get('rollout_fresh_vs_grafted', {})
      floor = s['fresh_vs_fresh']
      rows.append(
        [
          page.cite(r),
          r.device,
          run['dtype'],
          f'{graft["byte_equal"]}/{graft["samples"]}',
          page.num(graft['kl_max']),
          page.pct(graft['argmax_agreement']),
          page.num(graft['max_abs_diff']),
          f'{other["byte_equal"]}/{other["samples"]}' if other else '-',
          f'{roll.get("tokens_equal", "-")} / {roll.get("logits_byte_equal", "-")}'
          f' of {roll.get("samples", "-")} ({run["schedule"]["rollout_tokens"]} tokens)',
          f'{floor["byte_equal"]}/{floor["samples"]}',
        ]
      )
  header = (
    'file',
    'device',
    'dtype',
    'fresh vs grafted: byte-equal samples',
    'KL max',
    'argmax',
    'max abs Δ',
    'grafted in another process: byte-equal',
    'greedy rollouts: tokens / logit bytes equal',
    'fresh vs fresh floor',
  )
  first = results[0].data['runs'][0]['schedule']
  intro = (
    f'A {first["prefix_tokens"]}-token prefix is captured, stored, read back and grafted into'
    f' a fresh cache of {first["capacity"]} slots; the next {first["continuation_tokens"]}'
    f' tokens (chunks of {first["chunk_size"]}) are compared with a fresh prefill of the whole'
    ' text (SHA-256 of the logit bytes, KL in float64 nats, argmax).'
  )
  return [intro, ''] + page.table(header, rows)
