"""Run untrusted Python in a bubblewrap sandbox made for one program.

The program sees the interpreter and the system's libraries read-only, a private tmpfs at /tmp
(its only writable place, and its working directory), no network (a fresh network namespace
with loopback only), no home directory, its own process, IPC and UTS namespaces, and runs as an
unprivileged user under CPU-time, address-space, process-count and file-size limits and a
wall-clock timeout. Output is captured to host files bounded by the file-size limit.

    result = sandbox.run_python('print(1 + 1)')
    result.passed, result.cause, result.stdout   # True, 'ok', '2\n'

Details: docs/flywheel.md, section "Code verification".
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Inside the sandbox: drop to the sandbox user when started as root, set the limits, run main.py.
_LAUNCHER = """\
import os, resource, sys
uid, cpu, memory, processes, file_bytes = (int(a) for a in sys.argv[1:6])
if os.getuid() == 0:
  os.setgroups([])
  os.setresgid(uid, uid, uid)
  os.setresuid(uid, uid, uid)
for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_NPROC, processes),
                     (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_CORE, 0)):
  resource.setrlimit(limit, (value, value))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
os.execv(sys.executable, [sys.executable, '-I', 'main.py', *sys.argv[6:]])
"""

# The longest wait for the kernel to end the processes a program left behind.
_TEARDOWN_SECONDS = 10.0

# A fork or a thread refused under RLIMIT_NPROC, as Python reports it.
_PROCESS_REFUSED = (
  'BlockingIOError: [Errno 11] Resource temporarily unavailable',
  "RuntimeError: can't start new thread",
)


class SandboxError(RuntimeError):
  """The sandbox itself could not run (bubblewrap missing or refusing); says which and why."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one program may use.

  Attributes:
    wall_seconds: wall-clock timeout; the whole sandbox is killed after it.
    cpu_seconds: CPU time per process (SIGXCPU, then SIGKILL a second later).
    memory_bytes: address space per process (RLIMIT_AS).
    processes: processes and threads of the sandbox user (RLIMIT_NPROC).
    file_bytes: largest file it may write, captured output included (RLIMIT_FSIZE).
    tmpfs_bytes: size of its private /tmp.
    uid: the unprivileged user it runs as when the caller is root.
  """

  wall_seconds: float = 30.0
  cpu_seconds: int = 10
  memory_bytes: int = 1 << 30
  processes: int = 32
  file_bytes: int = 16 << 20
  tmpfs_bytes: int = 64 << 20
  uid: int = 65534


@dataclasses.dataclass(frozen=True)
class Result:
  """How one program ended.

  Attributes:
    passed: it exited with status 0 within every limit.
    cause: 'ok', or why it failed: 'timeout' (wall clock), 'cpu_time', 'memory' (an
      allocation refused), 'processes' (a fork refused), 'file_size' (a write past
      `file_bytes`), 'signal' (killed by another signal), 'exit_code' (any other non-zero
      exit: a failed assertion, a refused connection or file; `error` names it).
    exit_code: its exit status; None when killed by a signal or the timeout.
    signal: the signal's name when killed by one ('SIGXCPU'), else None.
    error: the last line of a Python traceback on stderr ('MemoryError'), else None.
    stdout: standard output, decoded with replacement.
    stderr: standard error, decoded with replacement.
    seconds: wall-clock time it ran.
  """

  passed: bool
  cause: str
  exit_code: int | None
  signal: str | None
  error: str | None
  stdout: str
  stderr: str
  seconds: float


def bwrap() -> str:
  """The path of bubblewrap; SandboxError if it is not installed."""
  path = shutil.which('bwrap')
  if path is None:
    raise SandboxError(
      'bubblewrap (bwrap) is not installed: `make setup` installs it as root, or '
      '`apt-get install bubblewrap`'
    )
  return path


def _python() -> tuple[str, str]:
  """The interpreter to run inside (this one's base, not a venv link) and its prefix."""
  executable = os.path.realpath(getattr(sys, '_base_executable', sys.executable))
  return executable, os.path.realpath(sys.base_prefix)


def _system_mounts() -> list[str]:
  args = ['--ro-bind', '/usr', '/usr']
  for name in ('bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32'):
    path = pathlib.Path('/', name)
    if path.is_symlink():
      args += ['--symlink', os.readlink(path), str(path)]
    elif path.is_dir():
      args += ['--ro-bind', str(path), str(path)]
  return args


def _command(limits: Limits, code_fd: int, status_fd: int, args: tuple[str, ...]) -> list[str]:
  executable, prefix = _python()
  root = os.geteuid() == 0
  command = [bwrap(), '--die-with-parent', '--new-session', '--unshare-pid', '--unshare-net']
  command += ['--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try', '--hostname', 'sandbox']
  # As root, no user namespace: the launcher becomes `limits.uid`, which the kernel holds to
  # RLIMIT_NPROC (it exempts uid 0 even inside a user namespace).
  command += ['--cap-add', 'CAP_SETUID', '--cap-add', 'CAP_SETGID'] if root else ['--unshare-user']
  command += _system_mounts()
  if not prefix.startswith('/usr/'):
    # bubblewrap makes missing parents 0700; the sandbox user must pass through them.
    for parent in reversed(pathlib.Path(prefix).parents[:-1]):
      command += ['--perms', '0755', '--dir', str(parent)]
    command += ['--ro-bind', prefix, prefix]
  command += ['--proc', '/proc', '--dev', '/dev']
  command += ['--size', str(limits.tmpfs_bytes), '--perms', '1777', '--tmpfs', '/tmp']
  command += ['--perms', '0644', '--file', str(code_fd), '/tmp/main.py', '--chdir', '/tmp']
  command += ['--clearenv', '--setenv', 'PATH', '/usr/bin:/bin', '--setenv', 'HOME', '/tmp']
  command += ['--json-status-fd', str(status_fd)]
  numbers = (limits.uid, limits.cpu_seconds, limits.memory_bytes, limits.processes)
  command += [executable, '-I', '-S', '-c', _LAUNCHER, *map(str, numbers)]
  return command + [str(limits.file_bytes), *args]


def _last_error(stderr: str) -> str | None:
  lines = stderr.rstrip().splitlines()
  if 'Traceback (most recent call last):' not in stderr or not lines:
    return None
  return lines[-1].strip()


def _cause(exit_code: int | None, signal_name: str | None, error: str | None) -> str:
  if signal_name == 'SIGXCPU':
    return 'cpu_time'
  if signal_name == 'SIGXFSZ':
    return 'file_size'
  if signal_name is not None:
    return 'signal'
  if exit_code == 0:
    return 'ok'
  if error is not None and error.startswith('MemoryError'):
    return 'memory'
  if error is not None and error.startswith(_PROCESS_REFUSED):
    return 'processes'
  if error is not None and '[Errno 27] File too large' in error:
    return 'file_size'
  return 'exit_code'


def _status(status: bytes) -> tuple[int | None, int | None]:
  """bubblewrap's report: the pid of the sandbox's init (host view) and the program's exit status.

  The exit status is None when the program never ran (or was killed at the timeout).
  """
  child_pid = exit_code = None
  decoder, text, index = json.JSONDecoder(), status.decode(errors='replace'), 0
  while index < len(text):
    if text[index].isspace():
      index += 1
      continue
    try:
      document, index = decoder.raw_decode(text, index)
    except json.JSONDecodeError:
      break
    child_pid = document.get('child-pid', child_pid)
    exit_code = document.get('exit-code', exit_code)
  return child_pid, exit_code


def _wait_until_gone(pid: int, timeout: float) -> None:
  """Waits for the sandbox's init to exit: the kernel ends it only once its namespace is empty."""
  try:
    pidfd = os.pidfd_open(pid)
  except ProcessLookupError:
    return
  try:
    select.select([pidfd], [], [], timeout)
  finally:
    os.close(pidfd)


def _read(file, limit: int) -> str:
  file.seek(0)
  return file.read(limit).decode(errors='replace')


def run_python(code: str, *, limits: Limits = Limits(), args: tuple[str, ...] = ()) -> Result:
  """Runs `code` as /tmp/main.py (with `args` as sys.argv[1:]) in a fresh sandbox.

  Raises:
    SandboxError: bubblewrap is missing or could not create the sandbox (its message says why).
  """
  with (
    tempfile.TemporaryFile() as code_file,
    tempfile.TemporaryFile() as stdout,
    tempfile.TemporaryFile() as stderr,
  ):
    code_file.write(code.encode())
    code_file.seek(0)
    status_read, status_write = os.pipe()
    command = _command(limits, code_file.fileno(), status_write, args)
    start = time.monotonic()
    try:
      process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        pass_fds=(code_file.fileno(), status_write),
        start_new_session=True,
      )
    except OSError as error:
      os.close(status_read)
      raise SandboxError(f'bubblewrap could not start: {error}') from error
    finally:
      os.close(status_write)
    timed_out = False
    try:
      process.wait(timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
      timed_out = True
      try:
        os.killpg(process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      process.wait()
    seconds = time.monotonic() - start
    with os.fdopen(status_read, 'rb') as status_file:
      child_pid, exit_code = _status(status_file.read())
    if child_pid is not None:
      # bubblewrap returns when the program ends; what it forked dies with its namespace.
      _wait_until_gone(child_pid, _TEARDOWN_SECONDS)
    out, err = _read(stdout, limits.file_bytes), _read(stderr, limits.file_bytes)
  if exit_code is None and not timed_out:
    raise SandboxError(f'bubblewrap could not create the sandbox: {err.strip()}')
  return _result(timed_out, exit_code, out, err, seconds)


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f'signal {number}'


def _result(timed_out: bool, exit_code: int | None, out: str, err: str, seconds: float) -> Result:
  signal_name = None
  if exit_code is not None and exit_code > 128:
    # bubblewrap reports a child killed by signal N as exit status 128 + N.
    signal_name, exit_code = _signal_name(exit_code - 128), None
  error = _last_error(err)
  cause = 'timeout' if timed_out else _cause(exit_code, signal_name, error)
  if timed_out:
    exit_code = None
  return Result(cause == 'ok', cause, exit_code, signal_name, error, out, err, seconds)
