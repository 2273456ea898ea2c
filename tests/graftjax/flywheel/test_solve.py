"""Batched generation: padding is invisible, shapes are shared, rows match batch 1."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from graftjax.flywheel import solve
from graftjax.models.gemma import sampler
from graftjax.models.gemma import transformer

PROMPTS = [[2, 5, 9, 11], [2, 7] * 9, [2, 3, 4, 5, 6, 7, 8], [2] + list(range(20, 60))]
# Every prompt run alone in one shape (its capacity, chunks of one token): the runs share
# their compiled programs.
ALONE = 64


def test_plan_fits_the_longest_prompt_and_the_budget():
  shapes = solve.plan([4, 70], prefix_length=10, max_new_tokens=5, rows=4, bucket=64)
  assert shapes.capacity == 192  # 10 + 128 + 5, rounded up to 64
  with pytest.raises(ValueError, match='at least one token'):
    solve.plan([3, 0], prefix_length=0, max_new_tokens=5, rows=4, bucket=64)


def test_cut_at_stop():
  assert solve.cut_at_stop([5, 6, 1, 0, 0], (1,)) == (5, 6, 1)
  assert solve.cut_at_stop([5, 6, 7], (1,)) == (5, 6, 7)


@pytest.mark.slow
def test_batched_greedy_equals_one_prompt_at_a_time(tiny_model):
  batched = solve.generate(tiny_model, PROMPTS, max_new_tokens=6, stop_ids=(1,), rows=4, bucket=16)
  for prompt, tokens in zip(PROMPTS, batched):
    alone = sampler.generate(
      tiny_model, prompt, max_new_tokens=6, stop_ids=(1,), capacity=ALONE, chunk_size=1
    )
    assert tokens == tuple(alone['tokens'])


def test_padding_slots_are_invisible(tiny_model, monkeypatch):
  """Junk tokens in the padding give the same bits as pad tokens (weight exactly 0)."""
  reference = solve.generate(tiny_model, PROMPTS, max_new_tokens=6, stop_ids=(), rows=4, bucket=16)
  real_full = np.full

  def junk_full(shape, value, dtype=None):
    if value == tiny_model.config.pad_id and dtype is np.int32 and len(shape) == 2:
      return np.random.default_rng(0).integers(3, 50, shape).astype(np.int32)
    return real_full(shape, value, dtype)

  monkeypatch.setattr(solve.np, 'full', junk_full)
  assert solve.generate(tiny_model, PROMPTS, max_new_tokens=6, stop_ids=(), rows=4, bucket=16) == (
    reference
  )


def test_prompts_of_any_length_share_compiled_programs(tiny_model):
  solve.generate(tiny_model, PROMPTS[:1], max_new_tokens=4, stop_ids=(), rows=2, bucket=64)
  before = (transformer.forward_jit._cache_size(), sampler.decode._cache_size())
  prompts = [[2] + [9] * n for n in (1, 5, 17, 40, 63)]
  solve.generate(tiny_model, prompts, max_new_tokens=4, stop_ids=(), rows=2, bucket=64)
  assert (transformer.forward_jit._cache_size(), sampler.decode._cache_size()) == before


@pytest.mark.slow
def test_a_prefix_is_the_same_as_prepending_it(tiny_model):
  prefix = [2, 40, 41, 42, 43]
  with_prefix = solve.generate(
    tiny_model,
    [p[1:] for p in PROMPTS],
    prefix_ids=prefix,
    max_new_tokens=5,
    stop_ids=(),
    rows=4,
    bucket=16,
  )
  for prompt, tokens in zip(PROMPTS, with_prefix):
    alone = sampler.generate(
      tiny_model, prefix + prompt[1:], max_new_tokens=5, stop_ids=(), capacity=ALONE, chunk_size=1
    )
    assert tokens == tuple(alone['tokens'])


_MESH_SCRIPT = """
import json, sys
from graftjax import determinism
determinism.pin()
import jax
from graftjax.flywheel import solve
from graftjax.models.gemma import model
assert jax.device_count() == 4, jax.devices()
m = model.tiny()
try:
  solve.generate(m, [[2, 3]], max_new_tokens=2, stop_ids=(), rows=6)
except ValueError as e:
  refused = 'multiple' in str(e)
prompts = json.loads(sys.argv[1])
out = solve.generate(m, prompts, max_new_tokens=6, stop_ids=(1,), rows=4, bucket=16)
cache = solve._prefix_cache(m, [2], solve.Shapes(4, 16, 64), solve.data_mesh())
print(json.dumps({'tokens': out, 'refused': refused, 'devices': len(cache.k.sharding.device_set)}))
"""


@pytest.mark.slow
def test_rows_are_split_over_every_local_device(tiny_model):
  """Four host devices (forced) run the same batches as one, each holding a quarter of the rows."""
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=4'}
  proc = subprocess.run(
    [sys.executable, '-c', _MESH_SCRIPT, json.dumps(PROMPTS)],
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report['refused'] and report['devices'] == 4
  single = solve.generate(tiny_model, PROMPTS, max_new_tokens=6, stop_ids=(1,), rows=4, bucket=16)
  assert [tuple(t) for t in report['tokens']] == single
