"""The store studies: catalog sync between machines, restores from an object store (with a local
S3 server), a block moved between machines, and the page sections of experiments/results/
store_sync and store_tier.
"""
