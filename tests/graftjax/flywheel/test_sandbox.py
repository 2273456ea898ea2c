"""Each hostile program is contained and scored as a failure that names its cause."""

import ast
import os
import pathlib
import shutil
import socket
import uuid

import pytest

from graftjax.flywheel import sandbox

needs_bwrap = pytest.mark.skipif(
  shutil.which('bwrap') is None,
  reason='bubblewrap is not installed here (`make setup` installs it as root)',
)

_FAST = sandbox.Limits(wall_seconds=20, cpu_seconds=2)


def _processes_with(marker: str) -> list[int]:
  found = []
  for entry in pathlib.Path('/proc').iterdir():
    try:
      if entry.name.isdigit() and marker.encode() in (entry / 'cmdline').read_bytes():
        found.append(int(entry.name))
    except OSError:
      continue
  return found


@needs_bwrap
def test_a_passing_program_passes():
  result = sandbox.run_python('import sys\nprint(sum(range(10)), sys.argv[1:])', args=('a',))
  assert (result.passed, result.cause, result.exit_code) == (True, 'ok', 0)
  assert result.stdout == "45 ['a']\n"


@needs_bwrap
def test_it_runs_unprivileged_with_no_way_to_regain_privileges():
  code = (
    "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
    "print(*(status[k].split()[0] for k in ('Uid', 'CapEff', 'NoNewPrivs')))"
  )
  uid, capabilities, no_new_privileges = sandbox.run_python(code).stdout.split()
  assert uid != '0' and int(capabilities, 16) == 0 and no_new_privileges == '1'


@needs_bwrap
def test_the_callers_environment_does_not_reach_it(monkeypatch):
  monkeypatch.setenv('GRAFTJAX_PROBE_TOKEN', 'the token')
  result = sandbox.run_python('import os\nprint(sorted(os.environ))')
  assert 'GRAFTJAX_PROBE_TOKEN' not in result.stdout
  assert set(ast.literal_eval(result.stdout)) <= {'HOME', 'LC_CTYPE', 'PATH', 'PWD'}


@needs_bwrap
def test_its_tmp_is_writable_and_private_to_one_run():
  write = sandbox.run_python("open('/tmp/note', 'w').write('x')\nprint(open('/tmp/note').read())")
  assert write.passed and write.stdout == 'x\n'
  read = sandbox.run_python("import os\nprint(os.path.exists('/tmp/note'))")
  assert read.stdout == 'False\n'


@needs_bwrap
def test_an_infinite_loop_is_stopped_by_its_cpu_limit():
  result = sandbox.run_python('while True:\n  pass', limits=_FAST)
  assert (result.passed, result.cause, result.signal) == (False, 'cpu_time', 'SIGXCPU')


@needs_bwrap
def test_a_loop_that_ignores_sigxcpu_is_stopped_by_its_cpu_limit_too():
  code = 'import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n  pass'
  result = sandbox.run_python(code, limits=_FAST)
  assert (result.passed, result.cause, result.signal) == (False, 'cpu_time', 'SIGXCPU')


@needs_bwrap
def test_a_program_killing_itself_is_not_a_cpu_limit():
  result = sandbox.run_python('import os, signal\nos.kill(os.getpid(), signal.SIGKILL)')
  assert (result.passed, result.cause, result.signal) == (False, 'signal', 'SIGKILL')


@needs_bwrap
def test_a_sleeping_program_is_stopped_by_the_wall_clock():
  limits = sandbox.Limits(wall_seconds=1)
  result = sandbox.run_python('import time\ntime.sleep(60)', limits=limits)
  assert (result.passed, result.cause, result.exit_code) == (False, 'timeout', None)
  assert result.seconds < 30


@needs_bwrap
def test_a_fork_bomb_is_refused_and_leaves_no_process():
  marker = f'forkbomb-{uuid.uuid4().hex}'
  result = sandbox.run_python('import os\nwhile True:\n  os.fork()', limits=_FAST, args=(marker,))
  assert (result.passed, result.cause) == (False, 'process_limit')
  assert result.error.startswith('BlockingIOError')
  assert _processes_with(marker) == []


@needs_bwrap
def test_a_fork_bomb_that_outlives_refusals_is_killed_whole_at_the_timeout_as_a_process_limit():
  marker = f'forkbomb-{uuid.uuid4().hex}'
  code = (
    'import os, time\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    time.sleep(0.01)'
  )
  limits = sandbox.Limits(wall_seconds=2, cpu_seconds=30)
  result = sandbox.run_python(code, limits=limits, args=(marker,))
  assert (result.passed, result.cause) == (False, 'process_limit')
  assert _processes_with(marker) == []


@needs_bwrap
def test_a_10_gb_allocation_is_refused():
  result = sandbox.run_python('data = bytearray(10 * 2**30)\nprint(len(data))', limits=_FAST)
  assert (result.passed, result.cause, result.error) == (False, 'memory', 'MemoryError')
  assert result.stdout == ''


# Forks as many memory holders as it may (more than its process count), each filling 4 MiB
# chunks until refused, then holding them; the parent adds up what all hold at once.
_MEMORY_HOLDERS = """
import os, select, time
r, w = os.pipe()
children = 0
for _ in range(64):
  try:
    pid = os.fork()
  except OSError:
    break
  if pid == 0:
    held = []
    try:
      while True:
        held.append(bytearray(4 << 20))  # zero-filled: its pages are touched
    except MemoryError:
      pass
    os.write(w, b'%d\\n' % sum(map(len, held)))
    time.sleep(60)  # held until the sandbox ends
    os._exit(0)
  children += 1
os.close(w)
lines = b''
while lines.count(b'\\n') < children and select.select([r], [], [], 20)[0]:
  lines += os.read(r, 4096)
print(children, sum(map(int, lines.split())))
"""


@needs_bwrap
def test_memory_holders_forked_at_once_stay_within_the_sandboxs_one_budget():
  budget = 256 << 20
  limits = sandbox.Limits(wall_seconds=30, cpu_seconds=10, memory_bytes=budget, processes=4)
  result = sandbox.run_python(_MEMORY_HOLDERS, limits=limits)
  if sandbox.memory_control() == 'cgroup' and result.cause == 'memory':
    return  # the cgroup's memory.max held: the kernel killed a holder over the budget
  assert result.passed, (result.cause, result.stderr)
  children, held = map(int, result.stdout.split())
  assert children >= 2, 'more than one holder ran at once'
  assert held <= budget, f'{children} processes held {held >> 20} MiB at once, over 256 MiB'


@needs_bwrap
def test_a_connection_to_the_hosts_loopback_is_refused():
  with socket.socket() as server:
    server.bind(('127.0.0.1', 0))
    server.listen()
    port = server.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)"
    result = sandbox.run_python(code, limits=_FAST)
    server.setblocking(False)
    with pytest.raises(BlockingIOError):
      server.accept()
  assert (result.passed, result.cause) == (False, 'exit_code')
  assert result.error.startswith('ConnectionRefusedError')


@needs_bwrap
@pytest.mark.parametrize('where', ['host_tmp', 'usr'])
def test_writing_outside_its_directory_fails_and_leaves_nothing(tmp_path, where):
  target = tmp_path / 'escaped' if where == 'host_tmp' else pathlib.Path('/usr/graftjax-escaped')
  result = sandbox.run_python(f'open({str(target)!r}, "w").write("x")', limits=_FAST)
  assert (result.passed, result.cause) == (False, 'exit_code')
  assert result.error.split(':')[0] in ('FileNotFoundError', 'PermissionError', 'OSError')
  assert not target.exists()


@needs_bwrap
def test_the_users_home_is_not_visible():
  home = pathlib.Path.home()
  secret = home / f'graftjax-secret-{uuid.uuid4().hex}'
  try:
    secret.write_text('the secret')
  except OSError as error:
    pytest.skip(f'cannot write a probe file in {home}: {error}')
  try:
    code = (
      f'import os\nprint(os.path.exists({str(home)!r}) and os.listdir({str(home)!r}))\n'
      f'print(open({str(secret)!r}).read())'
    )
    result = sandbox.run_python(code, limits=_FAST)
  finally:
    secret.unlink()
  assert (result.passed, result.cause) == (False, 'exit_code')
  assert result.error.startswith('FileNotFoundError')
  assert secret.name not in result.stdout and 'the secret' not in result.stdout


@needs_bwrap
def test_a_file_past_its_size_limit_is_refused():
  limits = sandbox.Limits(file_bytes=1 << 20)
  result = sandbox.run_python("open('/tmp/big', 'wb').write(bytes(2 << 20))", limits=limits)
  assert (result.passed, result.cause) == (False, 'file_size')


@needs_bwrap
@pytest.mark.parametrize('stream', ['stdout', 'stderr'])
def test_an_output_flood_is_an_output_limit_whatever_the_program_does_next(stream):
  limits = sandbox.Limits(file_bytes=1 << 20)
  code = (
    f'import sys\ntry:\n  sys.{stream}.write("x" * (2 << 20))\n  sys.{stream}.flush()\n'
    'except OSError:\n  pass\nimport os\nos._exit(0)'
  )
  result = sandbox.run_python(code, limits=limits)
  assert (result.passed, result.cause) == (False, 'output_limit')
  assert len(getattr(result, stream)) == 1 << 20


@needs_bwrap
def test_two_sandboxes_talk_over_the_descriptors_they_are_given():
  read, write = os.pipe()
  try:
    reader = sandbox.Sandbox(
      f'import os\nprint(os.read({read}, 100).decode(), open("note").read())',
      files={'note': 'from the host'},
      pass_fds=(read,),
    )
    writer = sandbox.Sandbox(f'import os\nos.write({write}, b"hello")', pass_fds=(write,))
  finally:
    os.close(read)
    os.close(write)
  assert writer.finish().passed
  assert reader.finish().stdout == 'hello from the host\n'


@needs_bwrap
def test_a_stopped_sandbox_says_so():
  running = sandbox.Sandbox('import time\ntime.sleep(60)')
  running.stop()
  result = running.finish()
  assert (result.passed, result.cause) == (False, 'stopped')
  assert result.seconds < 30


@needs_bwrap
def test_a_signal_is_named():
  result = sandbox.run_python('import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)')
  assert (result.passed, result.cause, result.signal) == (False, 'signal', 'SIGSEGV')


@needs_bwrap
def test_a_sandbox_bubblewrap_cannot_build_is_an_error_naming_why(monkeypatch):
  missing = f'/nonexistent-{uuid.uuid4().hex}'
  monkeypatch.setattr(sandbox, '_system_mounts', lambda: ['--ro-bind', missing, '/usr'])
  with pytest.raises(sandbox.SandboxError, match='could not create the sandbox'):
    sandbox.run_python('print(1)')


def test_missing_bubblewrap_is_an_error_naming_the_fix(monkeypatch):
  monkeypatch.setenv('PATH', os.devnull)
  with pytest.raises(sandbox.SandboxError, match='make setup'):
    sandbox.run_python('print(1)')
