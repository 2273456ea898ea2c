"""The pinned configuration is applied and recorded."""

import os

from graftjax import determinism


def test_pin_sets_flags_and_records_them():
  record = determinism.pin()
  flags = os.environ['XLA_FLAGS'].split()
  for flag in determinism.pinned_xla_flags():
    assert flag in flags
  assert record['pinned_flags_present']
  assert record['jax_default_matmul_precision'] == 'highest'
  for key in ('jax_version', 'jaxlib_version', 'backend', 'device_kind', 'cpu_model'):
    assert record[key]


def test_source_sha256_names_the_code():
  """Stable across calls, recorded, and a comparable field (git metadata on
  the device machine is stale, so the digest is what tells code apart)."""
  digest = determinism.source_sha256()
  assert len(digest) == 64 and digest == determinism.source_sha256()
  assert determinism.record()['source_sha256'] == digest
  assert 'source_sha256' in determinism.COMPARABLE_FIELDS


def test_cpu_kind_names_vendor_model_and_caches():
  """What XLA's CPU matmuls read at run time, recorded with every result."""
  kind = determinism.cpu_kind()
  if os.path.exists('/proc/cpuinfo'):
    assert kind['vendor_id'] and kind['model']
  if os.path.isdir('/sys/devices/system/cpu/cpu0/cache'):  # absent in some containers
    assert any(key.startswith('L') for key in kind)
  assert determinism.record()['cpu_kind'] == kind
