r"""Writes the portability fixture: a real-model block and the logits it must give.

    .venv/bin/python scripts/make_portable_block_fixture.py

Deposits the first 16 tokens of a fixed sentence (gemma-3-270m, float32,
prefilled in chunks of 8) into tests/fixtures/portable_store/ and records,
in tests/fixtures/portable_block.json, the block's key, the SHA-256 of its
stored files, and the SHA-256 of the float32 logits of the next 4 tokens
processed after grafting it. tests/graftjax/test_portability.py restores
the block on another machine of the same kind (CI) and requires the same
bytes.
"""

from graftjax import determinism

determinism.pin()

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import pathlib
import shutil

from graftjax import blocks
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.models.gemma import model as gemma_model

TEXT = 'The quick brown fox jumps over the lazy dog, and then the dog sleeps again while the fox runs.'
PREFIX, CONTINUATION, CHUNK, CAPACITY = 16, 4, 8, 32
FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures'


def grafted_logits(model, store, key, ids):
  cache = blocks.graft(model.init_cache(capacity=CAPACITY), store.get(key),
                       model_fingerprint=model.fingerprint, position_scheme=model.position_scheme)
  logits, _ = model.prefill(ids[PREFIX:PREFIX + CONTINUATION], cache=cache, chunk_size=CHUNK,
                            start_position=PREFIX, logits='all')
  return logits


def main():
  model = gemma_model.load('gemma3-270m')
  ids = model.tokenizer.encode(TEXT)
  _, cache = model.prefill(ids[:PREFIX], cache=model.init_cache(capacity=CAPACITY),
                           chunk_size=CHUNK, logits='none')
  block = blocks.capture(cache, blocks.Span(0, PREFIX), token_ids=ids[:PREFIX],
                         model_fingerprint=model.fingerprint,
                         position_scheme=model.position_scheme)
  root = FIXTURES / 'portable_store'
  shutil.rmtree(root, ignore_errors=True)
  store = store_lib.BlockStore(root)
  key = store.put(block)
  record = {
      'command': 'python scripts/make_portable_block_fixture.py',
      'text': TEXT, 'prefix_tokens': PREFIX, 'continuation_tokens': CONTINUATION,
      'chunk_size': CHUNK, 'capacity': CAPACITY, 'token_ids': ids[:PREFIX + CONTINUATION],
      'model_fingerprint': model.fingerprint, 'key': key,
      'block_tree_sha256': store_lib.digest_tree(root / key),
      'logits_sha256': ledger.sha256_array(grafted_logits(model, store, key, ids)),
      'determinism': determinism.record(),
  }
  (FIXTURES / 'portable_block.json').write_text(json.dumps(record, indent=1) + '\n')
  print(json.dumps({k: record[k] for k in ('key', 'block_tree_sha256', 'logits_sha256')}))


if __name__ == '__main__':
  main()
