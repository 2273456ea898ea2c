"""The per-sample digest comparison of a sharded run with a one-device run, and its page."""

import pytest

from graftjax.studies.common import results_page as page
from graftjax.studies.sharding import compare
from graftjax.studies.sharding import section_sharding


def _sample(source, digest):
  return {
    'source': source,
    'sha256_prefix_ids': f'p-{source}',
    'sha256_continuation_ids': f'c-{source}',
    'fresh_vs_grafted': {
      'logits': {'sha256_reference': digest, 'sha256_candidate': digest, 'byte_equal': True}
    },
  }


SCHEDULE = {'chunk_size': 64, 'capacity': 384, 'rollout_tokens': 64}


def _sharded(model_devices, digests):
  return {
    'mode': 'gate',
    'settings': {'model': 'gemma4-31b', 'dtype': 'bfloat16'},
    'mesh': {'data': 1, 'model': model_devices, 'visible_devices': 8, 'device_kind': 'H100'},
    'schedule': SCHEDULE,
    'samples': [_sample(s, d) for s, d in digests],
  }


def _single(digests):
  run = {'dtype': 'bfloat16', 'schedule': SCHEDULE, 'samples': [_sample(s, d) for s, d in digests]}
  return {'experiment': 'exactness', 'runs': [run]}


def test_a_split_names_its_all_reduces_and_the_first_differing_sample():
  single = _single([('a.py', '1'), ('b.py', '2'), ('c.py', '3')])
  report = compare.compare(_sharded(8, [('a.py', '1'), ('b.py', 'x'), ('z.py', '9')]), single)
  assert report['samples_matched'] == 2 and report['samples_equal'] == 1
  assert report['first_differing']['source'] == 'b.py'
  assert not report['reduction_order_same'] and report['as_expected']
  assert [r.split(' (')[0] for r in report['split_reductions']] == [
    'o-projection',
    'down-projection',
  ]
  assert 'o-projection' in report['reason'] and 'down-projection' in report['reason']


def test_one_device_along_model_expects_equal_digests():
  single = _single([('a.py', '1')])
  report = compare.compare(_sharded(1, [('a.py', '1')]), single)
  assert report['reduction_order_same'] and report['expected_equal'] and report['as_expected']
  assert report['first_differing'] is None and report['reason'] is None
  unexpected = compare.compare(_sharded(1, [('a.py', '2')]), single)
  assert unexpected['as_expected'] is False


def test_a_bench_file_does_not_compare():
  with pytest.raises(compare.CompareError, match='bench'):
    compare.compare({**_sharded(2, []), 'mode': 'bench'}, _single([]))


def test_the_page_renders_a_gate_and_a_comparison():
  gate = {
    **_sharded(8, [('a.py', '1')]),
    'result_sha256': 'f' * 64,
    'determinism': {'device_kind': 'NVIDIA H100', 'jax_version': '0'},
    'summary': {'fresh_vs_grafted': {'byte_equal': 1, 'samples': 1, 'kl_max': 0.0}},
  }
  report = compare.compare(gate, _single([('a.py', '2')]))
  results = [
    page.Result('sharding/sharded_gate.json', gate),
    page.Result('sharding/compare.json', {**gate, 'mode': 'compare', **report}),
  ]
  text = '\n'.join(section_sharding.render(results))
  assert 'sharding/sharded_gate.json' in text and 'a.py' in text
  assert section_sharding.finding(results).startswith('gate 1/1 on 1 x 8 of 8')
  assert 'No run yet' in '\n'.join(section_sharding.render([]))


def test_the_page_renders_a_bench_with_its_block_bytes():
  row = {
    'prefix_tokens': 4096,
    'recompute_median_s': 0.9,
    'graft_median_s': 0.1,
    'speedup': 9.0,
    'first_token_byte_equal': True,
    'block_bytes': 1_234_567,
    'restore_bytes_per_device': [600_000, 634_407],
  }
  bench = {
    **_sharded(2, []),
    'mode': 'bench',
    'result_sha256': 'f' * 64,
    'determinism': {'device_kind': 'NVIDIA H100', 'jax_version': '0'},
    'rows': [row],
  }
  text = '\n'.join(section_sharding.render([page.Result('sharding/sharded_bench.json', bench)]))
  assert '1,234,567' in text and '634,407' in text and '9.0x' in text
