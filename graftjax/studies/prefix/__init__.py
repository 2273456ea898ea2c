"""The prefix-reuse study: exact automatic prefix reuse on three workloads (few-shot GSM8K,
multi-turn conversations, a long document with many questions), and the page section of
experiments/results/prefix_reuse.
"""
