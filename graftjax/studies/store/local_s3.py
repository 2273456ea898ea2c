"""A local S3 server for the store benchmarks: moto's, on a free loopback port.

    with local_s3.MotoServer() as server:       # credentials set in the environment meanwhile
      store = BlockStore(server.spec('bench/'))

moto comes with the `test` extra. The server takes any credentials; they are read from the
environment as a deployment's are, and recorded nowhere.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Self

HOST = '127.0.0.1'
BUCKET = 'graftjax-bench'
AWS_ENV = {
  'AWS_ACCESS_KEY_ID': 'graftjax-bench-key',
  'AWS_SECRET_ACCESS_KEY': 'graftjax-bench-secret-never-recorded',
  'AWS_EC2_METADATA_DISABLED': 'true',
}
_START_SECONDS = 60


class MotoServer:
  """moto's S3 server as a child process with bucket BUCKET; `url` is its endpoint.

  A context manager: entering starts it and sets AWS_ENV in this process's environment,
  leaving stops it and restores the environment.
  """

  def __init__(self):
    with socket.socket() as s:
      s.bind((HOST, 0))
      self.port = s.getsockname()[1]
    self.url = f'http://{HOST}:{self.port}'
    self._process = None
    self._old_env: dict[str, str | None] = {}

  def __enter__(self) -> Self:
    self._old_env = {name: os.environ.get(name) for name in AWS_ENV}
    os.environ.update(AWS_ENV)
    command = [sys.executable, '-m', 'moto.server', '-H', HOST, '-p', str(self.port)]
    self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + _START_SECONDS
    while True:
      try:
        urllib.request.urlopen(f'{self.url}/moto-api/', timeout=1).close()
        break
      except (urllib.error.URLError, ConnectionError, TimeoutError):
        if self._process.poll() is not None or time.monotonic() > deadline:
          self.__exit__()
          raise RuntimeError(f'the S3 server did not start on {self.url}') from None
        time.sleep(0.1)
    request = urllib.request.Request(f'{self.url}/{BUCKET}', method='PUT')
    urllib.request.urlopen(request, timeout=30).close()
    return self

  def __exit__(self, *exc) -> None:
    if self._process is not None and self._process.poll() is None:
      self._process.kill()
      self._process.wait(timeout=30)
    for name, value in self._old_env.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value
    self._old_env = {}

  def spec(self, path: str) -> dict[str, Any]:
    """A tensorstore `s3` spec under `path` on this server, credentials from the environment."""
    return {
      'driver': 's3',
      'bucket': BUCKET,
      'endpoint': self.url,
      'aws_region': 'us-east-1',
      'aws_credentials': {'type': 'environment'},
      'path': path,
    }
