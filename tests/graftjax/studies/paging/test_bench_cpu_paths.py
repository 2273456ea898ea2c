"""bench_cpu_paths: one prefill timed under each attention path, the interpreter only when short."""

import json

import pytest

from graftjax.studies.paging import bench_cpu_paths


@pytest.mark.slow
def test_every_path_is_timed_and_the_interpreter_only_up_to_its_length():
  result = bench_cpu_paths.experiment(
    model_name='tiny', tokens=[8, 16], capacity=128, pallas_tokens=8
  )
  timed = {(r['attention'], r['position_scheme'], r['tokens']) for r in result['rows']}
  assert timed == {(i, s, n) for i, s in bench_cpu_paths.PATHS for n in (8, 16)} - {
    ('pallas', 'rope_relative', 16)
  }
  assert all(r['prefill_s'] > 0 and r['first_s'] > 0 for r in result['rows'])
  assert 'xla_split_rope_relative_over_xla_rope_16' in result['summary']
  assert 'pallas_rope_relative_over_xla_rope_8' in result['summary']
  json.dumps(result)
