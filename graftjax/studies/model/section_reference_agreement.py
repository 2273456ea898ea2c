"""The results page on the `reference_agreement` study:

Does the model agree with independent references?
"""

from __future__ import annotations

from graftjax.studies.common import results_page as page


def finding(results: list[page.Result]) -> str:
  """Per file, the HF comparison's prompts within the bound and its largest difference."""
  parts = []
  for r in results:
    hf = r.data['overall']['hf']
    parts.append(
      f'{hf["within_tolerance"]}/{hf["prompts"]} prompts within {page.num(hf["tolerance"])} of HF'
      f' transformers (max |Δlogit| {page.num(hf["topk_max_abs_diff"])}, {r.data["dtype"]},'
      f' dots {r.data.get("dot_precision", "highest")})'
    )
  return '; '.join(parts)


def render(results: list[page.Result]) -> list[str]:
  out = []
  for r in results:
    hf, lc = r.data['overall']['hf'], r.data['overall']['llamacpp']
    out += [f'{page.cite(r)}, {r.data["dtype"]}:', '']
    out += page.table(
      ('reference', 'prompts', 'positions', 'figure', 'value', 'bound'),
      [
        [
          'HF transformers (float32)',
          hf['prompts'],
          hf['tokens'],
          'max abs Δlogit over its top-20',
          page.num(hf['topk_max_abs_diff']),
          f'{page.num(hf["tolerance"])} ({hf["within_tolerance"]}/{hf["prompts"]} prompts within)',
        ],
        [
          '',
          '',
          '',
          'max abs Δ log-sum-exp',
          page.num(hf['lse_max_abs_diff']),
          page.num(hf['tolerance']),
        ],
        ['', '', '', 'argmax agreement', page.pct(hf['argmax_agreement']), ''],
        ['', '', '', 'greedy continuations equal', f'{hf["greedy_ok"]}/{hf["prompts"]}', ''],
        [
          'llama.cpp (Q4_K_M weights, f32 KV)',
          lc['prompts'],
          lc['tokens'],
          'top-1 agreement',
          page.pct(lc['top1_agreement']),
          f'at least {page.pct(lc["top1_min_required"])}',
        ],
        ['', '', '', 'abs Δlogit over its top-20: mean', page.num(lc['topk_mean_abs_diff']), ''],
        [
          '',
          '',
          '',
          '... p99 / max',
          f'{page.num(lc["topk_p99_abs_diff"])} / {page.num(lc["topk_max_abs_diff"])}',
          '',
        ],
      ],
    )
    out.append('')
  return out + [
    'The tokenizer agrees with llama.cpp id for id on its fixture'
    ' (`tests/fixtures/tokenizer_llamacpp.json`, checked by the tests, not a result file).'
  ]
