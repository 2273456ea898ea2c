"""Two machines share one library through S3: B, with an empty catalog and its own cache
directory, synchronises, routes to A's deposit and answers with A's logits, byte for byte.

Each machine is a process of its own (store_sync_machine.py) on the local S3 server.
"""

import json
import pathlib
import subprocess
import sys

import pytest
from store_servers import s3_server, s3_spec, unique_path  # noqa: F401

MACHINE = pathlib.Path(__file__).with_name('store_sync_machine.py')


def run_machine(role, spec_path, cache, out):
  proc = subprocess.run(
    [sys.executable, str(MACHINE), role, str(spec_path), str(cache), str(out)],
    capture_output=True,
    text=True,
    check=False,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return json.loads(pathlib.Path(out).read_text())


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_second_machine_syncs_routes_and_answers_with_the_first_ones_logits(request, tmp_path):
  server = request.getfixturevalue('s3_server')
  spec_path = tmp_path / 'spec.json'
  spec_path.write_text(json.dumps(s3_spec(server.url, unique_path())))
  a = run_machine('deposit', spec_path, tmp_path / 'a_cache', tmp_path / 'a.json')
  b = run_machine('answer', spec_path, tmp_path / 'b_cache', tmp_path / 'b.json')
  assert b['rows_before_sync'] == 0
  assert b['synced'] == {'listed': 3, 'records': 3, 'read': 6}  # 3 records, 3 manifests
  assert b['pages_synced'] == {'listed': 2, 'read': 2}
  assert b['key'] == a['key'] and b['page_key'] == a['page_key']
  assert b['logits_sha256'] == a['logits_sha256'] and b['token_ids'] == a['token_ids']
  assert not (tmp_path / 'a_cache').samefile(tmp_path / 'b_cache')
