"""An adversarial schedule explorer for the object-store commit protocol.

Actors (writers, deleters, a garbage collection, a sync) run the real `BlockStore` code on
one `memory` kvstore, each on a thread of its own, one at a time: an actor runs until it
is about to issue its next protocol request (a read, write or deletion of a manifest, an
announcement or a collection record, a listing, any deletion; the payload's own chunk
reads and writes go with the step around them), then waits while the explorer picks who
goes next. Time is a logical clock that ticks one second a step. After every step the
explorer checks, with nothing running:

- a put that returned reads back exact (its payload, every byte) until a deletion of its
  key overlaps it;
- every listed block reads whole and verifies (nothing reads corrupt), and no actor ever
  raised anything but a `StoreError`;
- no manifest names a prefix a collection deleted (gc never deletes what a live writer
  may still commit).

`explore` enumerates every interleaving of a scenario (depth first, replaying a prefix of
choices) or samples `sample` schedules with a fixed seed. docs/store_format.md, "The
invariants", states the same properties.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import re
import threading
import types
from collections.abc import Callable

import numpy as np
import tensorstore as ts

from graftjax import store as store_lib
from graftjax.store import commit as store_commit
from graftjax.store import manifest as store_manifest

_PAYLOAD_FILE = re.compile(r'(^|/)[0-9]{10}-[0-9a-f]{32}/(?!\.commit$).')
_START = 1_700_000_000
_WAIT_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Actor:
  """One party of a scenario: `run(store)` on its own store; `kind` is 'put' (with `block`),
  'delete' (with `key`), 'gc' or 'sync'."""

  kind: str
  run: Callable[[store_lib.BlockStore], object]
  block: object = None
  key: str | None = None


def writer(block) -> Actor:
  return Actor(
    'put', lambda store: store.put(block), block=block, key=store_lib.key_for(block.meta)
  )


def deleter(key: str) -> Actor:
  return Actor('delete', lambda store: store.delete(key), key=key)


def collector(grace_seconds: float) -> Actor:
  return Actor('gc', lambda store: store.gc(grace_seconds=grace_seconds))


def syncer() -> Actor:
  """Lists the store and reads every block listed (a catalog's sync, then a read)."""

  def run(store):
    for key in store.list():
      try:
        store.read_meta(key)
        store.get(key)
      except store_lib.MissingBlockError:
        pass  # deleted since the listing

  return Actor('sync', run)


@dataclasses.dataclass
class Violation:
  schedule: tuple[int, ...]
  step: int
  what: str


@dataclasses.dataclass
class Report:
  """Schedules played, violations found (the first stops the search), and how often each
  actor ended how: (actor, 'returned' or the error's type name) -> runs."""

  runs: int = 0
  violations: list = dataclasses.field(default_factory=list)
  outcomes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  complete: bool = False  # every schedule was played (an enumeration within its budget)

  def add(self, run: _Run) -> bool:
    """Counts `run`; True if it found a violation."""
    self.runs += 1
    for i, (how, value, _) in run.done.items():
      self.outcomes[i, 'returned' if how == 'returned' else type(value).__name__] += 1
    if run.violation:
      self.violations.append(Violation(tuple(run.schedule), run.step, run.violation))
    return bool(run.violation)


class _Abandoned(BaseException):
  """Ends an actor whose run stopped at a violation (no store code catches it)."""


class _Run:
  """One schedule of a scenario: its actors' threads, the clock, what happened."""

  def __init__(self, actors, setup, choose):
    self.kv = ts.KvStore.open('memory://').result()
    self.actors = actors
    self.choose = choose
    self.cond = threading.Condition()
    self.turn = None
    self.paused = set()
    self.done = {}  # actor -> ('returned' | 'raised', value, step)
    self.started = {}  # actor -> step of its first request
    self.step = 0
    self.clock = _START
    self.collected = set()  # (key, data) prefixes a collection deleted
    self.schedule = []
    self.violation = None
    self.abandoned = False
    for block in setup:
      self.checker().put(block)

  def checker(self) -> store_lib.BlockStore:
    return store_lib.BlockStore(self.kv)

  def pause(self, actor: int) -> None:
    """Waits for `actor`'s turn; the explorer's next choice."""
    with self.cond:
      self.paused.add(actor)
      self.cond.notify_all()
      turn = lambda: self.turn == actor or self.abandoned
      if not self.cond.wait_for(turn, timeout=_WAIT_SECONDS):
        raise RuntimeError(f'actor {actor} never got its turn')
      if self.abandoned:
        raise _Abandoned
      self.started.setdefault(actor, self.step)
      self.paused.discard(actor)
      self.turn = None

  def play(self) -> None:
    threads = [
      threading.Thread(target=self._actor, args=(i,), daemon=True) for i in range(len(self.actors))
    ]
    for thread in threads:
      thread.start()
    while self.violation is None:
      with self.cond:
        settled = lambda: all(i in self.paused or i in self.done for i in range(len(threads)))
        if not self.cond.wait_for(settled, timeout=_WAIT_SECONDS):
          raise RuntimeError('an actor neither paused nor finished')
        ready = sorted(self.paused)
        if not ready:
          break
        actor = self.choose(ready, len(self.schedule))
        self.schedule.append(actor)
        self.step += 1
        self.clock += 1
        self.turn = actor
        self.cond.notify_all()
        moved = lambda: self.turn is None and (actor in self.paused or actor in self.done)
        if not self.cond.wait_for(moved, timeout=_WAIT_SECONDS):
          raise RuntimeError(f'actor {actor} neither paused nor finished')
      self.check()
    with self.cond:
      self.abandoned = True
      self.cond.notify_all()
    for thread in threads:
      thread.join(timeout=_WAIT_SECONDS)

  def _actor(self, i: int) -> None:
    store = self.checker()
    store._kv = _Stepped(store._kv, self, i)
    try:
      self.pause(i)  # the first step begins the call
      outcome = ('returned', self.actors[i].run(store))
    except _Abandoned:
      return
    except store_lib.StoreError as e:
      outcome = ('raised', e)
    except Exception as e:  # noqa: BLE001  (a violation, reported)
      outcome = ('raised', e)
      self.violation = self.violation or f'actor {i} raised {e!r}, not a StoreError'
    with self.cond:
      self.done[i] = (*outcome, self.step)
      self.cond.notify_all()

  def check(self) -> None:
    """The invariants, with every actor paused or done."""
    if self.violation is not None:
      return
    store = self.checker()
    listed = store.list()
    for key in listed:
      try:
        store.verify(key)
      except store_lib.StoreError as e:
        self.violation = f'listed block {key[:8]} does not read: {e}'
        return
      data = store_manifest.parse_manifest(
        store._kv.read(f'{key}/{store_lib.MANIFEST}').result().value, key, key
      )[0].get('data')
      if (key, data) in self.collected:
        self.violation = f'block {key[:8]} commits {data[:10]}, which a collection deleted'
        return
    for i, actor in enumerate(self.actors):
      outcome = self.done.get(i)
      if actor.kind != 'put' or outcome is None or outcome[0] != 'returned':
        continue
      if self._deletion_overlaps(actor.key, self.started[i]):
        continue
      try:
        got = store.get(actor.key)
      except store_lib.StoreError as e:
        self.violation = f'put by actor {i} returned at step {outcome[2]}; now {e}'
        return
      if not _same(got, actor.block):
        self.violation = f'put by actor {i} returned; its key holds another payload'
        return

  def _deletion_overlaps(self, key: str, since: int) -> bool:
    """Whether a deletion of `key` ran at any step from `since` on."""
    return any(
      actor.kind == 'delete'
      and actor.key == key
      and i in self.started
      and self.done.get(i, (None, None, self.step))[2] >= since
      for i, actor in enumerate(self.actors)
    )


class _Stepped:
  """A kvstore whose protocol requests each wait for their actor's turn (`_Run.pause`)."""

  def __init__(self, kv, run: _Run, actor: int):
    self._kv, self._run, self._actor = kv, run, actor

  def __truediv__(self, suffix: str) -> _Stepped:
    return _Stepped(self._kv / suffix, self._run, self._actor)

  def __getattr__(self, name):
    return getattr(self._kv, name)

  def read(self, key, *args, **kwargs):
    if not _PAYLOAD_FILE.search(self._kv.path + _text(key)):
      self._run.pause(self._actor)
    return self._kv.read(key, *args, **kwargs)

  def write(self, key, *args, **kwargs):
    if not _PAYLOAD_FILE.search(self._kv.path + _text(key)):
      self._run.pause(self._actor)
    return self._kv.write(key, *args, **kwargs)

  def list(self, *args, **kwargs):
    if not re.search(r'[0-9a-f]{64}/$', self._kv.path):  # not a bucket check under a key
      self._run.pause(self._actor)
    return self._kv.list(*args, **kwargs)

  def delete_range(self, key_range):
    self._run.pause(self._actor)
    name = self._kv.path + _text(key_range.inclusive_min)
    parts = name.split('/')
    if self._run.actors[self._actor].kind == 'gc' and len(parts) == 3 and not parts[2]:
      self._run.collected.add((parts[0], parts[1]))
    return self._kv.delete_range(key_range)


def _text(key) -> str:
  return key.decode('latin-1') if isinstance(key, bytes) else key


def _same(got, want) -> bool:
  return got.meta == want.meta and all(
    np.asarray(getattr(got, name)).tobytes() == np.asarray(getattr(want, name)).tobytes()
    for name in ('k', 'v', 'positions')
  )


def _clocked(run: _Run):
  """A stand-in for the `time` module whose clock is the run's."""
  return types.SimpleNamespace(time=lambda: float(run.clock))


def play(actors, schedule_choice, setup=(), patch=None) -> _Run:
  """Plays one schedule; `patch(run)` installs the run's clock (a context manager)."""
  run = _Run(actors, setup, schedule_choice)
  with patch(run):
    run.play()
  return run


def explore(
  actors, *, setup=(), sample: int | None = None, seed: int = 0, budget: int = 100_000, patch
) -> Report:
  """Every schedule of `actors` (at most `budget` of them), or `sample` random ones drawn
  with `seed`; `setup` blocks are put before the actors start. Stops at the first
  violation."""
  report = Report()
  if sample is not None:
    for k in range(sample):
      rng = random.Random(seed * 1_000_003 + k)
      if report.add(play(actors, lambda ready, _: rng.choice(ready), setup, patch)):
        return report
    return report
  prefix: list[int] = []
  while report.runs < budget:
    decisions = []

    def choose(ready, i, prefix=prefix, decisions=decisions):
      chosen = prefix[i] if i < len(prefix) else ready[0]
      decisions.append((ready, chosen))
      return chosen

    if report.add(play(actors, choose, setup, patch)):
      return report
    # The next schedule: the last decision that has an untried alternative.
    while decisions:
      ready, chosen = decisions.pop()
      later = [a for a in ready if a > chosen]
      if later:
        prefix = [c for _, c in decisions] + [later[0]]
        break
    else:
      report.complete = True
      return report
  return report


def clock_patch(monkeypatch):
  """`patch` for `explore`: the store's clock (deposit ages, prefixes' and records' names)
  is the run's."""
  import contextlib

  @contextlib.contextmanager
  def patch(run):
    with monkeypatch.context() as m:
      m.setattr(store_commit, 'time', _clocked(run))
      m.setattr(store_manifest, 'time', _clocked(run))
      yield

  return patch
