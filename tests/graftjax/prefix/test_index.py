"""Chained keys and lookup at token granularity, without a model."""

from graftjax.prefix import index as index_lib
from graftjax.prefix import keys

DOMAIN = keys.Domain('f' * 64, 'float32', (('attention', 'pallas'),), True).digest


def _index(*prompts, span=4):
  index = index_lib.PrefixIndex(DOMAIN, span)
  for p in prompts:
    parent = keys.ROOT
    for start in range(0, len(p), span):
      tokens = tuple(p[start : start + span])
      key = index.key(parent, tokens)
      index.take(index_lib.Entry(key, parent, start, tokens, []).record('b' * 64, DOMAIN))
      parent = key
  return index


def _length(steps):
  return sum(s.rows for s in steps)


def test_a_key_binds_the_prefix_before_it_and_the_domain():
  a = keys.span_key(DOMAIN, keys.ROOT, [1, 2])
  assert keys.span_key(DOMAIN, keys.ROOT, [1, 2]) == a
  assert keys.span_key(DOMAIN, a, [1, 2]) != a
  other = keys.Domain('e' * 64, 'float32', (('attention', 'pallas'),), True).digest
  assert keys.span_key(other, keys.ROOT, [1, 2]) != a
  xla = keys.Domain('f' * 64, 'float32', (('attention', 'xla'),), False, 64, 4).digest
  assert xla != DOMAIN


def test_lookup_finds_the_longest_stored_prefix_at_any_token():
  index = _index([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 0, 0])
  assert _length(index.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 9)) == 9
  assert _length(index.lookup([1, 2, 3, 4, 5, 6, 7, 1], 8)) == 7  # inside span [4, 8)
  assert _length(index.lookup([1, 2, 3, 4, 5, 9], 6)) == 5
  assert _length(index.lookup([2, 2], 2)) == 0
  steps = index.lookup([1, 2, 3, 4, 5, 6, 0, 1], 8)
  assert [(s.entry.start, s.rows) for s in steps] == [(0, 4), (4, 3)]


def test_the_same_tokens_after_another_prefix_are_not_a_hit():
  index = _index([9, 9, 9, 9, 5, 6, 7, 8])
  assert _length(index.lookup([1, 2, 3, 4, 5, 6, 7, 8], 8)) == 0


def test_records_of_another_domain_or_a_wrong_key_are_not_taken():
  index = _index()
  entry = index_lib.Entry(index.key(keys.ROOT, (1, 2, 3, 4)), keys.ROOT, 0, (1, 2, 3, 4), [])
  index.take(entry.record('b' * 64, 'other'))
  assert len(index) == 0 and index.foreign == 1
  index.take({**entry.record('b' * 64, DOMAIN), 'token_ids': [1, 2, 3, 5]})
  assert len(index) == 0
  index.take(entry.record('b' * 64, DOMAIN))
  index.take({'op': 'delete', 'domain': DOMAIN, 'key': entry.key, 'block': 'b' * 64})
  assert len(index) == 0 and index.lookup([1, 2, 3, 4], 4) == []
