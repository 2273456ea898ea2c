"""models/gemma/sharding.py: placement rules here; the 8-device runs in mesh_cases.py."""

import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from graftjax.models.gemma import config as config_lib
from graftjax.models.gemma import sharding

CASES = pathlib.Path(__file__).with_name('mesh_cases.py')


def _mesh(data, model):
  return AbstractMesh((data, model), sharding.AXES)


def test_param_specs_split_heads_and_the_mlp_over_the_model_axis():
  mesh = _mesh(1, 4)
  assert sharding.param_spec('q', (32, 8, 16), mesh) == P(None, 'model', None)
  assert sharding.param_spec('k', (32, 4, 16), mesh) == P(None, 'model', None)
  assert sharding.param_spec('o', (8, 16, 32), mesh) == P('model', None, None)
  assert sharding.param_spec('gate', (32, 64), mesh) == P(None, 'model')
  assert sharding.param_spec('down', (64, 32), mesh) == P('model', None)
  assert sharding.param_spec('embedding', (256, 32), mesh) == P('model', None)
  assert sharding.param_spec('attn_norm', (32,), mesh) == P(None)
  assert sharding.param_spec('q_norm', (16,), mesh) == P(None)


def test_a_dimension_the_model_axis_does_not_divide_is_replicated():
  mesh = _mesh(1, 4)
  assert sharding.param_spec('k', (32, 1, 16), mesh) == P(None, None, None)
  assert sharding.param_spec('embedding', (262_146, 32), mesh) == P(None, None)
  assert sharding.param_spec('q', (32, 8, 16), _mesh(2, 1)) == P(None, None, None)


def test_the_cache_splits_kv_heads_or_is_replicated_over_the_model_axis():
  gemma_1b_like = config_lib.tiny(num_heads=4, num_kv_heads=1)
  assert not sharding.cache_splits_heads(gemma_1b_like, _mesh(1, 4))
  assert sharding.cache_splits_heads(config_lib.tiny(num_heads=8, num_kv_heads=8), _mesh(1, 8))
  assert not sharding.cache_splits_heads(config_lib.tiny(num_heads=8, num_kv_heads=4), _mesh(1, 8))
  assert sharding.kv_spec(True, True) == P(None, 'data', None, 'model', None)
  assert sharding.kv_spec(False, False) == P(None, None, None, None, None)


@pytest.mark.parametrize(
  'path', [('layers', 3, 'q'), 'layers.3.q', 'layers/3/q', (jax.tree_util.DictKey('q'),)]
)
def test_place_reads_the_leaf_name_from_any_path_form(path):
  mesh = sharding.make_mesh(1, 1)
  array = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
  placed = sharding.placer(mesh, dtype='bfloat16')(path, array)
  assert placed.dtype == np.dtype('bfloat16') and placed.shape == (2, 3, 4)
  assert sharding._leaf_name(path) == 'q'


def test_a_mesh_without_data_and_model_axes_is_refused():
  mesh = jax.make_mesh((1,), ('x',), devices=jax.devices()[:1])
  with pytest.raises(sharding.MeshError, match=r"mesh axes are \('x',\), expected"):
    sharding.placer(mesh)
  with pytest.raises(sharding.MeshError, match='needs 4 devices'):
    sharding.make_mesh(2, 2, devices=jax.devices()[:1])


def test_on_eight_host_devices(eight_host_devices):
  """grafted == fresh byte-equal at 1-, 2-, 4-, 8-way model parallelism, and the rest of
  mesh_cases.py, in a process started with 8 forced host devices."""
  eight_host_devices(CASES)
