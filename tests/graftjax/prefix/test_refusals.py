"""Bad input: a clear error, or a cold prefill with the reason recorded; never a wrong answer."""

import pathlib

import prefix_cases as cases
import pytest
from graftjax.models.gemma import model as gemma_model

from graftjax import prefix
from graftjax import store as store_lib
from graftjax.prefix import keys
from graftjax.prefix import log as log_lib
from graftjax.prefix import spans


def test_a_prompt_longer_than_the_cache_is_refused():
  engine = cases.engine(cases.model('tiny'))
  with pytest.raises(prefix.PromptTooLongError, match='exceeds the cache of 64 slots'):
    engine.prefill(list(range(3, 3 + 65)))
  with pytest.raises(prefix.PromptTooLongError, match='20 tokens \\+ 50 new ones'):
    engine.generate(cases.IDS, max_new_tokens=50)
  with pytest.raises(prefix.PrefixError, match='empty'):
    engine.prefill([])


def test_a_ring_cache_model_is_refused():
  m = cases.model('tiny').with_local_cache('ring', chunk_size=4)
  with pytest.raises(prefix.PrefixError, match='ring'):
    cases.engine(m)


def test_a_store_of_another_model_gives_a_cold_prefill_with_the_reason():
  store = cases.memory_store()
  cases.engine(cases.model('tiny'), store).prefill(cases.IDS)
  other = gemma_model.tiny(seed=1).with_impl('pallas')
  out = cases.engine(other, store).prefill(cases.IDS, deposit=False)
  assert out.hit == 0 and any('other models' in r for r in out.reasons)
  assert out.logits.tobytes() == cases.cold(other).tobytes()


def test_a_log_record_naming_another_models_span_is_caught_by_the_spans_own_metadata():
  """Records that lie (this model's keys, another model's blocks) are refused before grafting."""
  m, other = cases.model('tiny'), gemma_model.tiny(seed=1).with_impl('pallas')
  store = cases.memory_store()
  cases.engine(other, store).prefill(cases.IDS)
  engine = cases.engine(m, store)
  writer = log_lib.SpanLog(spans.log_kvstore(store))
  held = spans.SpanStore(store)
  parent = keys.ROOT
  for record in sorted(writer.read_new(), key=lambda r: r['start']):
    key = engine.index.key(parent, record['token_ids'])
    held.put(key, held.get(record['key'], record['block']))  # the other model's rows
    writer.append({**record, 'domain': engine.domain.digest, 'parent': parent, 'key': key})
    parent = key
  out = engine.prefill(cases.IDS, deposit=False)
  assert out.found == cases.N - 1 and out.hit == 0
  assert any('another model' in r for r in out.reasons)
  assert out.logits.tobytes() == cases.cold(m).tobytes()


def test_a_span_deleted_between_lookup_and_graft_shortens_the_hit(monkeypatch):
  m = cases.model('tiny')
  store = cases.memory_store()
  cases.engine(m, store).prefill(cases.IDS)
  engine = cases.engine(m, store)
  lookup = engine._lookup

  def lookup_then_delete(ids):
    found = lookup(ids)
    second = found[0][1].entry  # the span [8, 16)
    spans.SpanStore(store).delete(second.key, second.blocks[0])
    return found

  monkeypatch.setattr(engine, '_lookup', lookup_then_delete)
  out = engine.prefill(cases.IDS, deposit=False)
  assert out.found == cases.N - 1 and out.hit == cases.SPAN
  assert any('gone from every tier' in r for r in out.reasons)
  assert out.logits.tobytes() == cases.cold(m).tobytes()


def test_a_corrupted_span_is_not_grafted(tmp_path):
  m = cases.model('tiny')
  store = store_lib.BlockStore(tmp_path / 'store')
  cases.engine(m, store).prefill(cases.IDS)
  engine = cases.engine(m, store)
  engine.sync()
  first = engine.index.lookup(cases.IDS, cases.N)[0].entry  # the span [0, 8)
  block = pathlib.Path(store.root, '.prefix', 'spans', first.key, first.blocks[0])
  chunk = sorted(block.glob('k*/c.*'))[0]  # a chunk of keys
  data = bytearray(chunk.read_bytes())
  data[0] ^= 1
  chunk.write_bytes(bytes(data))
  out = engine.prefill(cases.IDS, deposit=False)
  assert out.hit == 0 and any('not used' in r for r in out.reasons)
  assert out.logits.tobytes() == cases.cold(m).tobytes()
