"""The profile study's event arithmetic and the tile sweeps' parsing, on CPU."""

import math

import pytest

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import params
from graftjax.studies.kernels import bench_attention_tiles
from graftjax.studies.kernels import bench_matmul_tiles
from graftjax.studies.common import device_trace
from graftjax.studies.model import profile_model


def test_busy_time_is_the_union_of_intervals():
  events = [('a', 0, 10), ('b', 5, 10), ('c', 30, 5), ('d', 31, 1)]
  assert device_trace.busy_ns(events) == 20
  assert device_trace.busy_ns([]) == 0


def test_summary_sums_by_name_largest_first():
  events = [('mm', 0, 4000), ('norm', 5000, 1000), ('mm', 7000, 2000)]
  s = device_trace.summarize(events, wall_s=1e-5, top=1)
  assert s['kernel_calls'] == 3 and s['device_busy_us'] == 7.0 and s['wall_us'] == 10.0
  assert s['kernels'] == [{'name': 'mm', 'calls': 2, 'total_us': 6.0, 'mean_us': 3.0}]


@pytest.mark.slow
def test_profile_of_the_tiny_model_finds_kernels():
  result = profile_model.experiment(
    dtype='float32',
    impls=['xla'],
    model_name='tiny',
    prompt_tokens=16,
    decode_tokens=2,
    chunk_size=8,
    top=5,
    log=lambda _: None,
  )
  for phase in ('xla_prefill', 'xla_decode'):
    s = result['phases'][phase]
    assert s['kernel_calls'] > 0 and 0 < s['device_busy_us']
    assert len(s['kernels']) <= 5


def test_matmul_candidates_are_parsed_or_refused():
  assert bench_matmul_tiles.parse_candidate('16,32,128,4,3') == {
    'block_m': 16,
    'block_n': 32,
    'block_k': 128,
    'num_warps': 4,
    'num_stages': 3,
  }
  with pytest.raises(ValueError, match='block_m,block_n'):
    bench_matmul_tiles.parse_candidate('16,32,128')
  with pytest.raises(ValueError, match='unknown shapes'):
    bench_matmul_tiles.sweep(
      bench_matmul_tiles.Settings(
        dtypes=['float32'], rows=[1], candidates=[], shapes=['qkv'], iters=1, time_budget_s=1
      )
    )


@pytest.mark.slow
def test_matmul_sweep_compares_bytes_with_the_default_tiles():
  result = bench_matmul_tiles.sweep(
    bench_matmul_tiles.Settings(
      dtypes=['float32'],
      rows=[1],
      candidates=['16,64,32,4,3', '64,64,64,4,3'],
      shapes=['kv'],
      iters=1,
      time_budget_s=300,
      interpret=True,
    ),
    log=lambda _: None,
  )
  pallas = {r['candidate']: r for r in result['rows'] if r['impl'] == 'pallas'}
  assert pallas['64,64,32,4,3']['bits_equal_default']
  assert pallas['16,64,32,4,3']['bits_equal_default']  # rows are independent of block_m
  # In the interpreter block_k changes the order of the float32 sums.
  assert not pallas['64,64,64,4,3']['bits_equal_default']


def test_attention_candidates_take_the_launch_knobs():
  sizes, knobs = bench_attention_tiles.parse_candidate('4,64,512,4,2,1,8,16')
  assert (sizes.block_k, sizes.block_s, sizes.num_warps) == (64, 512, 4)
  assert (sizes.combine_group, sizes.combine_block_h) == (8, 16)
  assert knobs == {'num_stages': 2, 'combine_stages': 1}
  assert bench_attention_tiles.parse_candidate('4,64,512,4')[1] == {}
  for bad in ('4,64,512,4,2', '4,64,512,4,2,1,8,16,1', '4,64,512,x'):
    with pytest.raises(ValueError, match='combine_group'):
      bench_attention_tiles.parse_candidate(bad)


@pytest.mark.slow
def test_attention_sweep_can_trace_each_call():
  result = bench_attention_tiles.sweep(
    bench_attention_tiles.Settings(
      candidates={'float32': ['4,32,256,4'], 'bfloat16': []},
      decode_lengths=[64],
      prefill_lengths=[],
      iters=1,
      time_budget_s=300,
      interpret=True,
      quick=True,
      trace_kernels=3,
    ),
    log=lambda _: None,
  )
  timed = [r for r in result['rows'] if 'device_s' in r]
  assert timed and all(0 < len(r['kernels']) <= 3 for r in timed)
  assert result['settings']['trace_kernels'] == 3
  assert result['settings']['prefill_lengths'] == [64]  # --quick's sizes, as run


@pytest.mark.parametrize('name', ['gemma3-270m', 'gemma3-12b', 'gemma3-27b'])
def test_projection_shapes_are_the_models_tensors(name):
  config = config_lib.get_config(name)
  shapes = {spec.key[-1]: spec.shape for spec in params.param_specs(config)}
  as_matrix = lambda shape, contracted: (
    math.prod(shape[:contracted]),
    math.prod(shape[contracted:]),
  )
  want = {
    'q': as_matrix(shapes['q'], 1),
    'kv': as_matrix(shapes['k'], 1),
    'o': as_matrix(shapes['o'], 2),
    'gate_up': shapes['up'],
    'down': shapes['down'],
    'unembed': shapes['embedding'][::-1],
  }
  assert {name: (k, n) for name, k, n in bench_matmul_tiles.projection_shapes(config)} == want
