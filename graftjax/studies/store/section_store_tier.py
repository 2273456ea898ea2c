"""The results page on the `store_tier` study: restore from S3 against file and the GET floor."""

from __future__ import annotations

from typing import Any

from graftjax.studies.common import results_page as page

_HEADER = (
  'blocks',
  'MB',
  'objects',
  'S3 restore s',
  'file restore s',
  'floor s (raw GETs)',
  '**restore / floor** (paired)',
  'restore / floor (best)',
  'verified floor s',
  'restore / verified floor (paired)',
  'S3 / file',
  'get, new arrays s',
  'small files alone s',
  'hash, 1 thread s',
)


def _row(what: str, row: dict[str, Any]) -> list[str]:
  get = row.get('s3_get_new_arrays')
  return [
    what,
    f'{row["bytes"] / 1e6:,.1f}',
    f'{row["objects"]:,}',
    page.num(row['s3_restore']['best_s']),
    page.num(row['file_restore']['best_s']),
    page.num(row['floor']['best_s']),
    f'**{row["restore_over_floor_paired"]:.2f}x**',
    f'{row["restore_over_floor_best"]:.2f}x',
    page.num(row['verified_floor']['best_s']),
    f'{row["restore_over_verified_floor_paired"]:.2f}x',
    f'{row["s3_over_file_best"]:.1f}x',
    '-' if get is None else page.num(get['best_s']),
    page.num(row['small_files']['best_s']),
    page.num(row['hash_one_thread']['best_s']),
  ]


def render(results: list[page.Result]) -> list[str]:
  out = []
  for r in results:
    d, s, cfg = r.data, r.data['summary'], r.data['settings']
    rows = [_row(f'1 of {row["tokens"]:,} tokens', row) for row in d['rows']]
    if d.get('pages'):
      p = d['pages']
      rows.append(_row(f'{p["pages"]} pages of {p["page_tokens"]} tokens', p))
    goal = s['goal_restore_over_floor_at_most']
    met = {True: 'met', False: '**not met**', None: 'no size measured'}[s['goal_met_from_4k']]
    caption = (
      f'{page.cite(r)}: blocks of random {cfg["dtype"]} values shaped like {cfg["config"]}'
      f"'s cache. Restore = `graftjax.restore.read` (listing, manifest, zarr.json, every"
      f' chunk with its digest checked) into reused host staging; floor = the same objects'
      f' fetched by raw GETs straight from the server, all at once, at the same request'
      f' concurrency ({cfg["concurrency"]}); verified floor = the floor, each object copied'
      f' and hashed as it lands (what any verified read adds). Pages are restored one after'
      f' the other. Times: best of {cfg["repeats"]} rounds ({cfg["page_repeats"]} for the'
      f' pages) after a warm-up, each round timing every column once in turn; paired ratio:'
      f' the median over rounds of the two times of one round. Goal restore/floor (paired)'
      f' <= {goal}x from 4k tokens up: {met}.'
      f' Server: {d["server"]}; {d["timing"]}.'
    )
    out += [caption, '', *page.table(_HEADER, rows), '']
    sweep = d.get('concurrency_sweep') or []
    if sweep:
      intro = (
        f'The {sweep[0]["tokens"]:,}-token block again at other request concurrencies'
        ' (restore and floor each at that concurrency), same run:'
      )
      out += [
        intro,
        '',
        *page.table(
          ('concurrency', *_HEADER[1:]),
          [_row(str(row['concurrency']), row) for row in sweep],
        ),
        '',
      ]
  return out
