"""The position study: relocating a block to another position (`relocation`, scheme agreement),
the position sweep of small trained models (`training`, `position_sweep`), its findings, and the
page section of experiments/results/relocation.
"""
