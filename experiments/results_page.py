"""Writes the results page, experiments/results/README.md, study by study.

    python experiments/results_page.py             # rewrite the page
    python experiments/results_page.py --check     # exit 1 if the committed page is stale

Every figure on the page is read from a result file after `ledger.verify_result`. Each
folder `experiments/results/<study>/` declares its section in `study.toml`
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
_CHECK = flags.DEFINE_bool('check', False, 'Only compare: exit 1 if the page on disk is stale.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  folder = pathlib.Path(_RESULTS_DIR.value)
  if _CHECK.value:
    path = folder / results_page.PAGE_NAME
    if not path.exists() or path.read_text() != results_page.page(folder):
      sys.exit(f'{path} is stale: run `{results_page.COMMAND}`')
    print(f'{path} is up to date')
    return
  print(f'wrote {results_page.write(folder)}')


if __name__ == '__main__':
  cli.run(main)
