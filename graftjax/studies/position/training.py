"""Training small Gemma-3-shaped decoders from scratch, under any position scheme.

The model is this repo's Gemma with a small config (`small_config`), run by
`transformer.forward`, the same forward pass the grafting method drives.
The data are UTF-8 bytes (`corpus.ByteTokenizer`, vocabulary 256) of the
Python standard library's .py files, split into train and held-out sets by
file (a hash of the file's path), so the split is the same on any machine
that has the same files. Each file starts with BOS; files are joined and
training windows of seq_len + 1 bytes are drawn from the join.

Loss: next-token cross-entropy (nats per byte) over a fresh cache of
capacity seq_len. Optimiser: AdamW (no decay on norm weights, which carry
Gemma's +1), linear warmup then cosine decay, global-norm clipping. The
initial params and the batch order come from one seed.

A checkpoint folder holds `params/` (orbax) and `model.json` (config,
settings, data digests, held-out loss, the params' SHA-256; written by
`ledger.write_result`). `load_trained` gives back a `Gemma` and refuses
params whose digest is not the recorded one. `train_and_save` is
experiments/train_small.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
import dataclasses
import functools
import hashlib
import math
import os
import pathlib
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from graftjax.models import cache as cache_lib
from graftjax.studies.common import corpus
from graftjax.studies.common import results
from graftjax import ledger
from graftjax.models.gemma import checkpoint
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model as gemma_model
from graftjax.models.gemma import positions as positions_lib
from graftjax.models.gemma import transformer

VOCAB_SIZE = 256
MODEL_JSON = 'model.json'

# Named sizes. A layer is global every `global_every` layers, local otherwise
# (Gemma 3's pattern is five local layers, then one global).
SIZES = {
  'tiny': dict(
    embed_dim=32,
    hidden_dim=64,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    num_layers=2,
    global_every=2,
    sliding_window=8,
  ),
  'small': dict(
    embed_dim=256,
    hidden_dim=1024,
    num_heads=4,
    num_kv_heads=1,
    head_dim=64,
    num_layers=6,
    global_every=6,
    sliding_window=64,
  ),
}


def small_config(size: str = 'small', *, scheme: str) -> config_lib.GemmaConfig:
  """A byte-level Gemma 3 config of a named size under `scheme`."""
  try:
    s = SIZES[size]
  except KeyError:
    raise ValueError(f'unknown size {size!r}; known: {sorted(SIZES)}') from None
  types = tuple(
    config_lib.AttentionType.GLOBAL
    if (i + 1) % s['global_every'] == 0
    else config_lib.AttentionType.LOCAL_SLIDING
    for i in range(s['num_layers'])
  )
  return config_lib.GemmaConfig(
    vocab_size=VOCAB_SIZE,
    embed_dim=s['embed_dim'],
    hidden_dim=s['hidden_dim'],
    num_heads=s['num_heads'],
    num_kv_heads=s['num_kv_heads'],
    head_dim=s['head_dim'],
    attention_types=types,
    sliding_window=s['sliding_window'],
    position_scheme=scheme,
    bos_id=corpus.ByteTokenizer().bos_id,
  )


def config_from_json(data: dict[str, Any]) -> config_lib.GemmaConfig:
  """Inverse of `GemmaConfig.to_json`."""
  return config_lib.GemmaConfig(
    **{
      **data,
      'attention_types': tuple(config_lib.AttentionType(t) for t in data['attention_types']),
    }
  )


def parameter_count(params) -> int:
  return sum(int(np.prod(np.shape(p))) for p in jax.tree.leaves(params))


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Byte tokens of the standard library, split by file.

  Attributes:
    train, held_out: [N] int32 tokens; each file is BOS + its UTF-8 bytes.
    train_files, held_out_files: stdlib-relative paths, sorted.
  """

  train: np.ndarray
  held_out: np.ndarray
  train_files: tuple[str, ...]
  held_out_files: tuple[str, ...]

  def to_json(self) -> dict[str, Any]:
    return {
      'train_files': len(self.train_files),
      'held_out_files': list(self.held_out_files),
      'train_tokens': int(self.train.size),
      'held_out_tokens': int(self.held_out.size),
      'train_sha256': ledger.sha256_tokens(self.train),
      'held_out_sha256': ledger.sha256_tokens(self.held_out),
    }


def is_held_out(relative_path: str, every: int) -> bool:
  """Whether a file is held out: one in `every`, by the SHA-256 of its path."""
  return int(hashlib.sha256(relative_path.encode()).hexdigest()[:8], 16) % every == 0


def load_corpus(*, held_out_every: int = 20, max_files: int | None = None) -> Corpus:
  """The stdlib .py files (the first `max_files` in sorted order) as byte tokens.

  Raises:
    ValueError: if either split would be empty.
  """
  tokenizer = corpus.ByteTokenizer(VOCAB_SIZE)
  root = corpus.stdlib_root()
  split = {True: ([], []), False: ([], [])}
  for path in corpus.stdlib_files()[:max_files]:
    name = str(path.relative_to(root))
    ids = tokenizer.encode(path.read_text(encoding='utf-8', errors='replace'), add_bos=True)
    names, chunks = split[is_held_out(name, held_out_every)]
    names.append(name)
    chunks.append(np.asarray(ids, np.int32))
  if not split[True][0] or not split[False][0]:
    raise ValueError(
      f'empty split: {len(split[False][0])} train, {len(split[True][0])}'
      f' held-out files (held_out_every={held_out_every}, max_files={max_files})'
    )
  return Corpus(
    train=np.concatenate(split[False][1]),
    held_out=np.concatenate(split[True][1]),
    train_files=tuple(split[False][0]),
    held_out_files=tuple(split[True][0]),
  )


def random_windows(
  tokens: np.ndarray, rng: np.random.Generator, *, batch: int, seq_len: int
) -> np.ndarray:
  """[batch, seq_len + 1] windows at uniformly random starts."""
  starts = rng.integers(0, tokens.size - seq_len - 1, size=batch)
  return tokens[starts[:, None] + np.arange(seq_len + 1)]


def even_windows(tokens: np.ndarray, *, count: int, seq_len: int) -> np.ndarray:
  """[count, seq_len + 1] windows at evenly spaced starts (the held-out set)."""
  starts = np.linspace(0, tokens.size - seq_len - 1, count).astype(np.int64)
  return tokens[starts[:, None] + np.arange(seq_len + 1)]


@dataclasses.dataclass(frozen=True)
class Settings:
  """How to train.

  Attributes:
    steps: optimiser steps.
    batch: windows per step.
    seq_len: tokens per window (positions 0..seq_len-1; the cache capacity).
    learning_rate: peak learning rate.
    warmup_steps: linear warmup from 0 (then cosine decay to 10% of the peak).
    weight_decay: AdamW decay of matrices (norm weights are not decayed).
    clip_norm: global gradient-norm clip.
    seed: initial params and batch order.
    eval_every: steps between held-out evaluations.
    eval_batches: held-out batches (of `batch` windows) per evaluation.
  """

  steps: int = 2000
  batch: int = 64
  seq_len: int = 256
  learning_rate: float = 3e-3
  warmup_steps: int = 100
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  seed: int = 0
  eval_every: int = 250
  eval_batches: int = 4

  def __post_init__(self):
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f'need 0 <= warmup_steps < steps, got {self.warmup_steps}, {self.steps}')


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """What `train` returns.

  Attributes:
    params: float32 numpy params pytree.
    train_loss: [steps] training loss of each step (nats per byte).
    held_out: (step, held-out loss) at every evaluation, the last after the final step.
  """

  params: Any
  train_loss: np.ndarray
  held_out: list[tuple[int, float]]

  @property
  def held_out_loss(self) -> float:
    return self.held_out[-1][1]


def loss_fn(params, windows: jax.Array, *, config: config_lib.GemmaConfig, tables) -> jax.Array:
  """Mean next-token cross-entropy of windows [B, L+1], positions 0..L-1, over a fresh cache."""
  tokens, targets = windows[:, :-1], windows[:, 1:]
  batch, length = tokens.shape
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
  cache = cache_lib.init(
    num_layers=config.num_layers,
    batch_size=batch,
    capacity=length,
    num_kv_heads=config.num_kv_heads,
    head_dim=config.head_dim,
  )
  logits, _ = transformer.forward(params, tokens, positions, cache, config=config, tables=tables)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def optimizer(settings: Settings) -> optax.GradientTransformation:
  """Clipped AdamW with warmup + cosine decay; matrices decayed, norm vectors not."""
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=settings.learning_rate,
    warmup_steps=settings.warmup_steps,
    decay_steps=settings.steps,
    end_value=0.1 * settings.learning_rate,
  )
  return optax.chain(
    optax.clip_by_global_norm(settings.clip_norm),
    optax.adamw(
      schedule,
      b1=0.9,
      b2=0.95,
      weight_decay=settings.weight_decay,
      mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
    ),
  )


def _train_step(config, opt, tables):
  """Jitted (params, opt_state, windows [B, L+1]) -> (params, opt_state, loss); donates state."""
  loss = functools.partial(loss_fn, config=config, tables=tables)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, windows):
    value, grads = jax.value_and_grad(loss)(params, windows)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  return step


def _evaluator(config, tables, windows: np.ndarray, batch: int) -> Callable[[Any], float]:
  """params -> mean loss over `windows` [N, L+1], in batches of `batch` (N a multiple)."""
  loss = jax.jit(functools.partial(loss_fn, config=config, tables=tables))
  chunks = [windows[i : i + batch] for i in range(0, len(windows), batch)]
  return lambda params: float(np.mean([loss(params, c) for c in chunks]))


def train(
  *,
  config: config_lib.GemmaConfig,
  settings: Settings,
  data: Corpus,
  progress: Callable[[Iterable], Iterable] | None = None,
) -> TrainResult:
  """Trains a model of `config` from `settings.seed`; evaluates on held-out windows.

  `progress` wraps the step range (e.g. tqdm); if the wrapper has
  `set_postfix`, the latest held-out loss is shown there.
  """
  tables = positions_lib.tables(config, settings.seq_len)
  opt = optimizer(settings)
  params = transformer.init_params(config, seed=settings.seed)
  opt_state = opt.init(params)
  step = _train_step(config, opt, tables)
  eval_windows = even_windows(
    data.held_out, count=settings.eval_batches * settings.batch, seq_len=settings.seq_len
  )
  evaluate = _evaluator(config, tables, eval_windows, settings.batch)
  rng = np.random.default_rng([settings.seed, 1])
  losses, held_out = [], []
  steps = progress(range(settings.steps)) if progress else range(settings.steps)
  for i in steps:
    windows = random_windows(data.train, rng, batch=settings.batch, seq_len=settings.seq_len)
    params, opt_state, loss = step(params, opt_state, windows)
    losses.append(loss)
    done = i + 1
    if done % settings.eval_every == 0 or done == settings.steps:
      held_out.append((done, evaluate(params)))
      if hasattr(steps, 'set_postfix'):
        steps.set_postfix(train=f'{float(loss):.3f}', held_out=f'{held_out[-1][1]:.3f}')
  return TrainResult(
    params=jax.tree.map(np.asarray, params),
    train_loss=np.asarray(jnp.stack(losses)),
    held_out=held_out,
  )


def save(
  path: str | os.PathLike,
  *,
  config: config_lib.GemmaConfig,
  result: TrainResult,
  settings: Settings,
  data: Corpus,
  extra: dict[str, Any] | None = None,
  overwrite: bool = False,
) -> str:
  """Writes `params/` (orbax) and `model.json` to `path`, atomically; returns model.json's digest.

  Raises:
    FileExistsError: if `path` exists and not `overwrite`.
  """
  import orbax.checkpoint as ocp

  path = pathlib.Path(path).resolve()
  if path.exists() and not overwrite:
    raise FileExistsError(f'{path} exists; pass overwrite to replace it')
  path.parent.mkdir(parents=True, exist_ok=True)
  digest = checkpoint.params_digest(result.params)
  model = gemma_model.from_params(config, result.params, params_digest=digest)
  staging = pathlib.Path(tempfile.mkdtemp(dir=path.parent, prefix=f'.{path.name}.tmp-'))
  try:
    ocp.PyTreeCheckpointer().save(staging / 'params', result.params)
    sha = ledger.write_result(
      staging / MODEL_JSON,
      {
        'experiment': 'train_small',
        **(extra or {}),
        'config': config.to_json(),
        'settings': dataclasses.asdict(settings),
        'corpus': data.to_json(),
        'parameter_count': parameter_count(result.params),
        'params_sha256': digest,
        'model_fingerprint': model.fingerprint,
        'held_out_loss': result.held_out_loss,
        'held_out_bits_per_byte': result.held_out_loss / math.log(2),
        'held_out_tokens': settings.eval_batches * settings.batch * settings.seq_len,
        'history': {
          'held_out': [list(h) for h in result.held_out],
          'train_loss': [float(x) for x in result.train_loss],
        },
      },
    )
    if path.exists():
      shutil.rmtree(path)
    os.rename(staging, path)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return sha


def _layers_as_tuple(params: dict) -> dict:
  layers = params['layers']
  if isinstance(layers, dict):  # orbax may restore a sequence as {'0': ...}
    layers = [layers[str(i)] for i in range(len(layers))]
  return {**params, 'layers': tuple(layers)}


def load_record(path: str | os.PathLike) -> dict[str, Any]:
  """The checkpoint's `model.json`, its self-digest checked."""
  return ledger.verify_result(pathlib.Path(path) / MODEL_JSON)


def load_trained(path: str | os.PathLike, *, dtype=jnp.float32) -> gemma_model.Gemma:
  """The `Gemma` saved at `path` by `save`, in `dtype`.

  Raises:
    ValueError: if model.json was edited or the params' digest is not the recorded one.
  """
  import orbax.checkpoint as ocp

  path = pathlib.Path(path).resolve()
  record = load_record(path)
  restored = ocp.PyTreeCheckpointer().restore(path / 'params')
  params = _layers_as_tuple(jax.tree.map(np.asarray, restored))
  digest = checkpoint.params_digest(params)
  if digest != record['params_sha256']:
    raise ValueError(f'{path}: params digest {digest} != recorded {record["params_sha256"]}')
  return gemma_model.from_params(
    config_from_json(record['config']), params, dtype=dtype, params_digest=digest
  )


def train_and_save(
  *,
  scheme: str,
  size: str,
  settings: Settings,
  held_out_every: int,
  max_files: int | None,
  out_dir: str,
  overwrite: bool,
  command: str | None = None,
) -> dict:
  """experiments/train_small.py: trains, saves; returns the saved checkpoint's model.json."""
  config = small_config(size, scheme=scheme)
  data = load_corpus(held_out_every=held_out_every, max_files=max_files)
  result = train(
    config=config,
    settings=settings,
    data=data,
    progress=lambda it: tqdm.tqdm(it, desc=f'train {scheme}', unit='step'),
  )
  save(
    out_dir,
    config=config,
    result=result,
    settings=settings,
    data=data,
    overwrite=overwrite,
    extra={**results.header('train_small', command=command), 'size': size},
  )
  return load_record(out_dir)
