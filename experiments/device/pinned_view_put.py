"""Probe: can part of a pinned staging buffer go to the device at the pinned rate?

`graftjax.restore.Staging` writes a block into pinned host memory through a numpy view and
copies each array whole. Copying it in layer groups as they verify needs a copy of part of
the buffer. Times, for k of gemma-3-270m (18 layers, 1 kv head of 256, float32) at 1k and
32k tokens, the fastest of 5 (dispatch = until the call returns, total = until it landed):

- pinned_whole: `jax.device_put` of the pinned jax array (what restore does today);
- view_whole: of the numpy view of the same memory;
- view_layers: of each layer's numpy view, one call each;
- view_layers_batched: of the list of the layers' views, in one call;
- pinned_layers: of 18 separate pinned jax arrays, one a layer, then stacked on the device;
- pageable_whole: of a plain numpy array.

Each copy's bytes are checked against the source. Prints JSON lines.

  python3 experiments/device/pinned_view_put.py
"""

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from graftjax import restore


def _fastest(fn, repeats=5):
  fn()
  dispatch, total = float('inf'), float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    t1 = time.perf_counter()
    jax.block_until_ready(out)
    t2 = time.perf_counter()
    dispatch, total = min(dispatch, t1 - t0), min(total, t2 - t0)
  return dispatch, total, out


def main():
  device = jax.devices()[0]
  on_device = restore.device_memory(device)
  for tokens in (1024, 32768):
    shape = (18, tokens, 1, 256)
    staging = restore.Staging(device)
    view = staging.buffer('k', shape, np.float32)
    view[:] = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    pinned = staging._buffers['k'][1]  # pylint: disable=protected-access
    layers = [restore._make_buffer(shape[1:], np.dtype(np.float32), device) for _ in range(18)]  # pylint: disable=protected-access
    for (layer_view, _), source in zip(layers, view):
      layer_view[:] = source
    plain = np.array(view)
    cases = {
      'pinned_whole': lambda: jax.device_put(pinned, on_device),
      'view_whole': lambda: jax.device_put(view, device),
      'view_layers': lambda: [jax.device_put(layer, device) for layer in view],
      'view_layers_batched': lambda: jax.device_put(list(view), device),
      'pinned_layers': lambda: jnp.stack([jax.device_put(p, on_device) for _, p in layers]),
      'pageable_whole': lambda: jax.device_put(plain, device),
    }
    for name, fn in cases.items():
      dispatch, total, out = _fastest(fn)
      got = np.stack([np.asarray(x) for x in out]) if isinstance(out, list) else np.asarray(out)
      print(
        json.dumps(
          {
            'tokens': tokens,
            'case': name,
            'staging_memory': staging.memory,
            'bytes': view.nbytes,
            'dispatch_ms': dispatch * 1e3,
            'total_ms': total * 1e3,
            'GBps': view.nbytes / total / 1e9,
            'equal': bool(np.array_equal(got, view)),
          }
        ),
        flush=True,
      )


if __name__ == '__main__':
  main()
