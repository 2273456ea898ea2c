"""The flywheel study: the harness of experiments/flywheel.py (`harness`: tasks by name, routers,
progress bars, journal, result), composition of routed blocks (`compose`), router calibration,
the answer bench, and the page sections of experiments/results/flywheel and flywheel_compose.
The loop itself is method: `graftjax.flywheel.loop`.
"""
