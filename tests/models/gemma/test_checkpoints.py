"""Your own checkpoint: safetensors (single, sharded, multimodal prefixes) and orbax.

Exported and loaded back, a model gives the same logits bit for bit and the
same params digest (`checkpoint.params_digest` of its float32 weights); a
checkpoint that is not the model asked for is refused, naming the tensor or
config field.
"""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from graftjax.models.gemma import checkpoint
from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import model
from graftjax.models.gemma import orbax_io
from graftjax.models.gemma import params as params_lib
from graftjax.models.gemma import safetensors_io

IDS = np.arange(1, 30) % 250


def _logits(m):
  logits, _ = m.prefill(IDS, cache=m.init_cache(capacity=64), chunk_size=16, logits='all')
  return np.asarray(logits)


@pytest.fixture(scope='module')
def tiny():
  # Random GQA weights with rope scaling: every mapped feature is exercised.
  m = model.random(config_lib.tiny(num_kv_heads=2, rope_scale_factor=8.0), seed=4)
  return m, _logits(m), checkpoint.params_digest(jax.tree.map(np.asarray, m.params))


def _same(loaded, tiny):
  m, logits, digest = tiny
  assert loaded.config == m.config
  assert loaded.params_digest == digest
  assert np.array_equal(_logits(loaded), logits)


@pytest.mark.parametrize('shard_bytes', [None, 20_000])
def test_safetensors_round_trip_is_bit_equal(tmp_path, tiny, shard_bytes):
  m = tiny[0]
  folder = safetensors_io.save(m.params, m.config, tmp_path / 'ckpt', max_shard_bytes=shard_bytes)
  names = sorted(os.listdir(folder))
  if shard_bytes is None:
    assert names == ['config.json', 'model.safetensors']
  else:
    assert 'model.safetensors.index.json' in names and len(names) > 4
  _same(model.load(weights=folder), tiny)
  _same(model.load(weights=str(folder)), tiny)


def test_single_file_path_loads(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  _same(model.load(weights=folder / 'model.safetensors'), tiny)


@pytest.mark.parametrize('prefix', ['language_model.model.', 'model.language_model.'])
def test_multimodal_prefix_accepted_and_vision_ignored(tmp_path, tiny, prefix):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  tensors = load_file(folder / 'model.safetensors')
  renamed = {prefix + k.removeprefix('model.'): v for k, v in tensors.items()}
  renamed['vision_tower.vision_model.embeddings.patch_embedding.weight'] = np.ones(
    (2, 2), np.float32
  )
  save_file(renamed, str(folder / 'model.safetensors'))
  config = json.loads((folder / 'config.json').read_text())
  (folder / 'config.json').write_text(
    json.dumps({'architectures': ['Gemma3ForConditionalGeneration'], 'text_config': config})
  )
  _same(model.load(weights=folder), tiny)


def test_bfloat16_checkpoint_streams_into_float32(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  tensors = load_file(folder / 'model.safetensors')
  save_file(
    {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}, str(folder / 'model.safetensors')
  )
  loaded = model.load(weights=folder, dtype=jnp.bfloat16)
  assert loaded.params['layers'][0]['q'].dtype == jnp.bfloat16
  want = np.asarray(tiny[0].params['layers'][0]['q']).astype(ml_dtypes.bfloat16)
  assert np.array_equal(np.asarray(loaded.params['layers'][0]['q']), want)


def test_placement_hook_gets_each_tensor_by_name(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  seen = []
  place = lambda name, value: seen.append(name) or jax.device_put(value, jax.devices()[0])
  model.load(weights=folder, place=place)
  assert seen == [s.name for s in params_lib.param_specs(tiny[0].config)]


@pytest.mark.parametrize('layout', ['flat', 'nested'])
def test_orbax_round_trip_is_bit_equal(tmp_path, tiny, layout):
  import orbax.checkpoint as ocp

  m = tiny[0]
  folder = orbax_io.save(m.params, m.config, tmp_path / 'flat')
  if layout == 'nested':  # the gemma library's in-memory layout, saved as is
    flat = ocp.PyTreeCheckpointer().restore(folder)
    nested = {}
    for key, leaves in flat.items():
      *path, last = key.removeprefix('transformer/').split('/')
      node = nested
      for part in path:
        node = node.setdefault(part, {})
      node[last] = leaves['w'] if last in ('gating_einsum', 'linear') else leaves
    folder = tmp_path / 'nested'
    ocp.PyTreeCheckpointer().save(folder, nested)
    _same(_with(folder, m.config), tiny)
  else:
    _same(model.load(weights=folder), tiny)


def _with(folder, config):
  """A checkpoint with no config.json, loaded against `config`."""
  params, digest = orbax_io.load(folder, config, place=params_lib.default_place(jnp.float32))
  return model.Gemma(
    config=config, params=params, dtype=jnp.dtype(jnp.float32), params_digest=digest
  )


# Refusals: each names its cause.


def test_missing_tensor_named(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  tensors = load_file(folder / 'model.safetensors')
  del tensors['model.layers.3.mlp.up_proj.weight']
  save_file(tensors, str(folder / 'model.safetensors'))
  with pytest.raises(params_lib.CheckpointError, match=r'layers\.3\.mlp\.up_proj'):
    model.load(weights=folder)


def test_wrong_shape_named(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  tensors = load_file(folder / 'model.safetensors')
  tensors['model.layers.2.self_attn.k_proj.weight'] = np.zeros((16, 32), np.float32)
  save_file(tensors, str(folder / 'model.safetensors'))
  with pytest.raises(params_lib.CheckpointError, match=r'layers\.2\.self_attn\.k_proj.*\(16, 32\)'):
    model.load(weights=folder)


def test_extra_layer_refused(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  tensors = load_file(folder / 'model.safetensors')
  tensors['model.layers.6.input_layernorm.weight'] = np.zeros((32,), np.float32)
  save_file(tensors, str(folder / 'model.safetensors'))
  with pytest.raises(params_lib.CheckpointError, match=r'no place for.*layers\.6'):
    model.load(weights=folder)


def test_config_mismatch_with_name_refused(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  with pytest.raises(params_lib.CheckpointError, match='num_kv_heads: 2 \\(expected 1\\)'):
    model.load('tiny', weights=folder)


def test_no_config_and_no_name_refused(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  (folder / 'config.json').unlink()
  with pytest.raises(params_lib.CheckpointError, match='no config.json'):
    model.load(weights=folder)
  with pytest.raises(params_lib.CheckpointError, match='k_proj'):  # tiny has 1 kv head
    model.load('tiny', weights=folder)


@pytest.mark.parametrize(
  ('damage', 'match'),
  [
    (
      lambda f: (f / 'model.safetensors').write_bytes(b'not a safetensors file'),
      'not a safetensors',
    ),
    (lambda f: (f / 'config.json').write_text('{'), 'cannot read JSON'),
    (lambda f: (f / 'model.safetensors').unlink(), 'not a safetensors checkpoint'),
  ],
)
def test_damaged_checkpoint_is_a_project_error(tmp_path, tiny, damage, match):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  damage(folder)
  with pytest.raises(params_lib.CheckpointError, match=match):
    model.load(weights=folder)


def test_missing_path_and_missing_shard(tmp_path, tiny):
  with pytest.raises(params_lib.CheckpointError, match='no such checkpoint'):
    model.load(weights=tmp_path / 'absent')
  folder = safetensors_io.save(
    tiny[0].params, tiny[0].config, tmp_path / 'ckpt', max_shard_bytes=20_000
  )
  next(folder.glob('model-00002-*.safetensors')).unlink()
  with pytest.raises(params_lib.CheckpointError, match='shard files missing'):
    model.load(weights=folder)


def test_orbax_wrong_shape_named(tmp_path, tiny):
  folder = orbax_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ox')
  other = config_lib.tiny(num_kv_heads=2, rope_scale_factor=8.0, hidden_dim=48)
  with pytest.raises(params_lib.CheckpointError, match=r'layer_0/mlp/linear has shape \(64, 32\)'):
    orbax_io.load(folder, other, place=params_lib.default_place(jnp.float32))


def test_exporters_refuse_what_they_cannot_write_exactly(tmp_path, tiny):
  m = tiny[0]
  params = jax.tree.map(np.asarray, m.params)
  params['layers'][1]['k_norm'] = params['layers'][1]['k_norm'].copy()
  params['layers'][1]['k_norm'][3] = 1e-9  # (w - 1) + 1 != w in float32
  with pytest.raises(params_lib.CheckpointError, match=r"\['layers'\]\[1\]\['k_norm'\]\[3\]"):
    safetensors_io.save(params, m.config, tmp_path / 'st')
  with pytest.raises(params_lib.CheckpointError, match='k_norm'):
    orbax_io.save(params, m.config, tmp_path / 'ox')
  safetensors_io.save(m.params, m.config, tmp_path / 'again')
  with pytest.raises(params_lib.CheckpointError, match='already holds'):
    safetensors_io.save(m.params, m.config, tmp_path / 'again')


# The real gemma-3-270m: GGUF -> each format -> back, logits byte-equal (one chunk of 32
# tokens: the logits use every weight through the tied unembedding, and the digest checks all).


@pytest.fixture(scope='module')
def real(real_model):
  ids = np.arange(2, 34) * 7 % 262_000
  return real_model, ids, _real_logits(real_model, ids)


def _real_logits(m, ids):
  logits, _ = m.prefill(ids, cache=m.init_cache(capacity=32), chunk_size=32, logits='all')
  return np.asarray(logits)


@pytest.mark.real_model
@pytest.mark.parametrize('fmt', ['safetensors_sharded', 'orbax'])  # single files: tiny tests
def test_real_270m_exported_and_loaded_back_is_byte_equal(tmp_path, real, fmt):
  m, ids, want = real
  if fmt == 'orbax':
    folder = orbax_io.save(m.params, m.config, tmp_path / fmt)
  else:
    folder = safetensors_io.save(m.params, m.config, tmp_path / fmt, max_shard_bytes=200 << 20)
  loaded = model.load(weights=folder)
  assert loaded.config == m.config
  assert loaded.params_digest == m.params_digest  # the GGUF path's digest of the same weights
  assert np.array_equal(_real_logits(loaded, ids), want)


def test_integer_tensor_refused(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  tensors = load_file(folder / 'model.safetensors')
  tensors['model.norm.weight'] = tensors['model.norm.weight'].astype(np.int32)
  save_file(tensors, str(folder / 'model.safetensors'))
  with pytest.raises(params_lib.CheckpointError, match=r'model\.norm\.weight has dtype int32'):
    model.load(weights=folder)


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize('dtype', [np.float32, ml_dtypes.bfloat16])
def test_non_finite_weight_refused_naming_the_tensor(tmp_path, tiny, bad, dtype):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  tensors = load_file(folder / 'model.safetensors')
  name = 'model.layers.1.mlp.up_proj.weight'
  tensors[name] = tensors[name].astype(dtype)
  tensors[name][2, 3] = bad
  save_file(tensors, str(folder / 'model.safetensors'))
  with pytest.raises(params_lib.CheckpointError, match=rf'{name} holds -?(nan|inf) at flat index'):
    model.load(weights=folder)


def test_non_finite_weight_refused_in_orbax(tmp_path, tiny):
  import orbax.checkpoint as ocp

  folder = orbax_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ox')
  flat = ocp.PyTreeCheckpointer().restore(folder)
  flat['transformer/final_norm']['scale'][0] = np.nan
  other = tmp_path / 'other'
  ocp.PyTreeCheckpointer().save(other, flat)
  with pytest.raises(params_lib.CheckpointError, match='final_norm/scale holds nan'):
    _with(other, tiny[0].config)


def test_non_finite_check_spans_every_slice(monkeypatch):
  """A value past the first slice of `check_float` is found, at its own index."""
  monkeypatch.setattr(params_lib, '_FINITE_SLICE', 4)
  value = np.ones((3, 5), np.float32)
  params_lib.check_float('w', value, 'src')
  value[2, 4] = np.inf
  with pytest.raises(params_lib.CheckpointError, match='w holds inf at flat index 14'):
    params_lib.check_float('w', value, 'src')


@pytest.mark.parametrize('file', ['config.json', 'model.safetensors.index.json'])
def test_deeply_nested_json_is_a_checkpoint_error(tmp_path, tiny, file):
  folder = safetensors_io.save(
    tiny[0].params, tiny[0].config, tmp_path / 'ckpt', max_shard_bytes=20_000
  )
  (folder / file).write_text('[' * 100_000 + ']' * 100_000)
  with pytest.raises(params_lib.CheckpointError, match=f'{file}: cannot read JSON .nested too'):
    model.load(weights=folder)


def test_damaged_orbax_is_a_project_error(tmp_path, tiny):
  folder = orbax_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ox')
  (folder / '_METADATA').write_text('{')
  with pytest.raises(params_lib.CheckpointError, match='orbax'):
    model.load(weights=folder)
  folder = orbax_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ox2')
  for data in (folder / 'd').rglob('*'):
    if data.is_file():
      data.write_bytes(b'\0' * 8)
  with pytest.raises(params_lib.CheckpointError, match=r'cannot read tensor|orbax'):
    model.load(weights=folder)


def test_placement_hook_gets_host_values_in_the_dtype(tmp_path, tiny):
  folder = safetensors_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ckpt')
  dtypes = set()

  def place(name, value):
    dtypes.add((type(value), value.dtype))
    return jax.device_put(value, jax.devices()[0])

  model.load(weights=folder, dtype=jnp.bfloat16, place=place)
  assert dtypes == {(np.ndarray, jnp.dtype(jnp.bfloat16))}


def test_orbax_fused_tensor_of_another_shape_named(tmp_path, tiny):
  import orbax.checkpoint as ocp

  folder = orbax_io.save(tiny[0].params, tiny[0].config, tmp_path / 'ox')
  flat = ocp.PyTreeCheckpointer().restore(folder)
  flat['transformer/layer_4/attn/kv_einsum']['w'] = flat['transformer/layer_4/attn/kv_einsum']['w'][
    :1
  ]
  other = tmp_path / 'other'
  ocp.PyTreeCheckpointer().save(other, flat)
  with pytest.raises(params_lib.CheckpointError, match=r'layer_4/attn/kv_einsum/w has shape \(1, '):
    _with(other, tiny[0].config)


def test_orbax_stacked_layout_refused(tmp_path, tiny):
  import orbax.checkpoint as ocp

  folder = tmp_path / 'stacked'
  stacked = {'transformer/stacked_layers/attention_type_0/attn/q_einsum': {'w': np.zeros((2, 2))}}
  ocp.PyTreeCheckpointer().save(folder, stacked)
  with pytest.raises(params_lib.CheckpointError, match='stacked-layers'):
    _with(folder, tiny[0].config)


def test_orbax_without_config_takes_the_named_size_and_its_table(tmp_path):
  """The gemma library's 4B+ tables have 262,144 rows where Hugging Face's have 262,208."""
  m = model.random(config_lib.tiny(vocab_size=300), seed=1)
  folder = orbax_io.save(m.params, m.config, tmp_path / 'ox')
  (folder / 'config.json').unlink()
  loaded = model.load('tiny', weights=folder)
  assert loaded.config == m.config
  assert np.array_equal(_logits(loaded), _logits(m))


@pytest.mark.parametrize('target', ['../elsewhere.safetensors', 7, 'wrong-shard'])
def test_index_pointing_outside_or_to_the_wrong_shard(tmp_path, tiny, target):
  folder = safetensors_io.save(
    tiny[0].params, tiny[0].config, tmp_path / 'ckpt', max_shard_bytes=20_000
  )
  index = json.loads((folder / 'model.safetensors.index.json').read_text())
  name = 'model.layers.0.mlp.up_proj.weight'
  if target == 'wrong-shard':  # a shard that exists but does not hold the tensor
    target = next(f for f in set(index['weight_map'].values()) if f != index['weight_map'][name])
    match = r'tensor model\.layers\.0\.mlp\.up_proj\.weight'
  else:
    match = 'not a file name'
  index['weight_map'][name] = target
  (folder / 'model.safetensors.index.json').write_text(json.dumps(index))
  with pytest.raises(params_lib.CheckpointError, match=match):
    model.load(weights=folder)


def test_exporters_refuse_a_file_as_folder(tmp_path, tiny):
  (tmp_path / 'file').write_text('x')
  for save in (safetensors_io.save, orbax_io.save):
    with pytest.raises(params_lib.CheckpointError, match='is a file'):
      save(tiny[0].params, tiny[0].config, tmp_path / 'file')
