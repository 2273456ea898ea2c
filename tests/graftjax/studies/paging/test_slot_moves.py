"""slot_moves: a block moved by whole splits keeps its bits on the 'xla_split' attention."""

import json

from graftjax.studies.paging import slot_moves


def test_whole_split_moves_are_byte_equal_on_xla_split():
  result = slot_moves.experiment(
    model_name='tiny',
    impls=['xla_split'],
    tokens=45,
    chunk_size=8,
    capacity=1024,
    slots=[224, 256, 512],
  )
  by_slot = {r['slot']: r for r in result['rows']}
  assert by_slot[256]['layers_differ'] == 0 and by_slot[512]['layers_differ'] == 0
  assert result['summary']['xla_split_byte_equal_at'][-2:] == [256, 512]
  assert by_slot[224]['max_abs_dk'] < 1e-4
  json.dumps(result)
