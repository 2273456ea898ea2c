"""graftjax.ledger: digests, and refusing result files that are not what they say."""

import json
import os
import threading

import numpy as np
import pytest

from graftjax import ledger


def test_written_result_verifies(tmp_path):
  path = tmp_path / 'r.json'
  digest = ledger.write_result(path, {'byte_equal': 50, 'arms': {'a': [1, 2]}})
  result = ledger.verify_result(path)
  assert result['result_sha256'] == digest
  assert result['arms'] == {'a': [1, 2]}


def test_tampered_result_is_refused(tmp_path):
  path = tmp_path / 'r.json'
  ledger.write_result(path, {'byte_equal': 50})
  path.write_text(path.read_text().replace('50', '49'))
  with pytest.raises(ValueError, match='digest'):
    ledger.verify_result(path)


def _with_digest(body: dict) -> str:
  """The JSON text of `body` and its correct self-digest, keys in the given order."""
  digest = ledger.sha256_bytes(json.dumps(body, sort_keys=True, separators=(',', ':')).encode())
  return json.dumps({**body, 'result_sha256': digest})


def test_duplicate_top_level_key_is_refused(tmp_path):
  # The digest is right for the body json keeps (the last 'byte_equal'), but the
  # file also shows another value: a reader could take either.
  text = _with_digest({'byte_equal': 50})
  path = tmp_path / 'r.json'
  path.write_text(text.replace('{', '{"byte_equal": 0, ', 1))
  assert json.loads(path.read_text())['byte_equal'] == 50  # json alone keeps the last one
  with pytest.raises(ValueError, match=r"r\.json.*duplicate key 'byte_equal'"):
    ledger.verify_result(path)


def test_duplicate_nested_key_is_refused(tmp_path):
  text = _with_digest({'summary': {'kl_max': 0.0}})
  path = tmp_path / 'r.json'
  path.write_text(text.replace('{"kl_max"', '{"kl_max": 4.2, "kl_max"', 1))
  with pytest.raises(ValueError, match="duplicate key 'kl_max'"):
    ledger.verify_result(path)


def test_duplicate_digest_key_is_refused(tmp_path):
  text = _with_digest({'byte_equal': 50})
  path = tmp_path / 'r.json'
  path.write_text(text.replace('{', '{"result_sha256": "' + '0' * 64 + '", ', 1))
  with pytest.raises(ValueError, match="duplicate key 'result_sha256'"):
    ledger.verify_result(path)


@pytest.mark.parametrize(
  'top_level', [[1, 2], 'text', 3, None, [{'result_sha256': None}]], ids=repr
)
def test_top_level_that_is_not_an_object_is_refused(tmp_path, top_level):
  path = tmp_path / 'r.json'
  path.write_text(json.dumps(top_level))
  with pytest.raises(ValueError, match=r'r\.json: not a result file: the top level is a JSON'):
    ledger.verify_result(path)


def test_invalid_json_names_the_file(tmp_path):
  path = tmp_path / 'r.json'
  path.write_text('{"byte_equal": 50')
  with pytest.raises(ValueError, match=r'r\.json: not a result file'):
    ledger.verify_result(path)


def test_sha256_array_is_of_the_raw_bytes():
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  assert ledger.sha256_array(a) == ledger.sha256_bytes(a.tobytes())
  assert ledger.sha256_array(a.T) == ledger.sha256_bytes(np.ascontiguousarray(a.T).tobytes())
  assert ledger.sha256_tokens([1, 2]) == ledger.sha256_bytes(np.array([1, 2], '<i4').tobytes())


def _verify_within(path, seconds=10):
  """`verify_result(path)`'s error, or a failure if it does not return within `seconds`."""
  found = []

  def verify():
    try:
      ledger.verify_result(path)
    except ledger.ResultError as e:
      found.append(e)

  thread = threading.Thread(target=verify, daemon=True)
  thread.start()
  thread.join(seconds)
  return thread.is_alive(), found


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
  fifo = tmp_path / 'r.json'
  os.mkfifo(fifo)
  try:
    waiting, found = _verify_within(fifo)
  finally:
    if waiting:  # the reader still waiting in open() gets its writer, then the end of the file
      os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
  assert not waiting and 'it is a FIFO, not a regular file' in str(found[0])


@pytest.mark.skipif(not os.path.exists('/dev/zero'), reason='no /dev/zero on this system')
def test_an_endless_device_is_refused_before_it_is_read():
  waiting, found = _verify_within('/dev/zero')
  assert not waiting and 'it is a character device, not a regular file' in str(found[0])


def test_a_file_beyond_the_size_bound_is_refused_unread(tmp_path, monkeypatch):
  path = tmp_path / 'r.json'
  ledger.write_result(path, {'padding': 'x' * 4096})
  monkeypatch.setattr(ledger, 'MAX_BYTES', 1024)
  with pytest.raises(ledger.ResultError, match='larger than 1,024 bytes'):
    ledger.verify_result(path)
