"""A knowledge-graph store behind the two calls DoG uses: get_relations and triple_filling."""

from knowtrace_train.kg_store.store import EndpointStore, GraphStore, KGStoreError

__all__ = ["EndpointStore", "GraphStore", "KGStoreError"]
