r"""llama.cpp as the speed peer: prefill and decode tokens/s on given tokens.

    python experiments/peers/llamacpp_speed.py GGUF TOKENS.json THREADS DECODE_TOKENS

Prints one JSON object. Runs in an interpreter with llama-cpp-python.
"""

import json
import sys
import time

import llama_cpp
import numpy as np


def _last_argmax(llm) -> int:
  """Argmax of the logits of the last evaluated token."""
  logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
  return int(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).argmax())


def main(argv):
  gguf, tokens_path, threads, decode_tokens = argv[1], argv[2], int(argv[3]), int(argv[4])
  prompt = json.loads(open(tokens_path).read())
  llm = llama_cpp.Llama(
    model_path=gguf,
    n_ctx=len(prompt) + decode_tokens + 8,
    n_batch=512,
    n_threads=threads,
    n_threads_batch=threads,
    type_k=0,
    type_v=0,
    verbose=False,
  )
  t0 = time.perf_counter()
  llm.eval(prompt)
  prefill_s = time.perf_counter() - t0
  token = _last_argmax(llm)
  t0 = time.perf_counter()
  for _ in range(decode_tokens):
    llm.eval([token])
    token = _last_argmax(llm)
  decode_s = time.perf_counter() - t0
  print(
    json.dumps(
      {
        'llama_cpp_python': llama_cpp.__version__,
        'threads': threads,
        'kv_cache': 'f32',
        'weights': 'Q4_K_M as stored',
        'prefill_tokens_per_s': len(prompt) / prefill_s,
        'decode_tokens_per_s': decode_tokens / decode_s,
      }
    )
  )


if __name__ == '__main__':
  main(sys.argv)
