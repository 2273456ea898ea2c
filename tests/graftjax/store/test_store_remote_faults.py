"""Faults of a network store, each a StoreError naming its cause; credentials never shown.

The S3 server (moto) is reached through `FaultyProxy`, which answers errors, answers
late, or alters what a GET returns.
"""

import time

import pytest
from store_servers import (  # noqa: F401  (the fixtures s3_server, gcs_server)
  AWS_ENV,
  GCS_TOKEN,
  FaultyProxy,
  environment,
  free_port,
  gcs_server,
  gcs_spec,
  moto_server,
  s3_server,
  s3_spec,
  unique_path,
)
from test_store import _assert_same_block, make_block

from graftjax import store as store_lib
from graftjax.store import kvstore as store_kvstore

# Every test here starts a server or a writer process.
pytestmark = pytest.mark.subprocess

_SECRETS = (AWS_ENV['AWS_SECRET_ACCESS_KEY'], AWS_ENV['AWS_ACCESS_KEY_ID'], GCS_TOKEN)
_CHUNK = 'k/c.0.0.0.0'


@pytest.fixture
def proxy(request):
  proxy = FaultyProxy(request.getfixturevalue('s3_server').url)
  yield proxy
  proxy.close()


# Short retries, so that a fault that persists ends soon (the store's own bound, RETRIES,
# is tested with a server that is down).
_QUICK = {'s3_request_retries': {'max_retries': 2, 'initial_delay': '0.01s', 'max_delay': '0.05s'}}


@pytest.fixture
def store(proxy):
  return store_lib.BlockStore(s3_spec(proxy.url, unique_path(), context=_QUICK))


def _shows_no_credentials(error, capfd):
  text = f'{error} {error.path} {error.cause} {capfd.readouterr()}'
  assert not [secret for secret in _SECRETS if secret in text]


def test_server_down_is_named_after_bounded_retries(request, capfd):
  request.getfixturevalue('s3_server')  # its credentials in the environment
  store = store_lib.BlockStore(s3_spec(f'http://127.0.0.1:{free_port()}', unique_path()))
  started = time.monotonic()
  with pytest.raises(store_lib.StoreIOError, match='Could not connect') as error:
    store.get('a' * 64)
  assert time.monotonic() - started < 30  # RETRIES: about 6 s
  assert not isinstance(error.value, store_lib.MissingBlockError)
  _shows_no_credentials(error.value, capfd)
  quick = store_lib.BlockStore(
    s3_spec(f'http://127.0.0.1:{free_port()}', unique_path(), context=_QUICK)
  )
  for call in (lambda: quick.put(make_block(0)), quick.list):
    with pytest.raises(store_lib.StoreIOError, match='Could not connect') as error:
      call()
    _shows_no_credentials(error.value, capfd)


@pytest.mark.parametrize('status', [500, 503])
def test_a_few_server_errors_are_retried_away(store, proxy, status):
  block = make_block(0)
  proxy.faults.status, proxy.faults.status_count = status, 2
  key = store.put(block)
  proxy.faults.status_count = 2
  _assert_same_block(store.get(key), block)
  assert proxy.faults.status_count == 0


@pytest.mark.parametrize('status', [500, 503])
def test_server_errors_that_persist_are_named(store, proxy, status, capfd):
  block = make_block(0)
  key = store.put(block)
  proxy.faults.status, proxy.faults.status_count = status, 1000

  for call in (lambda: store.get(key), lambda: store.put(make_block(1)), store.list):
    with pytest.raises(store_lib.StoreIOError, match=f"http_response_code='{status}'") as error:
      call()
    _shows_no_credentials(error.value, capfd)
  proxy.faults.status_count = 0
  assert store.list() == [key]  # nothing of the failed put is visible
  _assert_same_block(store.get(key), block)


def test_answers_slower_than_the_timeout_are_named(store, proxy, monkeypatch, capfd):
  block = make_block(0)
  key = store.put(block)
  monkeypatch.setattr(store_kvstore, 'TIMEOUT_SECONDS', 0.5)
  proxy.faults.delay = 2.0

  with pytest.raises(store_lib.StoreIOError, match='no answer within 0.5 s') as error:
    store.get(key)
  _shows_no_credentials(error.value, capfd)
  proxy.faults.delay = 0.0
  _assert_same_block(store.get(key), block)


def test_wrong_credentials_are_named_and_never_shown(capfd):
  """A server that checks credentials (moto with auth on) refuses ours."""
  server = moto_server()
  with environment(AWS_ENV), environment({'INITIAL_NO_AUTH_ACTION_COUNT': '0'}):
    server.start()
  try:
    with environment(AWS_ENV):
      store = store_lib.BlockStore(s3_spec(server.url, unique_path(), context=_QUICK))
      for call in (lambda: store.put(make_block(0)), lambda: store.get('a' * 64), store.list):
        with pytest.raises(store_lib.AccessDeniedError, match='InvalidAccessKeyId') as error:
          call()
        _shows_no_credentials(error.value, capfd)
  finally:
    server.stop()


@pytest.mark.parametrize('backend', ['s3', 'gcs'])
def test_missing_bucket_is_named(request, backend, capfd):
  if backend == 's3':
    spec = s3_spec(request.getfixturevalue('s3_server').url, 'p/', context=_QUICK)
    calls = ('get', 'list', 'put', 'contains')
  else:
    request.getfixturevalue('gcs_server')
    spec = gcs_spec('p/')
    calls = ('put',)  # the GCS emulator lists a missing bucket as empty (GCS answers 404)
  store = store_lib.BlockStore({**spec, 'bucket': 'graftjax-absent'})
  call_of = {
    'get': lambda: store.get('a' * 64),
    'list': store.list,
    'put': lambda: store.put(make_block(0)),
    'contains': lambda: 'a' * 64 in store,  # was False, where every other call names the bucket
  }

  for call in map(call_of.get, calls):
    with pytest.raises(store_lib.StoreIOError, match='no such bucket') as error:
      call()
    assert not isinstance(error.value, store_lib.MissingBlockError)
    _shows_no_credentials(error.value, capfd)


def _flip_a_byte(path, data):
  if not path.endswith(_CHUNK):
    return data
  data = bytearray(data)
  data[7] ^= 0x10
  return bytes(data)


@pytest.mark.parametrize(
  'alter, match',
  [
    (_flip_a_byte, 'digest expected'),
    (lambda path, data: data[:-4] if path.endswith(_CHUNK) else data, 'holds 44 bytes'),
  ],
)
def test_an_object_altered_or_cut_on_the_way_is_caught_by_its_digest(store, proxy, alter, match):
  block = make_block(0)
  key = store.put(block)
  proxy.faults.body = alter

  for read in (store.get, store.verify):
    with pytest.raises(store_lib.CorruptBlockError, match=match):
      read(key)
  proxy.faults.body = None
  _assert_same_block(store.get(key), block)


def test_the_store_bounds_retries_unless_the_spec_sets_them():
  spec = {'driver': 's3', 'bucket': 'graftjax-test', 'endpoint': 'http://127.0.0.1:9'}
  bounded = store_kvstore._with_retries(spec)
  own = {'s3_request_retries': {'max_retries': 9}}

  assert bounded['context'] == {'s3_request_retries': store_kvstore.RETRIES}
  assert store_kvstore._with_retries({**spec, 'context': own}) == {**spec, 'context': own}
  assert store_kvstore._with_retries('s3://graftjax-test/p/')['context'] == {
    's3_request_retries': store_kvstore.RETRIES
  }
  assert store_kvstore._with_retries({'driver': 'memory'}) == {'driver': 'memory'}
