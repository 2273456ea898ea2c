"""Paged context: pages, a catalog of them, page-in against re-prefill."""
