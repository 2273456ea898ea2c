"""The store on a remote tier: request concurrency, and a restore from S3 equal to one from file."""

import threading
import time

import numpy as np
import pytest
from store_servers import (  # noqa: F401  (the fixture s3_server)
  FaultyProxy,
  gcs_spec,
  s3_server,
  s3_spec,
  unique_path,
)
from test_store import _assert_same_block, make_block

from graftjax import blocks
from graftjax import store as store_lib
from graftjax.store import kvstore as store_kvstore


@pytest.fixture
def server(request):
  return request.getfixturevalue('s3_server')


@pytest.fixture
def proxy(server):
  proxy = FaultyProxy(server.url, delay=0.1)
  yield proxy
  proxy.close()


def _wide_block(layers=12, seed=0):
  """A block of `layers` layers: 2 * layers chunks, more than a small concurrency."""
  block = make_block(seed)
  reps = (layers // block.k.shape[0] + 1, 1, 1, 1)
  k, v = (np.tile(np.asarray(a), reps)[:layers] for a in (block.k, block.v))
  return blocks.KVBlock(k=k, v=v, positions=block.positions, meta=block.meta)


def test_restore_from_s3_reads_the_bytes_a_restore_from_file_reads(server, tmp_path):
  block = _wide_block()
  layout = ((0, 3),) * 6 + ((1, 3),) * 6  # a page too: whole layers, and tails
  s3 = store_lib.BlockStore(s3_spec(server.url, unique_path()), concurrency=3)
  file = store_lib.BlockStore(str(tmp_path / 'store'))

  for page_layout in (None, layout):
    key = s3.put(block, page_layout=page_layout)
    assert file.put(block, page_layout=page_layout) == key
    from_s3, s3_layout = s3.get_page(key)
    from_file, file_layout = file.get_page(key)

    assert s3_layout == file_layout
    _assert_same_block(from_s3, from_file)
    for name in ('k', 'v', 'positions'):
      assert np.asarray(getattr(from_s3, name)).tobytes() == (
        np.asarray(getattr(from_file, name)).tobytes()
      )
  _assert_same_block(s3.get(s3.list()[0]), file.get(file.list()[0]))


def test_the_concurrency_setting_reaches_the_spec():
  endpoint = 'http://127.0.0.1:9'  # opening asks nothing of the server
  default = store_lib.BlockStore(s3_spec(endpoint, 'a/'))
  set_here = store_lib.BlockStore(s3_spec(endpoint, 'a/'), concurrency=3)
  own = {'context': {'s3_request_concurrency': {'limit': 5}}}
  spec_own = store_lib.BlockStore(s3_spec(endpoint, 'a/', **own))
  over_spec = store_lib.BlockStore(s3_spec(endpoint, 'a/', **own), concurrency=7)
  gcs = store_lib.BlockStore(gcs_spec('a/'), concurrency=4)

  assert default.concurrency == store_kvstore.CONCURRENCY
  assert set_here.concurrency == 3
  assert set_here._kv.spec(retain_context=True).to_json()['s3_request_concurrency'] == {'limit': 3}
  assert spec_own.concurrency == 5
  assert over_spec.concurrency == 7
  assert gcs.concurrency == 4
  assert gcs._kv.spec(retain_context=True).to_json()['gcs_request_concurrency'] == {'limit': 4}


def test_the_default_concurrency_is_tensorstores_variable_where_set(monkeypatch):
  monkeypatch.setenv('TENSORSTORE_S3_REQUEST_CONCURRENCY', '6')
  assert store_lib.BlockStore(s3_spec('http://127.0.0.1:9', 'a/')).concurrency == 6
  monkeypatch.setenv('TENSORSTORE_S3_REQUEST_CONCURRENCY', 'many')
  assert (
    store_lib.BlockStore(s3_spec('http://127.0.0.1:9', 'a/')).concurrency
    == store_kvstore.CONCURRENCY
  )


def test_concurrency_is_none_on_file_and_refused_when_not_a_positive_int(tmp_path):
  assert store_lib.BlockStore(str(tmp_path)).concurrency is None
  for wrong in (0, -1, True, 2.0):
    with pytest.raises(store_lib.StoreIOError, match='positive int'):
      store_lib.BlockStore(s3_spec('http://127.0.0.1:9', 'a/'), concurrency=wrong)


@pytest.mark.parametrize('limit', [1, 4])
def test_a_read_keeps_as_many_requests_in_flight_as_the_concurrency_allows(server, proxy, limit):
  path = unique_path()
  key = store_lib.BlockStore(s3_spec(server.url, path)).put(_wide_block())
  reader = store_lib.BlockStore(s3_spec(proxy.url, path), concurrency=limit)

  _assert_same_block(reader.get(key), _wide_block())

  assert proxy.most == limit  # 24 chunks: the bound is reached and never passed


def test_the_small_files_go_out_with_the_chunks_after_the_manifest(server):
  """The manifest names the payload's prefix (format 5): nothing is listed, and every
  zarr.json and chunk is asked for at once after it. The proxy holds every request but the
  manifest's until a chunk's has come too: a read that waited for the zarr.json answers
  before asking for chunks would never get one."""
  path = unique_path()
  key = store_lib.BlockStore(s3_spec(server.url, path)).put(make_block(0))
  proxy = FaultyProxy(server.url)
  proxy.faults.hold = lambda method, name: not name.endswith('manifest.json')
  reader = store_lib.BlockStore(s3_spec(proxy.url, path))
  rest = 3 + 2 * make_block(0).k.shape[0] + 1  # zarr.json files, chunks of k, v, positions
  reached = []
  # Four held: there are three zarr.json files, so the fourth is a chunk asked for before any
  # answer came. Waiting for all ten is timing: on a loaded machine some requests reach the
  # proxy only after others were answered (connections tensorstore has to open again).
  chunk_before_answers = threading.Thread(target=_release_when, args=(proxy, 4, reached))
  chunk_before_answers.start()

  try:
    _assert_same_block(reader.get(key), make_block(0))
  finally:
    chunk_before_answers.join()
    proxy.close()

  assert reached == [True], (proxy.faults.held, proxy.events)  # else it waited for an answer
  assert proxy.faults.requests == 1 + rest, proxy.events
  assert not [e for e in proxy.events if 'list-type' in e[1]]
  assert len([e for e in proxy.events if e[1].endswith('zarr.json')]) == 3


def _release_when(proxy, count, reached, seconds=10.0):
  """Releases the proxy's held requests once it holds `count` (appending True to `reached`),
  or `seconds` after it held the first (appending False)."""
  proxy.faults.holding.wait(timeout=120)
  deadline = time.monotonic() + seconds
  while proxy.faults.held < count and time.monotonic() < deadline:
    time.sleep(0.01)
  reached.append(proxy.faults.held >= count)
  proxy.faults.release.set()
