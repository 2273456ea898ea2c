"""The results page on the `reference_agreement` study:

Does the model agree with independent references?
"""

from __future__ import annotations

from graftjax.studies.results_page import Result, cite, num, pct, table


def render(results: list[Result]) -> list[str]:
  out = []
  for r in results:
    hf, lc = r.data['overall']['hf'], r.data['overall']['llamacpp']
    out += [f'{cite(r)}, {r.data["dtype"]}:', '']
    out += table(
      ('reference', 'prompts', 'positions', 'figure', 'value', 'bound'),
      [
        [
          'HF transformers (float32)',
          hf['prompts'],
          hf['tokens'],
          'max abs Δlogit over its top-20',
          num(hf['topk_max_abs_diff']),
          f'{num(hf["tolerance"])} ({hf["within_tolerance"]}/{hf["prompts"]} prompts within)',
        ],
        ['', '', '', 'max abs Δ log-sum-exp', num(hf['lse_max_abs_diff']), num(hf['tolerance'])],
        ['', '', '', 'argmax agreement', pct(hf['argmax_agreement']), ''],
        ['', '', '', 'greedy continuations equal', f'{hf["greedy_ok"]}/{hf["prompts"]}', ''],
        [
          'llama.cpp (Q4_K_M weights, f32 KV)',
          lc['prompts'],
          lc['tokens'],
          'top-1 agreement',
          pct(lc['top1_agreement']),
          f'at least {pct(lc["top1_min_required"])}',
        ],
        ['', '', '', 'abs Δlogit over its top-20: mean', num(lc['topk_mean_abs_diff']), ''],
        [
          '',
          '',
          '',
          '... p99 / max',
          f'{num(lc["topk_p99_abs_diff"])} / {num(lc["topk_max_abs_diff"])}',
          '',
        ],
      ],
    )
    out.append('')
  return out + [
    'The tokenizer agrees with llama.cpp id for id on its fixture'
    ' (`tests/fixtures/tokenizer_llamacpp.json`, checked by the tests, not a result file).'
  ]
