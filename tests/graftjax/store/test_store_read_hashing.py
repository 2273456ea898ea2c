"""Chunks of 1 MiB and more are hashed on every core: the same digests, and a changed byte
anywhere in any chunk is still refused, on `file` and through kvstore values."""

import pathlib

import blake3
import numpy as np
import pytest

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.store import manifest as store_manifest
from graftjax.store import read as store_read

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / 'fixtures'
LAYERS, ROWS, HEAD_DIM = 2, 1024, 256  # float32: one layer's chunk is 1 MiB


def _big_block() -> blocks.KVBlock:
  rng = np.random.default_rng(0)
  shape = (LAYERS, ROWS, 1, HEAD_DIM)
  meta = blocks.BlockMeta(
    model_fingerprint='ab' * 32,
    token_ids=tuple(int(t) for t in rng.integers(0, 262_144, ROWS)),
    start=0,
    dtype='float32',
    position_scheme='rope',
    capacity=2 * ROWS,
    first_position=0,
  )
  return blocks.KVBlock(
    k=rng.standard_normal(shape, np.float32),
    v=rng.standard_normal(shape, np.float32),
    positions=np.arange(ROWS, dtype=np.int32),
    meta=meta,
  )


def test_a_parallel_hash_gives_the_digest_of_one_thread_in_any_pieces(monkeypatch):
  data = np.random.default_rng(1).integers(0, 256, 3 * store_read.PARALLEL_HASH_BYTES, np.uint8)
  parallel = store_read.chunk_hash(store_manifest.FORMAT, data.size)
  assert parallel.__class__ is blake3.blake3
  for piece in (7, 1 << 16, data.size):
    digest = store_read.chunk_hash(store_manifest.FORMAT, data.size)
    for offset in range(0, data.size, piece):
      digest.update(data[offset : offset + piece])
    assert digest.hexdigest() == blake3.blake3(data).hexdigest()


def test_a_committed_store_still_verifies():
  store = store_lib.BlockStore(FIXTURES / 'portable_store')
  (key,) = store.list()
  store.verify(key)


@pytest.mark.parametrize('root', ['file', 'memory://'])
@pytest.mark.parametrize('chunk', ['positions/c.0', 'k/c.0.0.0.0', 'k/c.1.0.0.0', 'v/c.1.0.0.0'])
@pytest.mark.parametrize('where', ['first', 'middle', 'last'])
def test_a_changed_byte_anywhere_is_refused(tmp_path, root, chunk, where):
  block = _big_block()
  store = store_lib.BlockStore(tmp_path / 'store' if root == 'file' else root)
  key = store.put(block)
  got = store.get(key)
  assert got.k.tobytes() == block.k.tobytes() and got.v.tobytes() == block.v.tobytes()

  raw = store._kv  # noqa: SLF001  (a byte changed under the store, as a disk would)
  # on an object store the payload lies under the manifest's data prefix
  (path,) = [p.decode() for p in raw.list().result() if p.decode().endswith(f'/{chunk}')]
  data = bytearray(raw.read(path).result().value)
  assert chunk.startswith('positions') or len(data) >= store_read.PARALLEL_HASH_BYTES
  offset = {'first': 0, 'middle': len(data) // 2, 'last': len(data) - 1}[where]
  data[offset] ^= 0x10
  raw.write(path, bytes(data)).result()
  with pytest.raises(store_lib.CorruptBlockError, match=rf'\({chunk}\): digest expected'):
    store.get(key)
