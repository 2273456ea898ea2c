"""Automatic exact prefix reuse in a few lines: two prompts that share a prefix, the second
prefilled with the first's spans grafted in, its logits byte-equal to a cold prefill's.

A tiny random Gemma 3 on the Pallas kernels (interpreted on a CPU), a store in a temporary
folder. docs/prefix.md walks through it; tests/test_doc_commands.py runs it.

    python docs/examples/prefix_reuse.py
"""

from graftjax import determinism

determinism.pin()

import tempfile

import numpy as np

from graftjax import prefix
from graftjax import store
from graftjax.models.gemma import model as gemma_model


def main() -> None:
  model = gemma_model.tiny().with_impl('pallas')  # chunk-invariant: hits end at any token
  shared = list(b'You are a careful assistant. Context: the sky is blue. ')
  first, second = shared + list(b'Q: colour?'), shared + list(b'Q: why?')
  with tempfile.TemporaryDirectory() as root:
    engine = prefix.Engine(model, store.BlockStore(root), span=16, capacity=128, chunk_size=16)
    engine.prefill(first)  # cold: nothing stored yet; deposits its spans
    out = engine.prefill(second)  # grafts the longest stored prefix, prefills the rest
  cache = model.init_cache(capacity=128)
  cold, _ = model.prefill(second, cache=cache, chunk_size=len(second))  # one call, no reuse
  assert out.logits.tobytes() == np.asarray(cold[0]).tobytes()
  print(f'{len(second)} tokens: {out.hit} reused, {out.recomputed} computed; logits byte-equal')


if __name__ == '__main__':
  main()
