"""The verified-knowledge flywheel: tasks, verifiers, solve, deposit, route.

Submodules are imported on use (`from graftjax.flywheel import datasets`);
this package imports nothing eagerly.
"""
