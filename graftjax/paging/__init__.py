"""Paged context (issue 13): pages, a catalog of them, page-in against re-prefill."""
