"""Run untrusted Python in a bubblewrap sandbox made for one program.

The program sees the interpreter and the system's libraries read-only, a private tmpfs at /tmp
(its only writable place, and its working directory), no network (a fresh network namespace
with loopback only), no home directory, its own process, IPC and UTS namespaces, and runs as an
unprivileged user of its own under CPU-time, process-count and file-size limits, one memory
budget for all its processes together, and a wall-clock timeout. Output is captured to host
files bounded by the file-size limit.

The memory budget (`Limits.memory_bytes`) is the sandbox's, not each process's: where the host
delegates cgroup v2 memory control, the sandbox runs in a cgroup of its own whose `memory.max`
is the budget (and `pids.max` the process count); elsewhere each process's address space
(RLIMIT_AS) is the budget divided by the process count (RLIMIT_NPROC), so that all of them at
once cannot hold more than the budget (`memory_control` says which holds here).

    result = sandbox.run_python('print(1 + 1)')
    result.passed, result.cause, result.stdout   # True, 'ok', '2\n'

Two programs that talk run at once: `Sandbox(...)` starts one, `.finish(deadline)` ends it.
Details: docs/flywheel.md, section "Code verification".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

from graftjax.errors import GraftjaxError

# Inside the sandbox, as its init (pid 1, which nothing inside can signal): fork the program,
# which drops to the sandbox user when started as root, sets its limits and runs main.py; reap
# every process until the program ends, then exit with its status, 128 + N for signal N. A
# program that ignores SIGXCPU dies of the SIGKILL at the hard CPU limit: that is SIGXCPU too.
_LAUNCHER = """\
import os, resource, signal, sys
uid, cpu, memory, processes, file_bytes = (int(a) for a in sys.argv[1:6])
program = os.fork()
if program == 0:
  if os.getuid() == 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_NPROC, processes),
                       (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
  resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
  os.execv(sys.executable, [sys.executable, '-I', 'main.py', *sys.argv[6:]])
while True:
  pid, status, usage = os.wait4(-1, 0)
  if pid == program:
    break
code = os.waitstatus_to_exitcode(status)
if code == -signal.SIGKILL and usage.ru_utime + usage.ru_stime >= cpu:
  code = -signal.SIGXCPU
os._exit(128 - code if code < 0 else code)
"""

# The longest wait for the kernel to end the processes a program left behind.
_TEARDOWN_SECONDS = 10.0

# A fork or a thread refused under RLIMIT_NPROC, as Python reports it.
_PROCESS_REFUSED = (
  'BlockingIOError: [Errno 11] Resource temporarily unavailable',
  "RuntimeError: can't start new thread",
)

# The users a run as root picks from: one of its own, so no other run shares its process count.
_UIDS = (1 << 20, 1 << 30)


class SandboxError(GraftjaxError, RuntimeError):
  """The sandbox itself could not run (bubblewrap missing or refusing); says which and why."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one program may use.

  Attributes:
    wall_seconds: wall-clock timeout; the whole sandbox is killed after it.
    cpu_seconds: CPU time per process (SIGXCPU, then SIGKILL a second later).
    memory_bytes: the memory budget of the whole sandbox, all its processes together: a
      cgroup's `memory.max` where the host allows one, else RLIMIT_AS of
      `memory_bytes // processes` on each process (`memory_control`).
    processes: processes and threads of the sandbox user (RLIMIT_NPROC; the cgroup's
      `pids.max` too).
    file_bytes: largest file it may write, captured output included (RLIMIT_FSIZE).
    tmpfs_bytes: size of its private /tmp.
    uid: the unprivileged user it runs as when the caller is root; None: a fresh one per run.
  """

  wall_seconds: float = 30.0
  cpu_seconds: int = 10
  memory_bytes: int = 1 << 30
  processes: int = 32
  file_bytes: int = 16 << 20
  tmpfs_bytes: int = 64 << 20
  uid: int | None = None


@dataclasses.dataclass(frozen=True)
class Result:
  """How one program ended.

  Attributes:
    passed: it exited with status 0 within every limit.
    cause: 'ok', or why it failed: 'output_limit' (its stdout or stderr reached
      `file_bytes`), 'timeout' (wall clock), 'process_limit' (a fork refused, or every
      process it may have alive at the timeout), 'cpu_time', 'memory' (an allocation
      refused), 'file_size' (a write past `file_bytes`), 'signal' (killed by another
      signal), 'stopped' (ended by `Sandbox.stop`), 'exit_code' (any other non-zero exit:
      a failed assertion, a refused connection or file; `error` names it).
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


_CGROUP_ROOT = pathlib.Path('/sys/fs/cgroup')


def _own_cgroup() -> pathlib.Path | None:
  """This process's cgroup v2 folder, if the host delegates memory and pids control in it to
  this process (it may make child cgroups that limit both); else None."""
  try:
    line = next(
      (x for x in pathlib.Path('/proc/self/cgroup').read_text().splitlines() if x[:3] == '0::'),
      None,
    )
    if line is None or not (_CGROUP_ROOT / 'cgroup.controllers').is_file():
      return None
    own = _CGROUP_ROOT / line[3:].lstrip('/')
    enabled = (own / 'cgroup.subtree_control').read_text().split()
  except OSError:
    return None
  if not {'memory', 'pids'} <= set(enabled) or not os.access(own, os.W_OK):
    return None
  return own


def memory_control() -> str:
  """How a sandbox's memory budget is held here: 'cgroup' (a cgroup v2 of its own, whose
  `memory.max` is the budget) or 'rlimit' (RLIMIT_AS of budget / processes on each process)."""
  return 'cgroup' if _own_cgroup() is not None else 'rlimit'


class _Cgroup:
  """A cgroup v2 of one sandbox under `parent`: `memory.max` the budget, no swap, `pids.max`
  the process count. `enter` (in the child, before it runs bubblewrap) moves a process in."""

  def __init__(self, parent: pathlib.Path, limits: Limits):
    self.path = parent / f'graftjax-sandbox-{secrets.token_hex(6)}'
    self.path.mkdir()
    try:
      for name, value in (
        ('memory.max', limits.memory_bytes),
        ('memory.swap.max', 0),
        ('pids.max', limits.processes + 1),  # and the sandbox's init
      ):
        with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to bound
          (self.path / name).write_text(f'{value}\n')
    except OSError:
      self.remove()
      raise
    self._procs = str(self.path / 'cgroup.procs')

  def enter(self) -> None:
    with open(self._procs, 'w') as f:
      f.write(str(os.getpid()))

  def out_of_memory(self) -> bool:
    """Whether the kernel killed a process of it for going over `memory.max`."""
    try:
      events = (self.path / 'memory.events').read_text().split()
    except OSError:
      return False
    counts = dict(zip(events[::2], events[1::2]))
    return int(counts.get('oom_kill', '0')) > 0

  def remove(self) -> None:
    with contextlib.suppress(OSError):
      self.path.rmdir()


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


def _command(
  limits: Limits,
  uid: int,
  files: Mapping[str, int],
  status_fd: int,
  args: tuple[str, ...],
  *,
  memory: int,
) -> list[str]:
  executable, prefix = _python()
  root = os.geteuid() == 0
  command = [bwrap(), '--die-with-parent', '--new-session', '--unshare-pid', '--as-pid-1']
  command += ['--unshare-net']
  command += ['--unshare-ipc', '--unshare-uts', '--unshare-cgroup-try', '--hostname', 'sandbox']
  # As root, no user namespace: the program becomes `uid`, which the kernel holds to
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
  for name, fd in files.items():
    command += ['--perms', '0644', '--file', str(fd), f'/tmp/{name}']
  command += ['--chdir', '/tmp']
  command += ['--clearenv', '--setenv', 'PATH', '/usr/bin:/bin', '--setenv', 'HOME', '/tmp']
  command += ['--json-status-fd', str(status_fd)]
  numbers = (uid, limits.cpu_seconds, memory, limits.processes)
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
    return 'process_limit'
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


def _tasks_in_namespace(init_pid: int) -> int:
  """The processes and threads in the pid namespace whose init is `init_pid`, init excluded."""
  try:
    namespace = os.readlink(f'/proc/{init_pid}/ns/pid')
  except OSError:
    return 0
  count = 0
  for entry in os.scandir('/proc'):
    if not entry.name.isdigit() or int(entry.name) == init_pid:
      continue
    try:
      if os.readlink(f'/proc/{entry.name}/ns/pid') == namespace:
        count += len(os.listdir(f'/proc/{entry.name}/task'))
    except OSError:
      continue
  return count


def _read(file, limit: int) -> str:
  file.seek(0)
  return file.read(limit).decode(errors='replace')


class Sandbox:
  """One program started in a fresh sandbox; `finish` waits for it and says how it ended.

  Args:
    code: the program, run as /tmp/main.py with `args` as sys.argv[1:].
    limits: what it may use.
    args: its arguments.
    files: more files for its /tmp, by name.
    pass_fds: descriptors of the caller it inherits, at the same numbers.

  Raises:
    SandboxError: bubblewrap is missing or could not start.
  """

  def __init__(
    self,
    code: str,
    *,
    limits: Limits = Limits(),
    args: tuple[str, ...] = (),
    files: Mapping[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
  ):
    self.limits = limits
    uid = limits.uid if limits.uid is not None else _UIDS[0] + secrets.randbelow(_UIDS[1])
    contents = {'main.py': code, **(files or {})}
    self._inputs = {name: tempfile.TemporaryFile() for name in contents}
    for name, text in contents.items():
      self._inputs[name].write(text.encode())
      self._inputs[name].seek(0)
    self._stdout, self._stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    self._status_read, status_write = os.pipe()
    os.set_blocking(self._status_read, False)
    self._status = b''
    fds = {name: file.fileno() for name, file in self._inputs.items()}
    bwrap()  # SandboxError before a cgroup is made, if bubblewrap is missing
    self._cgroup = None
    parent = _own_cgroup()
    if parent is not None:
      with contextlib.suppress(OSError):  # refused after all: the rlimits hold the budget
        self._cgroup = _Cgroup(parent, limits)
    # In a cgroup the budget is the cgroup's; else each of `processes` gets its share.
    memory = limits.memory_bytes if self._cgroup else limits.memory_bytes // limits.processes
    command = _command(limits, uid, fds, status_write, args, memory=memory)
    self._start = time.monotonic()
    try:
      self._process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=self._stdout,
        stderr=self._stderr,
        pass_fds=(*fds.values(), status_write, *pass_fds),
        start_new_session=True,
        preexec_fn=self._cgroup.enter if self._cgroup else None,
      )
    except (OSError, subprocess.SubprocessError) as error:
      self._close()
      os.close(self._status_read)
      raise SandboxError(f'bubblewrap could not start: {error}') from error
    finally:
      os.close(status_write)
    self._stopped = False

  def _read_status(self) -> None:
    while True:
      try:
        chunk = os.read(self._status_read, 4096)
      except BlockingIOError:
        return
      if not chunk:
        return
      self._status += chunk

  def _kill(self) -> None:
    try:
      os.killpg(self._process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass

  def stop(self) -> None:
    """Ends the program now; its result's cause is 'stopped' unless it had already ended."""
    if self._process.poll() is None:
      self._stopped = True
      self._kill()

  def finish(self, deadline: float | None = None) -> Result:
    """Waits for the program until `deadline` (time.monotonic(); None: its wall-clock limit
    from its start), kills the sandbox then, and returns how it ended.

    Raises:
      SandboxError: bubblewrap could not create the sandbox (its message says why).
    """
    if deadline is None:
      deadline = self._start + self.limits.wall_seconds
    timed_out, held = False, 0
    try:
      self._process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      timed_out = True
      self._read_status()
      child_pid, _ = _status(self._status)
      if child_pid is not None:
        held = _tasks_in_namespace(child_pid)
      self._kill()
      self._process.wait()
    seconds = time.monotonic() - self._start
    os.set_blocking(self._status_read, True)
    with os.fdopen(self._status_read, 'rb') as status_file:
      self._status += status_file.read()
    child_pid, exit_code = _status(self._status)
    if child_pid is not None:
      # bubblewrap returns when the program ends; what it forked dies with its namespace.
      _wait_until_gone(child_pid, _TEARDOWN_SECONDS)
    limit = self.limits.file_bytes
    flooded = any(os.fstat(f.fileno()).st_size >= limit for f in (self._stdout, self._stderr))
    out, err = _read(self._stdout, limit), _read(self._stderr, limit)
    out_of_memory = self._cgroup is not None and self._cgroup.out_of_memory()
    self._close()
    if exit_code is None and not timed_out and not self._stopped:
      raise SandboxError(f'bubblewrap could not create the sandbox: {err.strip()}')
    if timed_out:
      ending = 'process_limit' if held >= self.limits.processes else 'timeout'
    else:
      ending = 'stopped' if self._stopped and exit_code is None else None
    if ending is None and out_of_memory and exit_code not in (None, 0):
      ending = 'memory'  # the cgroup's budget: the kernel killed a process over it
    return _result(ending, flooded, exit_code, out, err, seconds)

  def _close(self) -> None:
    for file in (*self._inputs.values(), self._stdout, self._stderr):
      file.close()
    if self._cgroup is not None:
      self._cgroup.remove()


def run_python(code: str, *, limits: Limits = Limits(), args: tuple[str, ...] = ()) -> Result:
  """Runs `code` as /tmp/main.py (with `args` as sys.argv[1:]) in a fresh sandbox.

  Raises:
    SandboxError: bubblewrap is missing or could not create the sandbox (its message says why).
  """
  return Sandbox(code, limits=limits, args=args).finish()


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f'signal {number}'


def _result(
  ending: str | None, flooded: bool, exit_code: int | None, out: str, err: str, seconds: float
) -> Result:
  signal_name = None
  if exit_code is not None and exit_code > 128:
    # bubblewrap reports a child killed by signal N as exit status 128 + N.
    signal_name, exit_code = _signal_name(exit_code - 128), None
  error = _last_error(err)
  if flooded:
    cause = 'output_limit'
  else:
    cause = ending or _cause(exit_code, signal_name, error)
  if ending is not None:
    exit_code = None
  return Result(cause == 'ok', cause, exit_code, signal_name, error, out, err, seconds)
