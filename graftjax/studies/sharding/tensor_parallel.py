"""Gemma tensor-parallel over a 1 x N mesh of one host's devices: is grafting still exact?

    settings = Settings(model='gemma4-31b', model_devices=8)
    result = experiment(settings, mode='gate', command=...)

The model has seeded random weights (`random_init`), each tensor drawn on the
default device and moved straight onto its shards (`jax.device_put` onto
`sharding.param_spec`'s split: no host copy, one tensor's draw at a time).
Modes, one a call (experiments/device/sharded_31b.sh):
  gate      per text sample, fresh vs grafted continuation logits (byte-equal,
            KL, SHA-256) and a greedy rollout; fresh vs fresh; the block goes
            through `ShardedStore` (put, then restore into a fresh cache)
  kernels   grafted == single-pass prefill under impl='pallas', per chunk size
            (`invariance.run_invariance`, batch 1)
  restore   blocks deposited through `ShardedStore`; a fresh process
            (`restore_child`) loads the model on the same mesh, restores them
            and continues: byte-equal to this process's fresh continuation
  bench     first token after a graft (`ShardedStore.read` + `blocks.graft` +
            one token) vs recompute (prefill + one token), at each prefix
            length; the block's bytes and the bytes each device holds of it
Blocks are compact (a global layer's every row, a sliding layer's last W - 1), captured
from a full-size or ring local cache (`Settings.local_cache`); `ShardedStore` splits each
of their arrays by its own kv heads (Gemma 4's global and sliding layers differ).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from graftjax import blocks
from graftjax import errors
from graftjax import exactness
from graftjax import ledger
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as model_lib
from graftjax.models.gemma import ops
from graftjax.models.gemma import sharding
from graftjax.store import sharded as sharded_store
from graftjax.studies.common import corpus
from graftjax.studies.common import results
from graftjax.studies.graft import graft_gate
from graftjax.studies.kernels import invariance

MODES = ('gate', 'kernels', 'restore', 'bench')
SEED = 0


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one run does.

  Attributes:
    model: a config name (`config.NAMED_CONFIGS`), e.g. 'gemma4-31b', 'tiny-gemma4-31b'.
    model_devices: N of the 1 x N mesh (the first N of `jax.devices()`).
    num_kv_heads, num_global_kv_heads: overrides of the config's (0: the config's).
    dtype: params, compute and cache dtype.
    impl: kernels of the gate, restore and bench modes ('kernels' is always 'pallas').
    samples, prefix_tokens, continuation_tokens, rollout_tokens, chunk_size: the texts
      and the schedule (as experiments/exactness.py takes them).
    sample_pool: the texts are the first `samples` of `corpus.text_samples(count=sample_pool)`
      (0: of `samples`), so a short run has the first samples of a longer one.
    chunk_sizes: of the 'kernels' mode.
    prefixes, repeats, bench_chunk: of the 'bench' mode (prefix lengths, timed repeats
      after one warm-up, tokens per prefill call).
    local_cache: the sliding layers' cache layout ('full' or 'ring', `with_local_cache`).
  """

  model: str
  model_devices: int
  num_kv_heads: int = 0
  num_global_kv_heads: int = 0
  dtype: str = 'bfloat16'
  impl: str = 'xla'
  samples: int = 20
  sample_pool: int = 0
  prefix_tokens: int = 256
  continuation_tokens: int = 32
  rollout_tokens: int = 64
  chunk_size: int = 64
  chunk_sizes: tuple[int, ...] = (64, 512)
  prefixes: tuple[int, ...] = (4096, 32768)
  repeats: int = 3
  bench_chunk: int = 1024
  local_cache: str = 'full'

  def config(self) -> config_lib.GemmaConfig:
    overrides = {}
    if self.num_kv_heads:
      overrides['num_kv_heads'] = self.num_kv_heads
    if self.num_global_kv_heads:
      overrides['num_global_kv_heads'] = self.num_global_kv_heads
    return config_lib.get_config(self.model).replace(**overrides)


def mesh_record(mesh) -> dict[str, Any]:
  """The mesh and the devices: what a result file names itself by."""
  return {
    'data': int(mesh.shape[sharding.DATA]),
    'model': int(mesh.shape[sharding.MODEL]),
    'visible_devices': jax.device_count(),
    'device_kind': jax.devices()[0].device_kind,
    'platform': jax.default_backend(),
  }


def load(settings: Settings, *, impl: str | None = None) -> sharding.ShardedGemma:
  """The model with seeded random weights, drawn tensor by tensor into their shards."""
  mesh = sharding.make_mesh(1, settings.model_devices)

  def place(name: str, value: jax.Array) -> jax.Array:
    leaf = name.replace('/', '.').split('.')[-1]
    spec = sharding.param_spec(leaf, value.shape, mesh)
    return jax.device_put(value, NamedSharding(mesh, spec))  # device to devices

  model = model_lib.random(
    settings.config(), seed=SEED, dtype=jnp.dtype(settings.dtype), place=place
  ).with_impl(impl or settings.impl)
  if settings.local_cache != 'full':  # a ring that takes the bench's prefill chunks
    model = model.with_local_cache(settings.local_cache, chunk_size=settings.bench_chunk)
  return sharding.shard_model(model, mesh)


def inputs_record(model: sharding.ShardedGemma) -> dict[str, Any]:
  """Fingerprints (sharded and of one device), the weights' digest."""
  return {
    'model_fingerprint': model.fingerprint,
    'unsharded_fingerprint': model_lib.Gemma.fingerprint.func(model),
    'params_sha256': model.params_digest,
  }


def texts(model, settings: Settings) -> list[corpus.TextSample]:
  pool = max(settings.sample_pool, settings.samples)
  return corpus.text_samples(
    model.tokenizer,
    count=pool,
    prefix_tokens=settings.prefix_tokens,
    continuation_tokens=settings.continuation_tokens,
  )[: settings.samples]


def schedule_of(settings: Settings) -> graft_gate.Schedule:
  need = settings.prefix_tokens + settings.continuation_tokens + settings.rollout_tokens
  chunk = settings.chunk_size
  return graft_gate.Schedule(
    chunk_size=chunk, rollout_tokens=settings.rollout_tokens, capacity=-(-need // chunk) * chunk
  )


def restored(model, sample, schedule, store: sharded_store.ShardedStore, key: str):
  """A fresh cache with the block under `key` restored, each device reading its heads."""
  return store.restore(
    key,
    model.init_cache(capacity=schedule.capacity),
    target=model.graft_target,
    chunk_size=schedule.chunk_size,
  )


def run_gate(model, samples, schedule, store) -> dict[str, Any]:
  """Per sample: fresh vs grafted (through `store`), fresh vs fresh; digests of each."""
  records = []
  per_arm: dict[str, list[exactness.Comparison]] = {'fresh_vs_grafted': [], 'fresh_vs_fresh': []}
  rollouts = []
  for sample in samples:
    first = graft_gate.fresh(model, sample, schedule)
    second = graft_gate.fresh(model, sample, schedule, rollout=False)
    key = graft_gate.deposit(model, sample, schedule, store)
    cache = restored(model, sample, schedule, store, key)
    graft = graft_gate.continue_and_roll_out(model, cache, sample, schedule)
    vs_graft = graft_gate.compare_arms(first, graft)
    vs_fresh = graft_gate.compare_arms(first, second)
    per_arm['fresh_vs_grafted'].append(exactness.Comparison(**vs_graft['logits']))
    per_arm['fresh_vs_fresh'].append(exactness.Comparison(**vs_fresh['logits']))
    if 'rollout' in vs_graft:
      rollouts.append(vs_graft['rollout'])
    records.append(
      {
        **graft_gate.sample_record(sample),
        'block_key': key,
        'fresh_vs_grafted': vs_graft,
        'fresh_vs_fresh': vs_fresh,
      }
    )
  summary = {arm: exactness.summarize(c) for arm, c in per_arm.items()}
  summary['rollout_fresh_vs_grafted'] = {
    'tokens_equal': sum(r['tokens_equal'] for r in rollouts),
    'logits_byte_equal': sum(r['logits_byte_equal'] for r in rollouts),
    'samples': len(rollouts),
  }
  return {'samples': records, 'summary': summary}


def _restore_request(model, settings, samples, keys, store_root, workdir) -> dict[str, Any]:
  return {
    'settings': dataclasses.asdict(settings),
    'model_fingerprint': model.fingerprint,
    'store': str(store_root),
    'schedule': dataclasses.asdict(schedule_of(settings)),
    'out': str(workdir / 'restore_out.json'),
    'samples': [
      {
        'source': s.source,
        'prefix_ids': list(s.prefix_ids),
        'continuation_ids': list(s.continuation_ids),
        'key': key,
        'fresh_logits': str(workdir / f'fresh_{i}.npy'),
      }
      for i, (s, key) in enumerate(zip(samples, keys))
    ],
  }


def run_restore(model, settings, samples, store_root, workdir) -> dict[str, Any]:
  """Deposits each sample's prefix through `ShardedStore`, frees the weights, and has a
  fresh process on the same mesh restore and continue (`restore_child`)."""
  workdir = pathlib.Path(workdir)
  schedule = schedule_of(settings)
  store = sharded_store.ShardedStore(store_root)
  keys = []
  for i, sample in enumerate(samples):
    fresh = graft_gate.fresh(model, sample, schedule, rollout=False)
    np.save(workdir / f'fresh_{i}.npy', fresh.logits, allow_pickle=False)
    keys.append(graft_gate.deposit(model, sample, schedule, store))
  request = _restore_request(model, settings, samples, keys, store_root, workdir)
  graft_gate.free_weights(model)  # the child draws its own copy onto the same devices
  (workdir / 'restore_request.json').write_text(json.dumps(request))
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'graftjax.studies.sharding.restore_child',
      str(workdir / 'restore_request.json'),
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  if proc.returncode:
    raise RestoreProcessError(f'restore process failed ({proc.returncode}):\n{proc.stderr[-4000:]}')
  report = json.loads((workdir / 'restore_out.json').read_text())
  records = [
    {**graft_gate.sample_record(s), 'block_key': k, **c}
    for s, k, c in zip(samples, keys, report['samples'])
  ]
  summary = exactness.summarize([exactness.Comparison(**r['logits']) for r in records])
  return {
    'samples': records,
    'summary': {'fresh_vs_restored_other_process': summary},
    'other_process_determinism': report['determinism'],
  }


class RestoreProcessError(errors.GraftjaxError):
  """The fresh process that restores the blocks failed; carries its stderr's tail."""


def device_bytes(block: blocks.KVBlock) -> list[int]:
  """Bytes of k and v (a compact block's tail too) each device holds of `block`, in the order
  of the mesh's devices."""
  per: dict[Any, int] = {}
  arrays = (block.k, block.v) + ((block.k_tail, block.v_tail) if block.k_tail is not None else ())
  for array in arrays:
    for shard in array.addressable_shards:
      per[shard.device] = per.get(shard.device, 0) + shard.data.nbytes
  return [per[d] for d in sorted(per, key=lambda d: d.id)]


def read_sharding(model) -> NamedSharding:
  """The split `ShardedStore.read` reads a block in: kv heads over 'model', each array
  replicated where its kv heads do not divide (Gemma 4's global layers on 8 devices), as the
  model's cache splits them."""
  return NamedSharding(model.mesh, sharding.block_spec(True))


def _ready(tree) -> None:
  jax.block_until_ready(tree)


def run_bench(model, settings, store_root) -> dict[str, Any]:
  """Per prefix length: recompute (prefill + one token) vs graft (read + graft + one token)."""
  store = sharded_store.ShardedStore(store_root)
  chunk = settings.bench_chunk
  rng = np.random.default_rng(SEED)
  rows = []
  for n in settings.prefixes:
    ids = [2] + rng.integers(3, model.config.vocab_size, n - 1).tolist()
    nxt = [int(rng.integers(3, model.config.vocab_size))]
    capacity = -(-(n + 1) // ops.CAPACITY_MULTIPLE) * ops.CAPACITY_MULTIPLE
    capacity = max(capacity, -(-n // chunk) * chunk)

    def recompute(capture: bool = False):
      _, cache = model.prefill(
        ids, cache=model.init_cache(capacity=capacity), chunk_size=chunk, logits='none'
      )
      block = None
      if capture:  # before the next token's forward, which donates the cache
        block = blocks.capture(
          cache, blocks.Span(0, n), token_ids=ids, target=model.graft_target, chunk_size=chunk
        )
      logits, _ = model.prefill(nxt, cache=cache, chunk_size=1, start_position=n)
      _ready(logits)
      return logits, block

    def graft(key, where):
      block = store.read(key, where)
      cache = blocks.graft(
        model.init_cache(capacity=capacity), block, target=model.graft_target, chunk_size=chunk
      )
      logits, _ = model.prefill(nxt, cache=cache, chunk_size=1, start_position=n)
      _ready(logits)
      return logits, block

    logits_recompute, block = recompute(capture=True)  # warm-up; its block is deposited
    key = store.put(block)
    block_bytes = block.nbytes()
    del block
    where = read_sharding(model)
    graft(key, where)  # warm-up
    times = {'recompute_s': [], 'graft_s': []}
    before = dataclasses.replace(store.reads)
    for _ in range(settings.repeats):
      start = time.perf_counter()
      recompute()
      times['recompute_s'].append(time.perf_counter() - start)
      start = time.perf_counter()
      logits_graft, read = graft(key, where)
      times['graft_s'].append(time.perf_counter() - start)
    per_device = device_bytes(read)
    del read
    rows.append(
      {
        'prefix_tokens': n,
        'capacity': capacity,
        **times,
        'recompute_median_s': float(np.median(times['recompute_s'])),
        'graft_median_s': float(np.median(times['graft_s'])),
        'speedup': float(np.median(times['recompute_s']) / np.median(times['graft_s'])),
        'first_token_byte_equal': ledger.sha256_array(np.asarray(logits_recompute))
        == ledger.sha256_array(np.asarray(logits_graft)),
        'sha256_first_token_recompute': ledger.sha256_array(np.asarray(logits_recompute)),
        'sha256_first_token_graft': ledger.sha256_array(np.asarray(logits_graft)),
        'block_bytes': block_bytes,
        'restore_bytes_per_device': per_device,
        'restore_bytes_read_per_repeat': (store.reads.bytes - before.bytes) // settings.repeats,
        'restore_chunks_read_per_repeat': (store.reads.chunks - before.chunks) // settings.repeats,
        'read_split': str(where.spec),
      }
    )
  return {'rows': rows}


def experiment(settings: Settings, *, mode: str, command: str, store_dir=None) -> dict[str, Any]:
  """One mode (`MODES`) on a 1 x `model_devices` mesh; the result with its header."""
  if mode not in MODES:
    raise ValueError(f'mode {mode!r} is not one of {MODES}')
  model = load(settings, impl='pallas' if mode == 'kernels' else None)
  inputs = inputs_record(model)
  mesh = mesh_record(model.mesh)
  body: dict[str, Any]
  with tempfile.TemporaryDirectory() as scratch:
    root = pathlib.Path(store_dir or pathlib.Path(scratch) / 'store')
    if mode == 'gate':
      body = run_gate(
        model, texts(model, settings), schedule_of(settings), sharded_store.ShardedStore(root)
      )
      body['schedule'] = {
        **dataclasses.asdict(schedule_of(settings)),
        'prefix_tokens': settings.prefix_tokens,
        'continuation_tokens': settings.continuation_tokens,
      }
    elif mode == 'kernels':
      need = settings.prefix_tokens + settings.continuation_tokens
      capacity = -(-need // ops.CAPACITY_MULTIPLE) * ops.CAPACITY_MULTIPLE
      samples = texts(model, settings)
      body = invariance.run_invariance(
        model=model,
        samples=samples,
        chunk_sizes=tuple(settings.chunk_sizes),
        batch_sizes=(1,),
        capacity=capacity,
        store_root=root,
      )
      for record, sample in zip(body['samples'], samples):
        record.update(
          sha256_prefix_ids=ledger.sha256_tokens(sample.prefix_ids),
          sha256_continuation_ids=ledger.sha256_tokens(sample.continuation_ids),
        )
      body['capacity'] = capacity
    elif mode == 'restore':
      workdir = pathlib.Path(scratch) / 'work'
      workdir.mkdir()
      body = run_restore(model, settings, texts(model, settings), root, workdir)
    else:
      body = run_bench(model, settings, root)
  return {
    **results.header(f'sharded_{mode}', inputs=inputs, command=command),
    'mode': mode,
    'model': settings.model,
    'mesh': mesh,
    'impl': 'pallas' if mode == 'kernels' else settings.impl,
    'settings': dataclasses.asdict(settings),
    **body,
  }


def format_summary(result: dict[str, Any]) -> str:
  """A few lines: the mesh, then per arm / cell / prefix what the mode measured."""
  mesh = result['mesh']
  lines = [
    f'{result["model"]} {result["mode"]} on a 1 x {mesh["model"]} mesh of {mesh["device_kind"]}'
    f' ({mesh["visible_devices"]} visible)'
  ]
  if result['mode'] in ('gate', 'restore'):
    for arm, s in result['summary'].items():
      if 'byte_equal' in s:
        lines.append(
          f'{arm}: byte-equal {s["byte_equal"]}/{s["samples"]}, KL max {s["kl_max"]:.3g}'
        )
      else:
        lines.append(f'{arm}: logits byte-equal {s["logits_byte_equal"]}/{s["samples"]}')
  elif result['mode'] == 'kernels':
    for c in result['cells']:
      lines.append(
        f'chunk {c["chunk_size"]}: grafted == single pass {c["samples_byte_equal"]}/{c["samples"]}'
        f', KL max {c["rows_kl_max"]:.3g}'
      )
  else:
    for r in result['rows']:
      lines.append(
        f'{r["prefix_tokens"]} tokens: recompute {r["recompute_median_s"]:.3f} s, graft'
        f' {r["graft_median_s"]:.3f} s ({r["speedup"]:.1f}x), first token byte-equal'
        f' {r["first_token_byte_equal"]}, restore bytes per device {r["restore_bytes_per_device"]}'
      )
  return '\n'.join(lines)


def default_out(result: dict[str, Any]) -> str:
  """experiments/results/sharding/sharded_<mode>_<model>_<gpu>x<N>.json (gpu: h100, h200, cpu:
  the first word of the device kind with a digit in it, as experiments/device/common.sh)."""
  words = re.split(r'[\s_-]+', result['mesh']['device_kind'].lower())
  kind = next((w for w in words if re.search(r'\d', w)), words[0] or 'device')
  n = result['mesh']['model']
  return f'experiments/results/sharding/sharded_{result["mode"]}_{result["model"]}_{kind}x{n}.json'
