"""Writes the results pages: the index, experiments/results/README.md, and one page per study,
experiments/results/<study>/README.md.

    python experiments/results_page.py             # rewrite the pages
    python experiments/results_page.py --check     # exit 1 if a committed page is stale

Every figure on a page is read from a result file after `ledger.verify_result`. Each
folder `experiments/results/<study>/` declares its page in `study.toml`
(`graftjax.studies.common.results_page` says how); adding a study edits nothing here.
"""

import pathlib
import sys

from absl import app
from absl import flags

from graftjax.studies.common import cli
from graftjax.studies.common import results_page

RESULTS = pathlib.Path(__file__).resolve().parent / 'results'

_RESULTS_DIR = flags.DEFINE_string('results_dir', str(RESULTS), 'Folder of study folders.')
_CHECK = flags.DEFINE_bool('check', False, 'Only compare: exit 1 if a page on disk is stale.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  folder = pathlib.Path(_RESULTS_DIR.value)
  if _CHECK.value:
    if stale := results_page.stale(folder):
      sys.exit(f'{", ".join(map(str, stale))} stale: run `{results_page.COMMAND}`')
    print(f'the pages under {folder} are up to date')
    return
  for path in results_page.write(folder):
    print(f'wrote {path}')


if __name__ == '__main__':
  cli.run(main)
