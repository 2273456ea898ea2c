r"""Markdown summary of committed relocation and training results (numbers only from the files).

    python experiments/position_findings.py \
        --relocation=experiments/results/relocation/relocation_270m_rope.json \
        --relocation=experiments/results/relocation/relocation_small_alibi.json \
        --training=experiments/results/relocation/small_alibi_model.json \
        --out=experiments/results/relocation/position_findings_tables.md

Every file is checked against its own `result_sha256` (`ledger.verify_result`)
before a number is read, and each section cites that digest. Relocation
results: per scheme, dtype and offset, the relocated graft, the graft-free
control and the own-position graft against fresh(M) (byte-equal count, KL
mean/max in float64 nats, max |Δlogit|, argmax flips), then composition.
Training results (`model.json` of experiments/train_small.py, or the
training record inside a relocation result): held-out loss.
"""

import pathlib
import sys

from absl import app
from absl import flags

from graftjax.studies.common import cli
from graftjax.studies.position import position_findings

_RELOCATION = flags.DEFINE_multi_string('relocation', [], 'Relocation result JSON (repeat).')
_TRAINING = flags.DEFINE_multi_string('training', [], 'Trained model.json (repeat).')
_OUT = flags.DEFINE_string('out', None, 'Markdown file to write (default: standard output).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not _RELOCATION.value and not _TRAINING.value:
    raise app.UsageError('give at least one --relocation or --training file')
  text = (
    position_findings.findings(relocation_paths=_RELOCATION.value, training_paths=_TRAINING.value)
    + '\n'
  )
  if _OUT.value:
    pathlib.Path(_OUT.value).write_text(text)
    print(f'wrote {_OUT.value}')
  else:
    sys.stdout.write(text)


if __name__ == '__main__':
  cli.run(main)
