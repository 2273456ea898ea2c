r"""llama.cpp as the peer for graft timing: prefill vs `llama_state_seq_load_file`.

Runs in an interpreter that has llama-cpp-python (the project's tests never
need it). Prints one JSON object: for each prefix length, the seconds to
prefill the prefix and decode one token, and the seconds to restore the
saved sequence state from its file and decode one token.

    python experiments/peers/llamacpp_restore.py GGUF TOKENS.json THREADS
"""

import ctypes
import json
import os
import sys
import tempfile
import time

import llama_cpp


def _context(gguf: str, n_ctx: int, threads: int) -> llama_cpp.Llama:
  return llama_cpp.Llama(
    model_path=gguf,
    n_ctx=n_ctx,
    n_batch=512,
    n_ubatch=512,
    n_threads=threads,
    n_threads_batch=threads,
    type_k=0,
    type_v=0,  # f32 KV cache, as ours
    logits_all=False,
    verbose=False,
  )


def measure(gguf: str, prefix: list[int], next_token: int, threads: int) -> dict:
  n_ctx = len(prefix) + 64
  llm = _context(gguf, n_ctx, threads)
  t0 = time.perf_counter()
  llm.eval(prefix)
  llm.eval([next_token])
  prefill_s = time.perf_counter() - t0
  path = os.path.join(tempfile.mkdtemp(), 'state.bin')
  tokens = (llama_cpp.llama_token * len(prefix))(*prefix)
  llama_cpp.llama_state_seq_save_file(llm.ctx, path.encode(), 0, tokens, len(prefix))
  size = os.path.getsize(path)
  del llm
  llm = _context(gguf, n_ctx, threads)
  out = (llama_cpp.llama_token * n_ctx)()
  count = ctypes.c_size_t(0)
  t0 = time.perf_counter()
  read = llama_cpp.llama_state_seq_load_file(
    llm.ctx, path.encode(), 0, out, n_ctx, ctypes.byref(count)
  )
  t_loaded = time.perf_counter()
  if read == 0 or count.value != len(prefix):
    raise RuntimeError(f'llama.cpp restored {count.value} of {len(prefix)} tokens')
  llm.n_tokens = len(prefix)
  llm.input_ids[: len(prefix)] = prefix
  llm.eval([next_token])
  restore_s = time.perf_counter() - t0
  os.remove(path)
  return {
    'prefix_tokens': len(prefix),
    'prefill_and_first_token_s': prefill_s,
    'restore_and_first_token_s': restore_s,
    'load_file_s': t_loaded - t0,
    'state_file_bytes': size,
  }


def main(argv):
  gguf, tokens_path, threads = argv[1], argv[2], int(argv[3])
  request = json.loads(open(tokens_path).read())
  results = [
    measure(gguf, prefix, request['next_token'], threads) for prefix in request['prefixes']
  ]
  print(
    json.dumps({'llama_cpp_python': llama_cpp.__version__, 'threads': threads, 'results': results})
  )


if __name__ == '__main__':
  main(sys.argv)
