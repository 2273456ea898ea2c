"""Shared fixtures: the tiny random model for most tests, the real one for a few."""

import jax.numpy as jnp
import pytest

from graftjax.models.gemma import model as gemma_model


@pytest.fixture(scope='session')
def tiny_model():
  return gemma_model.tiny()


@pytest.fixture(scope='session')
def real_model():
  return gemma_model.load('gemma3-270m', dtype=jnp.float32)
