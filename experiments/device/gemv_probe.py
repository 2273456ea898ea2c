"""Issue 14 probe on the H200: a one-row float32 decode matmul as an explicit FMA chain.

    python experiments/device/gemv_probe.py OUT.json [first|second]

Is x [1, K] @ w [K, N], computed per output column as fma(x_k, w_kn, acc) in
ascending k from 0 (`fma.rn.f32` inline, or a plain multiply-add that the
compiler may leave unfused), bit-equal to the prefill kernel's row at
gemma-3-270m's shapes, and is it faster than the 16-row decode tiles and
XLA? 'first' sweeps the column tile (32-128), 16 rows of w per loop step and
both forms; 'second' the FMA chain with 16 or 32 columns and 64 or 128 rows
per step. Results: experiments/results/logs/gemv_probe_h200.txt.
"""

import functools
import json
import sys

from graftjax import determinism

determinism.pin()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from graftjax.kernels import _common
from graftjax.kernels import matmul as mm
from graftjax.kernels import matmul_decode as md
from graftjax.studies import timing

SHAPES = [(640, 1024), (640, 256), (640, 2048), (2048, 640)]  # (K, N) of the model's projections
SWEEPS = {
  'first': [
    dict(block_n=n, unroll=16, asm=asm, warps=warps)
    for n in (32, 64, 128)
    for asm in (False, True)
    for warps in (1, 4)
    if warps == 1 or n == 128
  ],
  'second': [dict(block_n=n, unroll=u, asm=True, warps=1) for n in (16, 32) for u in (64, 128)],
}


def _fma(a, b, c):
  (out,) = plt.elementwise_inline_asm(
    'fma.rn.f32 $0, $1, $2, $3;',
    args=[a, b, c],
    constraints='=r,r,r,r',
    pack=1,
    result_shape_dtypes=[jax.ShapeDtypeStruct(c.shape, jnp.float32)],
  )
  return out


def _chain_kernel(x_ref, w_ref, o_ref, *, unroll, asm):
  depth, block_n = w_ref.shape

  def step(s, acc):
    for u in range(unroll):
      k = s * unroll + u
      xk = jnp.broadcast_to(x_ref[0, k], (block_n,))
      acc = _fma(xk, w_ref[k, :], acc) if asm else acc + xk * w_ref[k, :]
    return acc

  o_ref[0, :] = lax.fori_loop(0, depth // unroll, step, jnp.zeros((block_n,), jnp.float32))


@functools.partial(jax.jit, static_argnames=('block_n', 'unroll', 'asm', 'warps'))
def chain(x, w, *, block_n, unroll, asm, warps):
  depth, cols = w.shape
  return pl.pallas_call(
    functools.partial(_chain_kernel, unroll=unroll, asm=asm),
    grid=(cols // block_n,),
    in_specs=[
      pl.BlockSpec((1, depth), lambda j: (0, 0)),
      pl.BlockSpec((depth, block_n), lambda j: (0, j)),
    ],
    out_specs=pl.BlockSpec((1, block_n), lambda j: (0, j)),
    out_shape=jax.ShapeDtypeStruct((1, cols), jnp.float32),
    compiler_params=_common.gpu_compiler_params(warps, 3 if warps > 1 else 1),
  )(x, w)


def main(out_path, sweep='first'):
  rng = np.random.default_rng(0)
  rows = []
  for depth, cols in SHAPES:
    x = jnp.asarray(rng.standard_normal((70, depth)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((depth, cols)) * depth**-0.5, jnp.float32)
    want = np.asarray(mm.matmul(x, w, block_n=32, block_k=32))[:1]  # the prefill kernel's row 0
    x1 = x[:1]
    calls = {
      'rows': jax.jit(functools.partial(md.matmul_decode, block_n=32, block_k=64)),
      'xla': jax.jit(lambda a, b: jnp.dot(a, b, precision='highest')),
    }
    calls.update({json.dumps(kw): functools.partial(chain, **kw) for kw in SWEEPS[sweep]})
    for name, fn in calls.items():
      got = np.asarray(fn(x1, w))
      seconds = timing.time_in_loop(lambda a, f=fn: f(*a), (x1, w), iters=200)
      differ = int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))
      rows.append(dict(K=depth, N=cols, variant=name, bits_differ=differ, us=1e6 * seconds))
      print(rows[-1], flush=True)
  with open(out_path, 'w') as f:
    json.dump(dict(device=jax.devices()[0].device_kind, sweep=sweep, rows=rows), f, indent=1)


if __name__ == '__main__':
  main(*sys.argv[1:])
