"""Shared by the kernel tests: where kernels run, and jitting them once per setting."""

import functools

import jax

INTERPRET = jax.default_backend() != 'gpu'


@functools.cache
def jitted(kernel, **static):
  """`kernel` with its static keywords bound, jitted once per setting.

  In the interpreter XLA compiles it at -O0: same semantics, 2-3x faster builds.
  """
  fn = functools.partial(kernel, interpret=INTERPRET, **static)
  options = {'xla_backend_optimization_level': 0} if INTERPRET else None
  return jax.jit(fn, compiler_options=options)
