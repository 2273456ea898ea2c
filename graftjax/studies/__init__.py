"""The harness that supports experiments: gate arms, replay, invariance, relocation
arms, position sweep, training of small models, plots, corpus, timing and flags,
and the work of every experiments/*.py script (each script is a thin absl main
over one function here: `graft_gate.experiment`, `invariance.experiment`,
`position_sweep.experiment`, `training.train_and_save`, `bench_graft`,
`bench_model`, `bench_kernels`, `bench_attention_tiles`, `kernel_determinism`,
`reference_agreement`, `scheme_agreement`, `position_findings`).

Studies import the method (`graftjax`) and the models; the method never imports
a study. Import the module you need; this package imports nothing eagerly.
"""
