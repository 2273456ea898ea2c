"""The pinned deterministic configuration, and a record of it for every result.

Call `pin()` before jax creates its backend (first array, first jit): XLA
reads `XLA_FLAGS` only then. Every experiment attaches `record()` to its
result, so a number always travels with the configuration that produced it.

What is pinned:
  * XLA_FLAGS: `--xla_allow_excess_precision=false` everywhere (bfloat16
    intermediates are rounded as written, not kept in float32 when XLA
    likes), plus `--xla_gpu_deterministic_ops=true` on GPU (deterministic
    reductions and scatters; a superset of
    `--xla_gpu_exclude_nondeterministic_ops`).
  * jax: float32 matmuls at HIGHEST precision (no TF32 on the GPU), x64 off.
XLA on CPU is run-to-run deterministic without further flags.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys
from typing import Any

from graftjax.errors import GraftjaxError

COMMON_XLA_FLAGS = ('--xla_allow_excess_precision=false',)
GPU_XLA_FLAGS = ('--xla_gpu_deterministic_ops=true',)
MATMUL_PRECISION = 'highest'


class DeterminismError(GraftjaxError, RuntimeError):
  """The configuration could not be pinned as asked."""


def _backends_initialized() -> bool:
  try:
    from jax._src import xla_bridge
  except ImportError:
    return False
  check = getattr(xla_bridge, 'backends_are_initialized', None)
  return bool(check()) if check else False


def pinned_xla_flags() -> tuple[str, ...]:
  return COMMON_XLA_FLAGS + GPU_XLA_FLAGS


def pin() -> dict[str, Any]:
  """Applies the pinned configuration; returns `record()` of it.

  Raises:
    DeterminismError: if jax's backend already started with other XLA flags.
  """
  current = os.environ.get('XLA_FLAGS', '').split()
  missing = [f for f in pinned_xla_flags() if f not in current]
  if missing:
    if _backends_initialized():
      raise DeterminismError(
        f'jax started before determinism.pin(); XLA_FLAGS lacks {missing}.'
        ' Call pin() before any jax computation.'
      )
    os.environ['XLA_FLAGS'] = ' '.join(current + missing)
  import jax

  jax.config.update('jax_default_matmul_precision', MATMUL_PRECISION)
  jax.config.update('jax_enable_x64', False)
  return record()


def _cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or 'unknown'


def cpu_kind() -> dict[str, str]:
  """Vendor, family, model and cache sizes of this CPU (Linux; else empty).

  XLA's CPU matmuls (YNNPACK fusions) choose their kernels from the CPU at
  run time, beyond what `--xla_cpu_max_isa` caps, and without YNNPACK the
  bits still differ between CPUs of one instruction set: CPU results are
  bit-comparable only between machines whose `cpu_kind` agrees (measured:
  tests/fixtures/portable_block.json records other logit bits for one block
  on an AMD Zen 5 than on the EPYC that wrote it).
  """
  kind = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if not line.strip():
          break  # the first processor is enough
        key, _, value = line.partition(':')
        key = key.strip()
        if key in ('vendor_id', 'cpu family', 'model', 'stepping'):
          kind[key.replace(' ', '_')] = value.strip()
  except OSError:
    return {}
  caches = pathlib.Path('/sys/devices/system/cpu/cpu0/cache')
  for index in sorted(caches.glob('index*')):
    try:
      level = (index / 'level').read_text().strip()
      kind_of = (index / 'type').read_text().strip()
      size = (index / 'size').read_text().strip()
    except OSError:
      continue
    suffix = {'Data': 'd', 'Instruction': 'i'}.get(kind_of, '')
    kind[f'L{level}{suffix}'] = size
  return kind


def _source_revision() -> str:
  """git commit of the graftjax checkout (+ '-dirty' if changed), or 'unknown'."""
  import subprocess

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(
      ['git', '-C', root, 'rev-parse', 'HEAD'],
      capture_output=True,
      text=True,
      check=True,
      timeout=10,
    ).stdout.strip()
    dirty = subprocess.run(
      ['git', '-C', root, 'status', '--porcelain', '--untracked-files=no'],
      capture_output=True,
      text=True,
      check=True,
      timeout=10,
    ).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return 'unknown'
  return head + ('-dirty' if dirty else '')


def source_sha256() -> str:
  """SHA-256 of the code that computes: every .py file under graftjax/,
  models/, kernels/ and experiments/ (path and bytes, in sorted order).

  Unlike the git revision, it names the code even where the git metadata is
  stale: a copy of a working tree run on another machine keeps the commit it
  was copied from, so its revision reads '<commit>-dirty' whatever changed.
  """
  import hashlib
  import pathlib

  root = pathlib.Path(__file__).resolve().parents[1]
  digest = hashlib.sha256()
  for folder in ('graftjax', 'models', 'kernels', 'experiments'):
    for path in sorted((root / folder).rglob('*.py')):
      digest.update(str(path.relative_to(root)).encode() + b'\0')
      digest.update(path.read_bytes() + b'\0')
  return digest.hexdigest()


# Fields of `record()` that must agree for two runs' bits to be compared.
COMPARABLE_FIELDS = (
  'xla_flags',
  'jax_default_matmul_precision',
  'jax_version',
  'jaxlib_version',
  'backend',
  'device_kind',
  'source_sha256',
)


# Fields of `record()` that must agree for two CPU runs of one code to give the
# same bits (with `pin()` applied): XLA's CPU kernels depend on the processor.
CPU_BITS_FIELDS = ('cpu_kind', 'jax_version', 'jaxlib_version')


def record() -> dict[str, Any]:
  """Flags, versions and device of this process, as JSON-ready values."""
  import jax
  import jaxlib
  import numpy as np

  device = jax.devices()[0]
  return {
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
    'pinned_flags_present': all(
      f in os.environ.get('XLA_FLAGS', '').split() for f in pinned_xla_flags()
    ),
    'jax_default_matmul_precision': str(jax.config.jax_default_matmul_precision),
    'jax_enable_x64': bool(jax.config.jax_enable_x64),
    'jax_version': jax.__version__,
    'jaxlib_version': jaxlib.__version__,
    'numpy_version': np.__version__,
    'python_version': sys.version.split()[0],
    'backend': jax.default_backend(),
    'device_kind': device.device_kind,
    'device_count': jax.device_count(),
    'platform_version': getattr(device.client, 'platform_version', ''),
    'cpu_model': _cpu_model(),
    'cpu_kind': cpu_kind(),
    'machine': platform.machine(),
    'source_revision': _source_revision(),
    'source_sha256': source_sha256(),
  }
