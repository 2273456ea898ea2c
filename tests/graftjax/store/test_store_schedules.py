"""Every interleaving of small scenarios of the object-store commit protocol, on the real
store code (`schedule_explorer`): writers, deleters, a short-grace garbage collection and a
sync, checked after every step. And the explorer finds the race it exists for: with the
deposit's old staleness check (half of the fixed `GRACE_SECONDS`, blind to the grace a
collection runs with) put back, it reports a collection deleting a payload a put
committed."""

import pytest
import schedule_explorer as explorer
from test_store import make_block
from test_store_races import _rival

from graftjax import store as store_lib
from graftjax.store import commit as store_commit


@pytest.fixture(name='patch')
def patch_fixture(monkeypatch):
  return explorer.clock_patch(monkeypatch)


def _old_announce(kv, where, key, data):
  """The deposit's check before the fix: half of the fixed grace, no announcement, no
  look at the collections in progress."""
  age = store_commit.time.time() - store_commit.data_seconds(data)
  if age > store_commit.GRACE_SECONDS / 2:
    raise store_lib.StoreIOError(where, f'staging the payload took {age:.0f} s')


def test_a_writer_and_a_short_grace_collection_every_interleaving(patch):
  block = make_block(0)
  report = explorer.explore([explorer.writer(block), explorer.collector(1)], patch=patch)
  assert not report.violations, report.violations
  assert report.complete  # every interleaving, not one
  # The put returns in some schedules and refuses (a deposit older than half the
  # collection's grace) in others; the collection always returns.
  assert report.outcomes[0, 'returned'] and report.outcomes[0, 'StoreIOError']
  assert report.outcomes[1, 'returned'] == report.runs


def test_the_explorer_finds_the_grace_race_when_the_old_check_is_put_back(patch, monkeypatch):
  monkeypatch.setattr(store_commit, 'announce', _old_announce)
  block = make_block(0)
  report = explorer.explore([explorer.writer(block), explorer.collector(1)], patch=patch)
  assert report.violations, f'no violation in {report.runs} schedules'
  assert 'collection deleted' in report.violations[0].what or 'does not read' in (
    report.violations[0].what
  )


def test_two_writers_of_a_key_and_a_collection(patch):
  block = make_block(0)
  actors = [explorer.writer(block), explorer.writer(_rival(block)), explorer.collector(1)]
  report = explorer.explore(actors, patch=patch, sample=150, seed=1)
  assert not report.violations, report.violations
  assert report.outcomes[0, 'ConflictingBlockError'] and report.outcomes[1, 'returned']


def test_a_writer_a_deleter_and_a_collection_on_a_stored_key(patch):
  block = make_block(0)
  key = store_lib.key_for(block.meta)
  actors = [explorer.writer(_rival(block)), explorer.deleter(key), explorer.collector(1)]
  report = explorer.explore(actors, setup=[block], patch=patch, sample=150, seed=2)
  assert not report.violations, report.violations
  assert report.outcomes[0, 'returned'] and report.outcomes[1, 'returned']


def test_a_writer_and_two_collections_of_different_graces(patch):
  """The deposit keeps to the shorter grace of the two in progress, whichever began last."""
  actors = [explorer.writer(make_block(0)), explorer.collector(1), explorer.collector(3600)]
  report = explorer.explore(actors, patch=patch, sample=100, seed=4)
  assert not report.violations, report.violations


def test_a_writer_a_sync_and_a_collection(patch):
  actors = [explorer.writer(make_block(0)), explorer.syncer(), explorer.collector(0)]
  report = explorer.explore(actors, setup=[make_block(1)], patch=patch, sample=150, seed=3)
  assert not report.violations, report.violations
