"""Sections of the results page, one module per study that declares it in its `study.toml`.

Each module's `render(results) -> markdown lines` reads the study's verified result files.
"""
