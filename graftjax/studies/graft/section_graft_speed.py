"""The results page on the `graft_speed` study: Is grafting faster than recomputing the prefix?"""

from __future__ import annotations

from graftjax.studies.common import results_page as page

RESTORE_GOALS = (2.0, 1.5)  # restore within 2x of its floor, and within 1.5x


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
    ' read plus a pageable host-to-device copy. Rows before format 3 (all but the'
    ' `bench_graft_h200*.json` files) were read with SHA-256; `bench_graft_h200.json` is format 4'
    ' (one folder per array), `bench_graft_h200_run1.json` format 3. Each timed restore reads a'
    ' manifest the process parsed before (when the block was stored); "first read" is one more'
    " restore after `store.manifest.forget_parsed()`, as a block's first read in a process"
    ' (rows without it: the parse took about 0.7 ms at 1k tokens and 14 ms at 32k on the H200,'
    ' logs/restore_timeline_h200.txt).'
  )
  return [intro, ''] + page.table(header, rows)
