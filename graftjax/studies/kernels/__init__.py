"""The kernel studies: kernel and tile benches, kernel determinism, invariance (grafted equals
single-pass) and the page sections of experiments/results/kernel_determinism, invariance and
invariance_cost.
"""
