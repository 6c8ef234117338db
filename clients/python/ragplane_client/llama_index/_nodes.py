"""What RagplaneVectorStore sends and reads back, apart from any call: LlamaIndex nodes as
ragplane items, queries as search arguments, hits and items as nodes.

A node is stored as an item with id = node_id, text = its content (without metadata) and
vector = its embedding. Its metadata is LlamaIndex's `node_to_metadata_dict`: the node's own
metadata keys at the top level (so filters see them), `ref_doc_id` / `doc_id` /
`document_id`, `_node_type`, `_node_content` (the node as JSON, without text and
embedding: relationships, templates, and the metadata with its exact Python types), and
`_node_id` (so filters can name node ids). Nodes are rebuilt from `_node_content`; items
without it (written by other clients) come back as TextNodes of their text and metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import (
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from ragplane_client.llama_index.filters import to_filter
from ragplane_client.types import Hit, Item, SearchResult

NODE_ID_KEY = "_node_id"
REF_DOC_ID_KEY = "ref_doc_id"
# The server's largest top_k (ragplane.index.validate.MAX_TOP_K): one search reads at most
# this many items, which bounds get_nodes by filters alone.
MAX_TOP_K = 10_000
MODES = {
    VectorStoreQueryMode.DEFAULT: "dense",
    VectorStoreQueryMode.TEXT_SEARCH: "lexical",
    VectorStoreQueryMode.SPARSE: "lexical",
    VectorStoreQueryMode.HYBRID: "hybrid",
}


def to_item(node: BaseNode) -> dict[str, Any]:
    """The item of a node; raises ValueError when the node has no embedding."""
    if node.embedding is None:
        raise ValueError(
            f"node {node.node_id!r} has no embedding: RagplaneVectorStore stores the vectors "
            "LlamaIndex computes (set Settings.embed_model, or embed the nodes first)"
        )
    metadata = node_to_metadata_dict(node, remove_text=True, flat_metadata=False)
    metadata[NODE_ID_KEY] = node.node_id
    return {
        "id": node.node_id,
        "text": node.get_content(metadata_mode=MetadataMode.NONE),
        "vector": list(node.embedding),
        "metadata": metadata,
    }


def to_node(item: Item | Hit, embedding: Sequence[float] | None = None) -> BaseNode:
    metadata = dict(item.metadata or {})
    if "_node_content" in metadata:
        node = metadata_dict_to_node(metadata, text=item.text)
    else:
        metadata.pop(NODE_ID_KEY, None)
        node = TextNode(id_=item.id, text=item.text, metadata=metadata)
    if embedding is not None:
        node.embedding = [float(x) for x in embedding]
    return node


def nodes_of_items(items: Sequence[Item]) -> list[BaseNode]:
    return [to_node(it, it.vector) for it in items]


def query_result(res: SearchResult) -> VectorStoreQueryResult:
    """Hits as LlamaIndex's result; similarities are the hits' scores (cosine in default
    mode, BM25 in text search, the fused score in hybrid)."""
    return VectorStoreQueryResult(
        nodes=[to_node(h) for h in res.hits],
        similarities=[float(h.score) for h in res.hits],
        ids=[h.id for h in res.hits],
    )


@dataclass(frozen=True)
class Search:
    """One search: the query (text or vector) and the keyword options of Client.search."""

    query: str | list[float]
    options: dict[str, Any]


def plan_query(q: VectorStoreQuery, fusion: str) -> Search:
    """The search a VectorStoreQuery asks for. Raises ValueError for a mode ragplane does not
    serve (named), or a mode without the query it needs."""
    mode = MODES.get(VectorStoreQueryMode(q.mode))
    if mode is None:
        supported = ", ".join(m.value for m in MODES)
        raise ValueError(
            f"query mode {VectorStoreQueryMode(q.mode).value!r} is not supported by "
            f"RagplaneVectorStore; use one of {supported}"
        )
    flt = to_filter(q.filters, *_id_conditions(q))
    options: dict[str, Any] = {"mode": mode, "filter": flt}
    if mode == "dense":
        query: str | list[float] | None = (
            list(q.query_embedding) if q.query_embedding is not None else q.query_str
        )
        options["top_k"] = q.similarity_top_k
    else:
        query = q.query_str
        if mode == "lexical":
            options["top_k"] = q.sparse_top_k or q.similarity_top_k
        else:
            options["top_k"] = q.hybrid_top_k or q.similarity_top_k
            options["fusion"] = fusion
            if q.alpha is not None:
                options["dense_weight"] = float(q.alpha)
    if query is None or (isinstance(query, str) and not query.strip()):
        needs = "query_embedding or query_str" if mode == "dense" else "query_str"
        raise ValueError(f"a {VectorStoreQueryMode(q.mode).value} query needs {needs}")
    return Search(query, options)


def _id_conditions(q: VectorStoreQuery) -> list[dict[str, Any]]:
    out = []
    if q.doc_ids:
        out.append({"field": REF_DOC_ID_KEY, "op": "in", "value": list(q.doc_ids)})
    if q.node_ids:
        out.append({"field": NODE_ID_KEY, "op": "in", "value": list(q.node_ids)})
    return out


def scan(
    dim: int, count: int, flt: dict[str, Any] | None, node_ids: Sequence[str] | None
) -> Search | None:
    """The search that lists the ids of every item matching `flt` (and among `node_ids`):
    a dense search with any probe vector, as deep as the collection (the server fills top_k
    whenever enough items match the filter; see `scanned_ids`). None when nothing can
    match."""
    k = min(count, len(node_ids)) if node_ids is not None else count
    if k == 0:
        return None
    probe = [1.0] + [0.0] * (dim - 1)
    options = {"top_k": min(k, MAX_TOP_K), "mode": "dense", "filter": flt,
               "include_text": False, "include_metadata": False}  # fmt: skip
    return Search(probe, options)


def scanned_ids(res: SearchResult, count: int) -> list[str]:
    """The ids a `scan` found; raises ValueError when it may have missed some (a full
    result of the server's largest top_k from a larger collection)."""
    if len(res.hits) >= MAX_TOP_K and count > MAX_TOP_K:
        raise ValueError(
            f"get_nodes by filters reads at most {MAX_TOP_K} nodes and more match in a "
            f"collection of {count}; narrow the filters or pass node_ids"
        )
    return [h.id for h in res.hits]


def id_filter(node_ids: Sequence[str] | None, filters: Any) -> dict[str, Any] | None:
    """`filters` narrowed to `node_ids` (when given)."""
    extra = [{"field": NODE_ID_KEY, "op": "in", "value": list(node_ids)}] if node_ids else []
    return to_filter(filters, *extra)
