"""One process of the two-process test: prefills prompts through an engine over a shared store
and prints, per prompt, its hit and whether its logits equal a cold prefill's (JSON lines).

    python prefix_worker.py STORE_ROOT STORED_LENGTH[,STORED_LENGTH...]
"""

from graftjax import determinism

determinism.pin()

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import prefix_cases as cases

from graftjax import store as store_lib


def main(root: str, order: str) -> None:
  m = cases.model('tiny')
  engine = cases.engine(m, store_lib.BlockStore(root))
  for stored in (int(s) for s in order.split(',')):
    ids = cases.diverging(cases.IDS, stored)
    out = engine.prefill(ids)
    cold = cases.cold(m, ids, chunk_size=cases.CHUNK)
    equal = out.logits.tobytes() == cold.tobytes()
    print(json.dumps({'stored': stored, 'hit': out.hit, 'equal': equal}), flush=True)


if __name__ == '__main__':
  main(*sys.argv[1:])
