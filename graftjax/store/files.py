"""A store's local files (the `file` kvstore): listed without symlinks, synced, renamed."""

from __future__ import annotations

import errno
import hashlib
import os

from graftjax.store import errors as store_errors


def digest_tree(path: str | os.PathLike[str]) -> str:
  """SHA-256 hex over every file under `path`, e.g. one stored block.

  Files are taken in sorted order of their '/'-separated relative paths;
  each adds `f'{relative_path}\\n{size}\\n'` and then its bytes.

  Raises:
    UnsafePathError: if the tree holds a symlink.
  """
  path = os.fspath(path)
  digest = hashlib.sha256()
  for relative_path in sorted(regular_files(path)):
    data = _read_bytes(os.path.join(path, relative_path))
    digest.update(f'{relative_path}\n{len(data)}\n'.encode())
    digest.update(data)
  return digest.hexdigest()


def regular_files(path: str) -> set[str]:
  """'/'-separated relative paths of the files under `path`; no symlinks."""
  files = set()
  directories = ['']
  while directories:
    directory = directories.pop()
    with os.scandir(os.path.join(path, directory)) as entries:
      for entry in entries:
        relative = directory + entry.name
        if entry.is_symlink():
          raise store_errors.UnsafePathError(path, f'{relative} is a symlink; refusing it')
        if entry.is_dir(follow_symlinks=False):
          directories.append(f'{relative}/')
        elif entry.is_file(follow_symlinks=False):
          files.add(relative)
        else:
          raise store_errors.UnsafePathError(path, f'{relative} is not a regular file')
  return files


def rename_unless_taken(source: str, target: str) -> bool:
  """Renames directory `source` to `target`; False if `target` exists."""
  try:
    os.rename(source, target)
  except OSError as e:
    if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
      return False
    raise
  return True


def fsync(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def fsync_directories(path: str) -> None:
  """fsyncs every directory under `path` (the file kvstore fsyncs files)."""
  for directory, _, _ in os.walk(path, topdown=False):
    fsync(directory)


def _read_bytes(path: str) -> bytes:
  fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  with os.fdopen(fd, 'rb') as f:
    return f.read()
