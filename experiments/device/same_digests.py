"""Whether two invariance results hold the same logits digests: python same_digests.py NEW COMMITTED."""

import json
import sys


def digests(result):
  return [
    (s['sha256_single_pass'], [c['sha256_rows'] for c in s['cells']]) for s in result['samples']
  ]


new, old = (json.load(open(p)) for p in sys.argv[1:3])
a, b = digests(new), digests(old)
print(
  'samples new',
  len(a),
  'committed',
  len(b),
  'INVARIANCE DIGESTS EQUAL' if a == b else 'DIGESTS DIFFER',
)
print(
  'cells byte-equal:',
  all(c['rows_byte_equal'] == c['rows'] for s in new['samples'] for c in s['cells']),
)
