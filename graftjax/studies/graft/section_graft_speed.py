"""The results page on the `graft_speed` study: Is grafting faster than recomputing the prefix?"""

from __future__ import annotations

from graftjax.studies.common import results_page as page

RESTORE_GOALS = (2.0, 1.3)  # restore within 2x of its floor, and within 1.3x
# The stages of rows that record them (`bench_graft.restore_stages`), in milliseconds.
STAGES = (
  ('floor_read', 'floor: read'),
  ('floor_copy', 'floor: copy'),
  ('hash', 'hash (all cores)'),
  ('verified_read', 'verified read'),
  ('restore_read', 'restore: read'),
  ('restore_copy_dispatch', 'of it, copies dispatched'),
  ('restore_install', 'restore: install'),
)

# Rows timed side by side (`restore_floor.side_by_side`): medians, in milliseconds.
SIDE_BY_SIDE = (
  ('floor_read', 'floor: read'),
  ('floor_read_one_thread', 'floor: read, one thread'),
  ('floor_copy', 'floor: copy'),
  ('floor_hash_one_thread', 'hash on one core'),
  ('floor_verified_read', 'verified read'),
  ('restore_read', 'restore: read'),
  ('restore_install', 'restore: install'),
  ('floor', 'floor'),
  ('restore', 'restore'),
)


def render(results: list[page.Result]) -> list[str]:
  rows = []
  for r in results:
    for row in r.data['rows']:
      recompute = row.get('recompute_first_token_s')
      lc = row.get('llamacpp_restore_first_token_s')
      rows.append(
        [
          page.cite(r),
          r.device.split(',')[0],
          f'{row["prefix_tokens"]:,}',
          f'{row["graft_first_token_s"]:.3f}',
          f'{recompute:.3f}' if recompute is not None else 'not run',
          f'{row["speedup"]:.2f}' if row.get('speedup') is not None else '-',
          page.yes(row['graft_logits_equal_recompute'])
          if row.get('graft_logits_equal_recompute') is not None
          else '-',
          row.get('floor', {}).get('digest', 'sha256'),
          f'{row["restore_s"]:.3f}',
          f'{row["restore_over_floor"]:.2f}',
          *(page.yes(row['restore_over_floor'] <= goal) for goal in RESTORE_GOALS),
          f'{row["restore_over_verified_floor"]:.2f}' if 'floor' in row else '-',
          f'{row["restore_first_read_over_floor"]:.2f}'
          if 'restore_first_read_over_floor' in row
          else '-',
          f'{lc:.3f}' if lc is not None else '-',
        ]
      )
  header = (
    'file',
    'device',
    'prefix tokens',
    'graft: first token s',
    'recompute: first token s',
    'speedup',
    'logits byte-equal',
    'hash',
    'restore s',
    'restore / floor',
    *(f'within {goal:g}x' for goal in RESTORE_GOALS),
    'restore / verified floor',
    'first read / floor',
    'llama.cpp restore + first token s',
  )
  intro = (
    'Time to the first token after reading a block (every byte checked against its digest:'
    ' SHA-256 in store format 2, BLAKE3 in formats 3 and 4) and grafting it, against a prefill'
    " of the same prefix; float32. The restore floor: the block's files read into touched host memory"
    ' (the fastest of one and of all threads, in pieces or one read per file) plus the copy into'
    ' the device (from pinned host memory on a GPU, a memcpy on CPU); the verified floor also'
    " hashes every byte with its format's hash, as a restore must (docs/store_format.md,"
    ' "Restoring into a cache"). Files without a verified floor used the old one: a one-thread'
    ' read plus a pageable host-to-device copy. "hash" names the hash of the chunk digests'
    ' (files that record none were read in format 2, SHA-256). Each timed restore reads a'
    ' manifest the process parsed before (when the block was stored); "first read" is one more'
    " restore after `store.manifest.forget_parsed()`, as a block's first read in a process"
    ' (rows without it: the parse took about 0.7 ms at 1k tokens and 14 ms at 32k on the H200,'
    ' logs/restore_timeline_h200.txt).'
  )
  staged = [(r, row) for r in results for row in r.data['rows'] if 'stages_s' in row]
  if not staged:
    return [intro, ''] + page.table(header, rows)
  paired = [(r, row) for r, row in staged if 'side_by_side' in row]
  return [
    intro,
    '',
    *page.table(header, rows),
    '',
    *_stages(staged),
    *(['', *_side_by_side(paired)] if paired else []),
  ]


def _stages(staged) -> list[str]:
  """Rows that record their stages: the graft against the fastest recompute, the block's
  bytes, the restore over its floor, and each stage of both."""
  rows = []
  for r, row in staged:
    recompute, mfu = row.get('recompute_first_token_s'), row.get('mfu')
    rows.append(
      [
        page.cite(r),
        r.device.split(',')[0],
        f'{row["prefix_tokens"]:,}',
        f'{row["graft_over_recompute"]:.3f}' if recompute is not None else 'not run',
        row.get('recompute_chunk_size') or '-',
        page.num(row.get('prefill_tokens_per_s')),
        '-' if mfu is None else page.pct(mfu),
        f'{row["block_bytes"] / 1e6:,.1f}',
        *(f'{1e3 * row["stages_s"][name]:.2f}' for name, _ in STAGES),
        f'{row["restore_over_floor"]:.2f}',
        f'{row["restore_best_over_floor"]:.2f}',
      ]
    )
  header = (
    'file',
    'device',
    'prefix tokens',
    'graft / recompute: first token',
    'recompute chunk',
    'recompute tokens/s',
    'MFU',
    'block MB',
    *(f'{label} ms' for _, label in STAGES),
    'restore / floor',
    'best restore / floor',
  )
  intro = (
    'The same runs by stage. The recompute is the fastest of the chunk sizes the file names'
    ' (`recompute_sweep`; the chunk is the whole prefix where it equals the prefix), with its'
    ' prefill rate and model-FLOP utilization against the dense bfloat16 peak (model FLOPs'
    ' counted from the config, `graftjax/studies/graft/prefill_flops.py`; none on CPU). The floor:'
    ' read (the files into touched memory) + copy (into the device); hash: every chunk hashed'
    ' as a restore hashes it (BLAKE3 on all cores), and the verified read the read with it.'
    ' The restore: read (every chunk read and verified into staging, the copies of verified'
    ' layers dispatched meanwhile) and install (checks, the copies left, the write into the'
    ' cache), medians of the timed restores. "best restore / floor" takes the fastest restore,'
    ' as the floor takes the fastest of its runs (on a CPU of few cores shared with other'
    ' work, medians move with that work).'
  )
  return [intro, '', *page.table(header, rows)]


def _side_by_side(paired) -> list[str]:
  """Rows whose floor and restore were timed in turns: the medians of each stage, the restore
  over its floor, and the read and install over the floor's read and copy."""
  rows = []
  for r, row in paired:
    median = row['side_by_side']['median_s']
    ratio = row['side_by_side']['restore_over_floor']
    read = min(median['floor_read'], median['floor_read_one_thread'])
    rows.append(
      [
        page.cite(r),
        r.device.split(',')[0],
        f'{row["prefix_tokens"]:,}',
        row['side_by_side']['rounds'],
        *(f'{1e3 * median[name]:.2f}' for name, _ in SIDE_BY_SIDE),
        f'{ratio:.2f}',
        *(page.yes(ratio <= goal) for goal in RESTORE_GOALS),
        f'{median["restore_read"] / read:.2f}',
        f'{median["restore_install"] / median["floor_copy"]:.2f}',
        f'{median["floor_hash_one_thread"] / median["floor"]:.2f}',
      ]
    )
  header = (
    'file',
    'device',
    'prefix tokens',
    'rounds',
    *(f'{label} ms' for _, label in SIDE_BY_SIDE),
    'restore / floor',
    *(f'within {goal:g}x' for goal in RESTORE_GOALS),
    'restore read / floor read',
    'install / floor copy',
    'one-core hash / floor',
  )
  intro = (
    'The same blocks with the floor and the restore timed in turns (`restore_floor.side_by_side`):'
    ' each round times every floor stage once and one restore (a new cache made untimed), the'
    ' order alternating; medians per stage. Floor = the faster read (all threads or one) + copy,'
    ' round by round. "one-core hash / floor" is what hashing every byte costs one core against'
    ' the whole floor: where the cores are busy with other work, a verified restore cannot come'
    ' nearer its floor than 1 plus that.'
  )
  return [intro, '', *page.table(header, rows)]
