"""Small helpers shared by the kernels."""

from __future__ import annotations

import jax


def is_power_of_2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def gpu_compiler_params(num_warps: int, num_stages: int = 1):
  """Selects the Triton lowering on GPU; ignored in interpret mode."""
  from jax.experimental.pallas import triton as plt

  return plt.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def interpret_here() -> bool:
  """Whether Pallas kernels run in the interpreter on this backend: everywhere but a GPU."""
  return jax.default_backend() != 'gpu'
