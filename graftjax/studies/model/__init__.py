"""The model on its own: speed (`bench_model`) and profile, agreement with independent
references, KV bytes per token, and the page sections of experiments/results/cpu_speed,
profile, reference_agreement and kv_bytes.
"""
