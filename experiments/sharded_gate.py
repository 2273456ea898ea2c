r"""Tensor parallel on one host's GPUs: the gate, invariance, restore and a bench on a 1 x N mesh.

    python experiments/sharded_gate.py --mode=gate --model=gemma4-31b --model_devices=8 \
        --out=experiments/results/sharding/sharded_gate_gemma4-31b_h100x8.json
    python experiments/sharded_gate.py --mode=compare \
        --sharded=experiments/results/sharding/sharded_gate_gemma4-31b_h100x8.json \
        --single=experiments/results/scale/exactness_gemma4-31b_h100.json \
        --out=experiments/results/sharding/compare_gate_gemma4-31b_h100x8.json

Modes (`graftjax.studies.sharding.tensor_parallel`): gate (own-position gate, blocks
through ShardedStore), kernels (grafted == single pass under Pallas, per chunk size),
restore (deposit, then a fresh process restores on the same mesh), bench (first token
after a graft vs recompute, per-device restore bytes); compare (a sharded gate or
kernels file's per-sample digests against a one-device run's). Seeded random weights
(seed 0), drawn on the devices in their shards. On CPU, force host devices with
XLA_FLAGS=--xla_force_host_platform_device_count=N before the run.
"""

from graftjax import determinism

determinism.pin()  # before jax starts

import os

os.environ.setdefault('NCCL_NVLS_ENABLE', '0')  # no NVLink multicast (docs/device.md)

import jax
from absl import app
from absl import flags

from graftjax.studies.common import cli
from graftjax.studies.common import model_flag
from graftjax.studies.common import results
from graftjax.studies.sharding import compare
from graftjax.studies.sharding import tensor_parallel

_MODE = flags.DEFINE_enum('mode', 'gate', [*tensor_parallel.MODES, 'compare'], 'What to run.')
_MODEL = model_flag.define_config('gemma4-31b', 'A config; seeded random weights.')
_MODEL_DEVICES = flags.DEFINE_integer('model_devices', 0, "Devices along 'model' (0: every one).")
_KV_HEADS = flags.DEFINE_integer(
  'num_kv_heads', 0, "Override of the config's kv heads (0: its own)."
)
_GLOBAL_KV_HEADS = flags.DEFINE_integer(
  'num_global_kv_heads', 0, "Override of the config's global kv heads (0: its own)."
)
_DTYPE = flags.DEFINE_enum('dtype', 'bfloat16', ['float32', 'bfloat16'], 'Compute dtype.')
_SAMPLES = flags.DEFINE_integer('samples', 20, 'Text samples (gate, kernels, restore).')
_SAMPLE_POOL = flags.DEFINE_integer(
  'sample_pool', 0, 'Take the first --samples of this many (0: --samples), as a longer run.'
)
_PREFIX_TOKENS = flags.DEFINE_integer('prefix_tokens', 256, 'Grafted prefix tokens (BOS included).')
_CONTINUATION_TOKENS = flags.DEFINE_integer('continuation_tokens', 32, 'Tokens after the graft.')
_ROLLOUT_TOKENS = flags.DEFINE_integer('rollout_tokens', 64, 'Greedy tokens after (gate).')
_CHUNK_SIZE = flags.DEFINE_integer('chunk_size', 64, 'Tokens per forward call (gate, restore).')
_CHUNK_SIZES = flags.DEFINE_list('chunk_sizes', ['64', '512'], 'Chunk sizes (kernels).')
_PREFIXES = flags.DEFINE_list('prefixes', ['4096', '32768'], 'Prefix lengths (bench).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repeats after one warm-up (bench).')
_BENCH_CHUNK = flags.DEFINE_integer('bench_chunk', 1024, 'Tokens per prefill call (bench).')
_LOCAL_CACHE = flags.DEFINE_enum('local_cache', 'full', ['full', 'ring'], 'Sliding layers cache.')
_SHARDED = flags.DEFINE_string('sharded', None, 'compare: a sharded gate or kernels result.')
_SINGLE = flags.DEFINE_string('single', None, 'compare: the one-device result of the same inputs.')
_OUT = flags.DEFINE_string(
  'out', None, 'Result JSON (default: under experiments/results/sharding/).'
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  command = results.command_line()
  if _MODE.value == 'compare':
    if not (_SHARDED.value and _SINGLE.value and _OUT.value):
      raise app.UsageError('--mode=compare needs --sharded, --single and --out')
    report = compare.experiment(_SHARDED.value, _SINGLE.value, command=command)
    print(report)
    results.write(_OUT.value, report)
    return
  settings = tensor_parallel.Settings(
    model=_MODEL.value,
    model_devices=_MODEL_DEVICES.value or jax.device_count(),
    num_kv_heads=_KV_HEADS.value,
    num_global_kv_heads=_GLOBAL_KV_HEADS.value,
    dtype=_DTYPE.value,
    samples=_SAMPLES.value,
    sample_pool=_SAMPLE_POOL.value,
    prefix_tokens=_PREFIX_TOKENS.value,
    continuation_tokens=_CONTINUATION_TOKENS.value,
    rollout_tokens=_ROLLOUT_TOKENS.value,
    chunk_size=_CHUNK_SIZE.value,
    chunk_sizes=tuple(int(c) for c in _CHUNK_SIZES.value),
    prefixes=tuple(int(p) for p in _PREFIXES.value),
    repeats=_REPEATS.value,
    bench_chunk=_BENCH_CHUNK.value,
    local_cache=_LOCAL_CACHE.value,
  )
  result = tensor_parallel.experiment(settings, mode=_MODE.value, command=command)
  print(tensor_parallel.format_summary(result))
  results.write(_OUT.value or tensor_parallel.default_out(result), result)


if __name__ == '__main__':
  cli.run(main)
