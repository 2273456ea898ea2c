r"""Writes the portability fixture: a real-model block and the logits it gives.

    .venv/bin/python scripts/make_portable_block_fixture.py            # add this CPU kind
    .venv/bin/python scripts/make_portable_block_fixture.py --rewrite_block
    .venv/bin/python scripts/make_portable_block_fixture.py --rewrite_manifest

The block: the first 16 tokens of a fixed sentence (gemma-3-270m, float32,
prefilled in chunks of 8), deposited in tests/fixtures/portable_store/;
tests/fixtures/portable_block.json records its key and the SHA-256 of its
stored files. With --rewrite_block the block is computed again on this
machine and every logits recording is dropped. With --rewrite_manifest only
the block's manifest (and so its key) and file names are written again, in
the current block layout and store format, from the committed arrays: every
chunk file keeps its bytes (under its new name), and so do the logits
recordings. It needs no model.

The logits: the float32 logits of the next 4 tokens processed after grafting
the committed block. XLA's CPU code picks its kernels from the processor, so
their bits are a function of the block, the code, the jax version and the
kind of CPU (`determinism.cpu_kind()`). The script adds (or replaces) the
recording for this machine's CPU kind and jax version;
tests/graftjax/store/test_portability.py grafts the same block on another machine
and requires the bytes recorded for its kind.
"""

from graftjax import determinism

determinism.pin()

import json
import pathlib
import shutil

from absl import app
from absl import flags

from graftjax import blocks
from graftjax import ledger
from graftjax import store as store_lib
from graftjax.models.gemma import model as gemma_model

_REWRITE_BLOCK = flags.DEFINE_bool(
  'rewrite_block',
  False,
  'Compute and deposit the block again on this machine (drops every'
  ' logits recording); by default the committed block is kept.',
)
_REWRITE_MANIFEST = flags.DEFINE_bool(
  'rewrite_manifest',
  False,
  "Write only the committed block's manifest and file names again, in the current layout"
  ' and store format, from its committed arrays (their bytes and the logits recordings'
  ' are kept).',
)

TEXT = (
  'The quick brown fox jumps over the lazy dog, and then the dog sleeps again while the fox runs.'
)
PREFIX, CONTINUATION, CHUNK, CAPACITY = 16, 4, 8, 32
FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'tests' / 'fixtures'
RECORD_PATH = FIXTURES / 'portable_block.json'
STORE_ROOT = FIXTURES / 'portable_store'


def grafted_logits(model, block, ids):
  """float32 [CONTINUATION, vocab] logits after grafting `block` at position 0."""
  cache = blocks.graft(
    model.init_cache(capacity=CAPACITY),
    block,
    target=model.graft_target,
    chunk_size=CHUNK,
    allow_other_shape=block.meta.chunk_size == 0,  # a block of layout 2 records none: CHUNK
  )
  logits, _ = model.prefill(
    ids[PREFIX : PREFIX + CONTINUATION],
    cache=cache,
    chunk_size=CHUNK,
    start_position=PREFIX,
    logits='all',
  )
  return logits


def deposit_block(model, ids) -> dict:
  """Prefills the prefix here, stores its block afresh; returns the block fields."""
  _, cache = model.prefill(
    ids[:PREFIX], cache=model.init_cache(capacity=CAPACITY), chunk_size=CHUNK, logits='none'
  )
  block = blocks.capture(
    cache,
    blocks.Span(0, PREFIX),
    token_ids=ids[:PREFIX],
    target=model.graft_target,
    chunk_size=CHUNK,
  )
  shutil.rmtree(STORE_ROOT, ignore_errors=True)
  key = store_lib.BlockStore(STORE_ROOT).put(block)
  return {
    'command': 'python scripts/make_portable_block_fixture.py --rewrite_block',
    'text': TEXT,
    'prefix_tokens': PREFIX,
    'continuation_tokens': CONTINUATION,
    'chunk_size': CHUNK,
    'capacity': CAPACITY,
    'token_ids': ids[: PREFIX + CONTINUATION],
    'model_fingerprint': model.fingerprint,
    'key': key,
    'block_tree_sha256': store_lib.digest_tree(STORE_ROOT / key),
    'block_written_on': determinism.record(),
    'logits_by_cpu_kind': [],
  }


def rewrite_manifest() -> dict:
  """The committed block under its current-layout key and format; every chunk's bytes kept.

  Reads the arrays with tensorstore, stores them again with the metadata the
  block was computed under (batch 1, segment 0, the record's capacity), and
  refuses unless every chunk file is byte-identical to the old one of its array
  and index, and every zarr.json the same but for its chunk keys.
  """
  import tensorstore as ts

  record = json.loads(RECORD_PATH.read_text())
  old_dir = STORE_ROOT / record['key']
  old_meta = json.loads((old_dir / store_lib.MANIFEST).read_text())['meta']
  arrays = {
    name: ts.open(
      {'driver': 'zarr3', 'kvstore': f'file://{old_dir / name}/', 'fill_missing_data_reads': False}
    )
    .result()
    .read()
    .result()
    for name in store_lib.ARRAY_NAMES
  }
  meta = blocks.BlockMeta(
    **{
      **old_meta,
      'token_ids': tuple(old_meta['token_ids']),
      'capacity': record['capacity'],
      'batch_size': 1,
      'segment': 0,
      'chunk_size': record['chunk_size'],
      'layout_version': blocks.LAYOUT_VERSION,
    }
  )
  staging = STORE_ROOT.parent / 'portable_store.rewrite'
  shutil.rmtree(staging, ignore_errors=True)
  key = store_lib.BlockStore(staging).put(blocks.KVBlock(meta=meta, **arrays))
  new_dir = staging / key
  old_files = _files_by_chunk(old_dir)
  new_files = _files_by_chunk(new_dir)
  if old_files.keys() != new_files.keys():
    raise ValueError(f'the rewritten block has other files: {old_files} != {new_files}')
  changed = [
    str(old_files[f])
    for f in old_files
    if f != store_lib.MANIFEST
    and _comparable(old_dir / old_files[f]) != _comparable(new_dir / new_files[f])
  ]
  if changed:
    raise ValueError(
      f'rewriting the manifest would change array files {changed}; kept as they were'
    )
  shutil.rmtree(old_dir)
  shutil.move(new_dir, STORE_ROOT / key)
  shutil.rmtree(staging)
  record['key'] = key
  record['block_tree_sha256'] = store_lib.digest_tree(STORE_ROOT / key)
  record['manifest_command'] = 'python scripts/make_portable_block_fixture.py --rewrite_manifest'
  return record


def _files_by_chunk(block_dir: pathlib.Path) -> dict[str, pathlib.Path]:
  """A block's files by what they hold ('k/c 3' for chunk 3 of k, whatever separates its
  key's parts), as paths relative to `block_dir`."""
  files = {}
  for path in block_dir.rglob('*'):
    if path.is_file():
      relative = path.relative_to(block_dir)
      name, rest = relative.parts[0], '/'.join(relative.parts[1:])
      chunk = rest.replace('.', '/').split('/') if rest.startswith('c') else None
      files[f'{name}/c {chunk[1]}' if chunk else str(relative)] = relative
  return files


def _comparable(path: pathlib.Path) -> bytes:
  """A file's bytes; a zarr.json's without its chunk key encoding."""
  if path.name != 'zarr.json':
    return path.read_bytes()
  metadata = json.loads(path.read_text())
  metadata.pop('chunk_key_encoding')
  return json.dumps(metadata, sort_keys=True).encode()


def main(argv):
  del argv
  if _REWRITE_MANIFEST.value:
    if _REWRITE_BLOCK.value:
      raise app.UsageError('--rewrite_manifest and --rewrite_block exclude each other')
    record = rewrite_manifest()
    RECORD_PATH.write_text(json.dumps(record, indent=1) + '\n')
    print(json.dumps({'key': record['key'], 'block_tree_sha256': record['block_tree_sha256']}))
    return
  model = gemma_model.load('gemma3-270m')
  ids = model.tokenizer.encode(TEXT)
  if _REWRITE_BLOCK.value:
    record = deposit_block(model, ids)
  else:
    record = json.loads(RECORD_PATH.read_text())
    if (
      record['model_fingerprint'] != model.fingerprint
      or record['token_ids'] != ids[: PREFIX + CONTINUATION]
    ):
      raise ValueError(
        'the committed block is for other weights or tokens; run with --rewrite_block'
      )
  block = store_lib.BlockStore(STORE_ROOT).get(record['key'])
  logits = grafted_logits(model, block, ids)
  here = determinism.record()
  recording = {
    'command': 'python scripts/make_portable_block_fixture.py',
    **{field: here[field] for field in determinism.CPU_BITS_FIELDS},
    'logits_sha256': ledger.sha256_array(logits),
    'determinism': here,
  }
  record['logits_by_cpu_kind'] = [
    r
    for r in record['logits_by_cpu_kind']
    if any(r.get(field) != recording[field] for field in determinism.CPU_BITS_FIELDS)
  ] + [recording]
  RECORD_PATH.write_text(json.dumps(record, indent=1) + '\n')
  print(
    json.dumps(
      {
        'key': record['key'],
        'block_tree_sha256': record['block_tree_sha256'],
        'cpu_kind': recording['cpu_kind'],
        'logits_sha256': recording['logits_sha256'],
      }
    )
  )


if __name__ == '__main__':
  app.run(main)
