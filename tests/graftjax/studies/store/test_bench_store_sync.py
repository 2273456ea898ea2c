"""bench_store_sync: the sync phases read what they should, and the section renders them."""

from graftjax.studies.store import bench_store_sync
from graftjax.studies.common import results_page
from graftjax.studies.store import section_store_sync as store_sync


def test_full_incremental_and_no_op_syncs_read_every_new_and_no_old_manifest(tmp_path):
  result = bench_store_sync.experiment(
    spec=str(tmp_path / 'store'), backend='file', blocks_count=12, new=3, folder=tmp_path
  )
  assert [row['manifests_read'] for row in result['rows']] == [12, 3, 0]
  assert [row['listed'] for row in result['rows']] == [12, 15, 15]
  assert result['indexed'] == 15 and result['objects_listed'] >= 15 * 4
  page = results_page.Result('store_sync/store_sync.json', {**result, 'result_sha256': 'ab' * 32})
  text = '\n'.join(store_sync.render([page]))
  assert 'incremental (+3)' in text and 'no-op' in text
