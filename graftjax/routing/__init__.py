"""Routing a query to stored blocks or pages: the flywheel's library and the paging catalog
route through these routers alike.

`route`: the `Router` interface, exact, BM25 and embedding routers, router files, threshold
calibration. `units`: routing units of one size (`UnitRouter`) and their hybrid with the
model's own embedding and rerank (`HybridRouter`). Submodules are imported on use; this
package imports nothing eagerly.
"""
