"""The studies: the work of every experiments/*.py main, one folder per study.

Each experiments/*.py script is a thin absl main over one function of a study module; each
folder of experiments/results/ names, in its `study.toml`, the page section (a
`section_<folder>.py` module here) that renders its results on the results page.

  common/    what several studies share: flags (`cli`, `impl_flags`), the corpus, result
             files (`results`), timing, the run journal, the energy meter, device traces,
             and the results page (`results_page`).
  flywheel/  the flywheel experiment's harness (`harness`; the loop itself is
             `graftjax.flywheel.loop`), composition, router calibration, the answer bench.
  graft/     the exactness gate and its replay, graft against recompute speed and the
             restore floor; the exactness, graft_speed and scale sections.
  kernels/   kernel and tile benches, kernel determinism, invariance; their sections and
             invariance_cost's.
  model/     the model alone: speed, profile, agreement with references, KV bytes.
  paging/    paged context: page-in, route, recall and context benches, the scale and
             needle studies (and the scale study's `figures`), CPU attention paths, slot moves.
  position/  relocation, scheme agreement, the position sweep of small trained models
             (`training`), its findings and `plots`.
  store/     catalog sync, restores from an object store (a local S3 server), a block
             moved between machines.

Studies import the method (`graftjax`) and the models; the method never imports a study.
Import the module you need; no package here imports anything eagerly.
"""
