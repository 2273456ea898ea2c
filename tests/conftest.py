"""Shared fixtures: the tiny random model for most tests, the real one for a few.

The deterministic configuration is pinned before any test touches jax.
"""

from graftjax import determinism

determinism.pin()

import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from graftjax.models.gemma import model as gemma_model  # pylint: disable=wrong-import-position


@pytest.fixture(scope='session')
def tiny_model():
  return gemma_model.tiny()


@pytest.fixture(scope='session')
def real_model():
  return gemma_model.load('gemma3-270m', dtype=jnp.float32)
