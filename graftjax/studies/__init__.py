"""The harness that supports experiments: gate arms, replay, invariance, relocation
arms, position sweep, training of small models, plots, corpus, timing and flags.

Studies import the method (`graftjax`) and the models; the method never imports
a study. Import the module you need; this package imports nothing eagerly.
"""
