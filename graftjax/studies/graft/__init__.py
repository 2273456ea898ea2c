"""The graft itself: the exactness gate and its replay, graft against recompute speed (with the
restore floor), and the page sections of experiments/results/exactness, graft_speed and scale.
"""
