"""Side by side: two bench_attention_tiles results of one machine, per Pallas candidate.

    python tiles_ab.py OUT BEFORE AFTER

reads OUT/bench_attention_tiles_h200_{BEFORE,AFTER}.json and prints each candidate's call time
in both and whether its output digest is the same.
"""

import json
import sys

out, labels = sys.argv[1], sys.argv[2:4]
rows = {}
for label in labels:
  with open(f'{out}/bench_attention_tiles_h200_{label}.json') as f:
    for r in json.load(f)['rows']:
      if r['impl'] == 'pallas' and 'device_s' in r:
        rows.setdefault((r['dtype'], r['phase'], r['S'], r['candidate']), {})[label] = r
for key, pair in rows.items():
  if len(pair) == 2:
    same = pair[labels[0]]['output_sha256'] == pair[labels[1]]['output_sha256']
    times = ', '.join(f'{x} {1e6 * pair[x]["device_s"]:.1f} us' for x in labels)
    print(*key, times, 'same bits' if same else 'BITS DIFFER')
