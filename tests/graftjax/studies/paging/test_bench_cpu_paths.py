"""bench_cpu_paths: one prefill timed under each attention path, the interpreter only when short."""

import json

import pytest

from graftjax.studies.paging import bench_cpu_paths


@pytest.mark.slow
def test_every_path_is_timed_and_the_interpreter_only_up_to_its_length():
  result = bench_cpu_paths.experiment(
    model_name='tiny', tokens=[16, 32], capacity=256, pallas_tokens=16
  )
  timed = {(r['attention'], r['position_scheme'], r['tokens']) for r in result['rows']}
  assert timed == {(i, s, n) for i, s in bench_cpu_paths.PATHS for n in (16, 32)} - {
    ('pallas', 'rope_relative', 32)
  }
  assert all(r['prefill_s'] > 0 and r['first_s'] > 0 for r in result['rows'])
  assert 'xla_split_rope_relative_over_xla_rope_32' in result['summary']
  assert 'pallas_rope_relative_over_xla_rope_16' in result['summary']
  json.dumps(result)
