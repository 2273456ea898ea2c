"""Shared pieces of the prefix tests: tiny models, prompts, stores and cold references."""

import functools

import numpy as np
import tensorstore as ts
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model

from graftjax import prefix
from graftjax import store as store_lib

N = 20  # prompt tokens
CHUNK = 4
SPAN = 8
CAPACITY = 64
IDS = np.random.default_rng(11).integers(3, 256, N).astype(np.int32)


@functools.cache
def model(name: str = 'tiny', impl: str = 'pallas', **overrides):
  """The tiny Gemma 3 ('tiny') or a tiny Gemma 4 structure, under `impl`."""
  if name == 'tiny':
    return gemma_model.tiny(**overrides).with_impl(impl)
  return gemma_model.random(config_lib.get_config(name, **overrides), seed=3).with_impl(impl)


# The fewest layers that keep each structure (a program's compile time grows with its layers):
# Gemma 3, one sliding and one global layer; E2B, a sliding and a global layer each read
# again by a kv-sharing layer of its kind.
_LEAN = {
  'tiny': dict(attention_types=config_lib.attention_pattern(2, 1)),
  'tiny-gemma4-e2b': dict(
    attention_types=config_lib.attention_pattern(4, 1), num_kv_shared_layers=2
  ),
}


def lean(name: str = 'tiny', impl: str = 'pallas'):
  """`model(name, impl)` cut to the layers `_LEAN` names."""
  return model(name, impl, **_LEAN[name])


def memory_store() -> store_lib.BlockStore:
  return store_lib.BlockStore(ts.KvStore.open('memory://').result())


def engine(m, store=None, **kwargs) -> prefix.Engine:
  options = dict(span=SPAN, capacity=CAPACITY, chunk_size=CHUNK) | kwargs
  return prefix.Engine(m, store if store is not None else memory_store(), **options)


def cold(m, ids=IDS, *, chunk_size=None, capacity=CAPACITY) -> np.ndarray:
  """Last-token logits [V] of a cold prefill (single pass unless `chunk_size`)."""
  cache = m.init_cache(capacity=capacity)
  out, _ = m.prefill(ids, cache=cache, chunk_size=chunk_size or len(ids), logits='last')
  return np.asarray(out[0])


def diverging(ids, stored: int) -> np.ndarray:
  """A prompt of len(ids) tokens sharing exactly its first `stored` tokens with `ids`."""
  other = np.array(ids)
  if stored < len(ids):
    other[stored:] = (other[stored:] + 1) % 253 + 3
  return other
