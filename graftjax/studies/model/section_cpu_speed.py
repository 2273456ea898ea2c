"""The results page on the `cpu_speed` study: How fast is the model on CPU?"""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def render(results: list[page.Result]) -> list[str]:
  out = []
  for r in results:
    d = r.data
    out += [
      f'{page.cite(r)}: {d["prompt_tokens"]}-token prompt in chunks of {d["chunk_size"]}, then'
      f' {d["decode_tokens"]} decoded tokens, {d["cpu_count"]} cores, {r.device}.',
      '',
    ]
    out += page.table(
      ('engine', 'prefill tok/s', 'decode tok/s'),
      [
        [
          name,
          f'{row["prefill_tokens_per_s"]:,.1f}',
          f'{row["decode_tokens_per_s"]:,.1f}',
        ]
        for name, row in d['rows'].items()
      ],
    )
    out.append('')
  return out
