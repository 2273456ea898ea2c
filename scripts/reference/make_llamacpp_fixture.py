"""Reference logits of llama.cpp (llama-cpp-python) on the gemma-3-270m GGUF.

Run from the repository root with the reference venv, after
make_hf_fixture.py (the prompts' token ids are read from its fixture, so both
fixtures hold exactly the same sequences):

  REFENV/bin/python scripts/reference/make_llamacpp_fixture.py

Writes tests/fixtures/llamacpp_reference.json: for every prompt, the top-1 id
at every position and the top-20 ids and float32 logits at the same positions
as the HF fixture. (No log-sum-exp: llama.cpp's quantized activations move the
far tail of the vocabulary, so it says nothing the top-20 does not.) llama.cpp runs on the CPU with `logits_all=True`, an f32 KV cache
(the default f16 cache alone moves logits by ~1e-2), 2 threads; each prompt is
evaluated from an empty cache.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import pathlib
import platform
import time

import numpy as np

import fixture_io
import hf_from_gguf

GGML_TYPE_F32 = 0


def _llama(gguf_path: str, *, n_ctx: int, n_batch: int, threads: int):
  import llama_cpp

  return llama_cpp.Llama(
    model_path=gguf_path,
    n_ctx=n_ctx,
    n_batch=n_batch,
    n_ubatch=n_batch,
    n_threads=threads,
    n_threads_batch=threads,
    logits_all=True,
    type_k=GGML_TYPE_F32,
    type_v=GGML_TYPE_F32,
    flash_attn=False,
    seed=0,
    verbose=False,
  )


def _prompt_record(llm, prompt: dict) -> dict:
  ids = prompt['token_ids']
  llm.reset()
  llm.eval(ids)
  logits = np.array(llm.scores[: len(ids)], dtype=np.float32)  # [T, V]
  if not np.isfinite(logits).all():
    raise ValueError(f'{prompt["name"]}: non-finite logits')
  positions = prompt['topk']['positions']
  order = np.argsort(-logits[positions], axis=-1, kind='stable')[:, : fixture_io.TOP_K]
  return {
    'name': prompt['name'],
    'token_ids': ids,
    'top1': logits.argmax(axis=-1).tolist(),
    'topk': {
      'positions': positions,
      'ids': order.tolist(),
      'logits': [fixture_io.f32_list(row[o]) for row, o in zip(logits[positions], order)],
    },
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gguf', default=hf_from_gguf.GGUF_PATH)
  parser.add_argument('--hf_fixture', default=str(fixture_io.HF_FIXTURE))
  parser.add_argument('--output', default=str(fixture_io.LLAMACPP_FIXTURE))
  parser.add_argument('--threads', type=int, default=2)
  parser.add_argument('--n_ctx', type=int, default=2048)
  parser.add_argument('--n_batch', type=int, default=512)
  args = parser.parse_args()

  hf = json.loads(pathlib.Path(args.hf_fixture).read_text(encoding='utf-8'))
  longest = max(len(p['token_ids']) for p in hf['prompts'])
  if longest > args.n_ctx:
    raise ValueError(f'n_ctx={args.n_ctx} is shorter than the longest prompt ({longest})')
  gguf_sha = hf_from_gguf.file_sha256(args.gguf)
  if gguf_sha != hf['gguf']['sha256']:
    raise ValueError(f"GGUF {gguf_sha} differs from the HF fixture's {hf['gguf']['sha256']}")

  started = time.time()
  llm = _llama(args.gguf, n_ctx=args.n_ctx, n_batch=args.n_batch, threads=args.threads)
  records = []
  for prompt in hf['prompts']:
    tic = time.time()
    records.append(_prompt_record(llm, prompt))
    print(
      f'{prompt["name"]}: {len(prompt["token_ids"])} tokens, {time.time() - tic:.1f}s', flush=True
    )

  header = {
    'format': fixture_io.FORMAT,
    'reference': 'llama.cpp via llama-cpp-python, CPU, f32 KV cache, logits_all',
    'command': fixture_io.command_line(),
    'versions': {
      'python': platform.python_version(),
      'llama_cpp_python': importlib.metadata.version('llama_cpp_python'),
      'numpy': np.__version__,
    },
    'gguf': {'path': args.gguf, 'sha256': gguf_sha},
    'hf_fixture_sha256': fixture_io.sha256_file(args.hf_fixture),
    'settings': {
      'n_ctx': args.n_ctx,
      'n_batch': args.n_batch,
      'n_ubatch': args.n_batch,
      'n_threads': args.threads,
      'type_k': 'f32',
      'type_v': 'f32',
      'flash_attn': False,
      'top_k': fixture_io.TOP_K,
      'topk_positions': 'those of the HF fixture',
    },
    'seconds': round(time.time() - started, 1),
  }
  fixture_io.write(pathlib.Path(args.output), header, records)
  print(f'wrote {args.output}')


if __name__ == '__main__':
  main()
