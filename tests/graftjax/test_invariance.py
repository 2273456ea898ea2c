"""Chunk- and batch-invariance of the whole model with the Pallas kernels.

With impl='pallas' (interpret mode on CPU), a grafted continuation equals a
single-pass prefill byte for byte at every chunk and batch size; with
impl='xla' the same comparison fails, so the test can fail.
"""

import numpy as np

from graftjax import corpus
from graftjax import invariance
from graftjax.models.gemma import model as gemma_model

RNG = np.random.default_rng(21)
SAMPLE = corpus.TextSample(
    source='random', prefix_ids=tuple(int(t) for t in RNG.integers(3, 256, 17)),
    continuation_ids=tuple(int(t) for t in RNG.integers(3, 256, 6)))


def cells(impl, tmp_path):
  model = gemma_model.tiny(impl=impl)
  return invariance.run_invariance(
      model=model, samples=[SAMPLE], chunk_sizes=(1, 7), batch_sizes=(1, 3),
      capacity=64, store_root=tmp_path / impl)['cells']


def test_pallas_grafted_equals_single_pass(tmp_path):
  for cell in cells('pallas', tmp_path):
    assert cell['samples_byte_equal'] == 1, cell
    assert cell['rows_kl_max'] == 0.0


def test_xla_grafted_differs_from_single_pass(tmp_path):
  found = cells('xla', tmp_path)
  assert any(cell['samples_byte_equal'] == 0 for cell in found)
  assert all(cell['rows_argmax_agreement'] == 1.0 for cell in found)
