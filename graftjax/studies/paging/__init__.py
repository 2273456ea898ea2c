"""The paging study: paged-context benches (page-in, route, recall, context), the store-size
scale study, the needle study, CPU attention paths, slot moves, and the page section of
experiments/results/paging.
"""
