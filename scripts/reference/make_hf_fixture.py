"""Reference logits of Hugging Face transformers on the gemma-3-270m GGUF.

Run from the repository root with the reference venv (torch, transformers,
gguf, llama-cpp-python for the tokenizer):

  REFENV/bin/python scripts/reference/make_hf_fixture.py

Writes tests/fixtures/hf_reference.json. For every prompt of
`prompt_corpus.PROMPT_SPECS` (tokenized by llama.cpp, BOS prepended) it stores,
from a float32, eager-attention Gemma3ForCausalLM built from the GGUF weights:
  * at every position: the argmax and the float64 log-sum-exp of the float32
    logits over the full vocabulary;
  * at `prompt_corpus.topk_positions`: the top-20 ids and float32 logits;
  * a 32-step greedy continuation (token ids, and per step the float32
    top-1 minus top-2 logit margin), decoded with HF's KV cache; EOS does not
    stop it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import platform
import time

import numpy as np
import torch

import fixture_io
import hf_from_gguf
import prompt_corpus

_HEAD_CHUNK = 256  # Rows of hidden state per lm_head matmul, to bound memory.


def llama_tokenizer(gguf_path: str):
  """BOS + llama.cpp's tokenization of a text, as a list of ints."""
  import llama_cpp

  vocab = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)

  def tokenize(text: str) -> list[int]:
    return vocab.tokenize(text.encode('utf-8'), add_bos=True, special=False)

  return tokenize


def _prompt_logit_stats(model, token_ids, topk_at):
  """Per-position argmax / LSE, top-k at `topk_at`, and the prefill cache."""
  ids = torch.tensor([token_ids], dtype=torch.long)
  out = model.model(input_ids=ids, use_cache=True)
  hidden = out.last_hidden_state[0]  # [T, D]
  argmax, lse, top_ids, top_values = [], [], [], []
  wanted = set(topk_at)
  for start in range(0, hidden.shape[0], _HEAD_CHUNK):
    logits = model.lm_head(hidden[start : start + _HEAD_CHUNK])  # [C, V] float32
    argmax.append(logits.argmax(-1))
    lse.append(torch.logsumexp(logits.double(), -1))
    rows = [r for r in range(logits.shape[0]) if start + r in wanted]
    values, indices = logits[rows].topk(fixture_io.TOP_K, dim=-1)
    top_ids.append(indices)
    top_values.append(values)
  last_logits = logits[-1]
  return (
    {
      'argmax': torch.cat(argmax).tolist(),
      'lse': fixture_io.f64_list(torch.cat(lse).numpy()),
      'topk': {
        'positions': list(topk_at),
        'ids': torch.cat(top_ids).tolist(),
        'logits': [fixture_io.f32_list(v) for v in torch.cat(top_values).numpy()],
      },
    },
    last_logits,
    out.cache,
  )


def _greedy(model, last_logits, cache, steps):
  """Greedy continuation from the prompt's last logits; ids and margins."""
  tokens, margins = [], []
  logits = last_logits
  for step in range(steps):
    top2 = logits.topk(2).values
    token = int(logits.argmax())
    tokens.append(token)
    margins.append(float(top2[0] - top2[1]))
    if step + 1 < steps:
      out = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
      cache = out.cache
      logits = out.logits[0, -1]
  return {'token_ids': tokens, 'margins': fixture_io.f32_list(margins)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gguf', default=hf_from_gguf.GGUF_PATH)
  parser.add_argument('--output', default=str(fixture_io.HF_FIXTURE))
  parser.add_argument('--threads', type=int, default=2)
  parser.add_argument(
    '--only', nargs='*', default=None, help='prompt names to run (for timing; default: all)'
  )
  args = parser.parse_args()

  torch.set_num_threads(args.threads)
  torch.use_deterministic_algorithms(True)
  prompts = prompt_corpus.select_all(llama_tokenizer(args.gguf))
  if args.only:
    prompts = [p for p in prompts if p.name in args.only]
  started = time.time()
  model = hf_from_gguf.load_model(args.gguf)
  print(f'model loaded in {time.time() - started:.1f}s', flush=True)

  records = []
  with torch.no_grad():
    for prompt in prompts:
      tic = time.time()
      topk_at = prompt_corpus.topk_positions(len(prompt.token_ids))
      stats, last_logits, cache = _prompt_logit_stats(model, prompt.token_ids, topk_at)
      greedy = _greedy(model, last_logits, cache, fixture_io.GREEDY_STEPS)
      records.append(
        {
          'name': prompt.name,
          'source': prompt.source,
          'source_sha256': prompt.source_sha256,
          'first_line': prompt.first_line,
          'max_tokens': prompt.max_tokens,
          'text': prompt.text,
          'token_ids': list(prompt.token_ids),
          **stats,
          'greedy': greedy,
        }
      )
      print(f'{prompt.name}: {len(prompt.token_ids)} tokens, {time.time() - tic:.1f}s', flush=True)

  header = {
    'format': fixture_io.FORMAT,
    'reference': 'huggingface transformers Gemma3ForCausalLM, float32, eager attention',
    'command': fixture_io.command_line(),
    'versions': {
      'python': platform.python_version(),
      'torch': torch.__version__,
      'transformers': importlib.metadata.version('transformers'),
      'gguf': importlib.metadata.version('gguf'),
      'numpy': np.__version__,
      'llama_cpp_python (tokenizer)': importlib.metadata.version('llama_cpp_python'),
    },
    'gguf': {'path': args.gguf, 'sha256': hf_from_gguf.file_sha256(args.gguf)},
    'settings': {
      'dtype': 'float32',
      'attn_implementation': 'eager',
      'torch_num_threads': args.threads,
      'tokenizer': 'llama.cpp (vocab_only), add_bos=True, special=False',
      'top_k': fixture_io.TOP_K,
      'topk_positions': 'all if T <= 128, else every 4th position plus the last 32',
      'lse': 'float64 logsumexp of the float32 logits over the full vocabulary',
      'greedy_steps': fixture_io.GREEDY_STEPS,
      'greedy_margin': 'float32 top-1 minus top-2 logit of the step',
    },
    'seconds': round(time.time() - started, 1),
  }
  fixture_io.write(pathlib.Path(args.output), header, records)
  print(f'wrote {args.output}')


if __name__ == '__main__':
  main()
