"""Seeded weights for a safetensors header: a fixture keeps the header, a test rebuilds the file.

A fixture folder holds what transformers' `save_pretrained` wrote except the weights
(config.json, generation_config.json) and `HEADER_FILE`: the seed, each tensor's name,
dtype and shape, and the sha256 of the `model.safetensors` that `write` makes from them.
Each tensor comes from its own generator (the seed and the CRC-32 of its name), so no
value depends on the order of the tensors or on any other tensor:

    vectors (norm weights, scales, layer scalars)   1 + 0.2 N(0, 1)
    embeddings ('embed' in the name)                N(0, 1)
    matrices                                        N(0, 1) / sqrt(last dimension)

drawn in float64 by numpy and stored as float32, so the logits are O(1) to O(10).
Pure numpy: the fixture script (with torch) and the tests (without) both use it.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import struct
import zlib

import numpy as np

HEADER_FILE = 'weights_header.json'
WEIGHTS_FILE = 'model.safetensors'
COPIED = ('config.json', 'generation_config.json')
_DTYPES = {'F32': np.dtype('<f4')}


def header_of(path: pathlib.Path) -> dict[str, dict]:
  """The tensors of the safetensors file at `path`: name -> {'dtype', 'shape'}, sorted by name."""
  raw = pathlib.Path(path).read_bytes()
  (length,) = struct.unpack('<Q', raw[:8])
  header = json.loads(raw[8 : 8 + length])
  return {
    name: {'dtype': entry['dtype'], 'shape': list(entry['shape'])}
    for name, entry in sorted(header.items())
    if name != '__metadata__'
  }


def draw(name: str, shape: list[int], seed: int) -> np.ndarray:
  """The tensor `name` of `shape` for `seed` (scales in the module docstring): float32."""
  rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
  noise = rng.standard_normal(shape)
  if len(shape) <= 1:
    value = 1.0 + 0.2 * noise
  elif 'embed' in name:
    value = noise
  else:
    value = noise / float(shape[-1]) ** 0.5
  return value.astype(np.float32)


def write(path: pathlib.Path, tensors: dict[str, dict], seed: int) -> str:
  """Writes the safetensors file of `tensors` (a `header_of`) drawn for `seed`, in name order
  with metadata {'format': 'pt'} as transformers wants it; returns the file's sha256."""
  header, blobs, offset = {'__metadata__': {'format': 'pt'}}, [], 0
  for name, entry in sorted(tensors.items()):
    if entry['dtype'] not in _DTYPES:
      raise ValueError(f'{name}: dtype {entry["dtype"]} is not one of {sorted(_DTYPES)}')
    blob = draw(name, entry['shape'], seed).astype(_DTYPES[entry['dtype']]).tobytes()
    header[name] = {**entry, 'data_offsets': [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
  text = json.dumps(header, separators=(',', ':')).encode()
  text += b' ' * (-len(text) % 8)
  data = struct.pack('<Q', len(text)) + text + b''.join(blobs)
  pathlib.Path(path).write_bytes(data)
  return hashlib.sha256(data).hexdigest()


def record(folder: pathlib.Path, tensors: dict[str, dict], seed: int, sha256: str) -> None:
  """Writes `HEADER_FILE` in `folder`."""
  body = {'seed': seed, 'sha256': sha256, 'tensors': tensors}
  (pathlib.Path(folder) / HEADER_FILE).write_text(json.dumps(body, indent=1) + '\n')


def rebuild(fixture: pathlib.Path, out: pathlib.Path) -> tuple[pathlib.Path, str, str]:
  """The saved folder of `fixture` made again under `out`: its copied files and the weights
  of its `HEADER_FILE`. Returns (folder, sha256 written, sha256 recorded)."""
  fixture, out = pathlib.Path(fixture), pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  for name in COPIED:
    shutil.copyfile(fixture / name, out / name)
  recorded = json.loads((fixture / HEADER_FILE).read_text())
  written = write(out / WEIGHTS_FILE, recorded['tensors'], recorded['seed'])
  return out, written, recorded['sha256']
