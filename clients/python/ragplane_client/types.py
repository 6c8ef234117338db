"""What the client takes and returns: small frozen dataclasses of plain Python values.

Metadata is a plain dict of JSON values (str, numbers, bools, None, lists, dicts); numbers
that are whole come back as int (protobuf's Struct keeps every number as a double).
Scores are floats, higher is better in every mode and metric.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

Mode = Literal["dense", "lexical", "hybrid"]
FusionName = Literal["weighted", "rrf"]
MetricName = Literal["cosine", "ip", "l2"]
IndexTypeName = Literal["flat", "hnsw", "ivf_pq"]
QuantizationName = Literal["none", "int8"]
SplitterName = Literal["text", "markdown"]


@dataclass(frozen=True)
class Item:
    """One item of a collection. Without `vector`, the server embeds `text` (chunked
    when longer than the collection's window). `vector` comes back from `get` only with
    `include_vectors=True`."""

    id: str
    text: str = ""
    vector: Sequence[float] | None = None
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Chunking:
    """How a collection splits long item text (see CreateCollectionRequest.chunking).
    `max_tokens` 0 = the embedder's window; `overlap_tokens` None = max_tokens / 8."""

    enabled: bool = True
    max_tokens: int = 0
    overlap_tokens: int | None = None
    splitter: SplitterName = "text"


@dataclass(frozen=True)
class IndexParams:
    """Index parameters; 0 = the server's default (see index.proto). `quantization`
    ("none" or "int8", flat and hnsw only): int8 keeps 1 byte per dimension in memory
    instead of 4 and rescores candidates with the float vectors."""

    hnsw_m: int = 0
    hnsw_ef_construction: int = 0
    hnsw_ef_search: int = 0
    ivf_nlist: int = 0
    ivf_nprobe: int = 0
    pq_m: int = 0
    quantization: QuantizationName = "none"


@dataclass(frozen=True)
class SearchParams:
    """Per-request search parameters (`search(..., params=...)`); None = the collection's
    default. ef_search: HNSW candidate list (recall vs speed); nprobe: IVF_PQ lists
    visited; exact: brute force over the live items; oversampling: quantized and IVF_PQ
    collections rescore top_k x oversampling candidates with the float vectors."""

    ef_search: int | None = None
    nprobe: int | None = None
    exact: bool = False
    oversampling: float | None = None


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    count: int  # live items
    chunks: int  # live vectors: equal to count when no item was split
    dim: int
    metric: MetricName
    index_type: IndexTypeName
    embedder: str  # name@version of the embedder whose vectors it holds
    generation: int
    tombstones: int
    lexical_index: bool
    chunking: Chunking
    params: IndexParams
    created_at: float  # unix seconds
    # The position the reply reflects (a PostgreSQL store; "" with the embedded one): pass
    # it as a read's consistency_token to read this state on any server of the cluster.
    consistency_token: str = ""


@dataclass(frozen=True)
class Chunk:
    """A passage of a hit's item: `text[start:end]` of the item's text (offsets in code
    points), its position `index` in the item, its score on the hit's scale, and its text
    when the search asked for text."""

    index: int
    start: int
    end: int
    score: float
    text: str = ""


@dataclass(frozen=True)
class Hit:
    """A search hit: an item, ranked by `score` (the dense, lexical or fused score by
    mode). Each of the three scores is None where the mode did not compute it."""

    id: str
    score: float
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    dense_score: float | None = None
    lexical_score: float | None = None
    fused_score: float | None = None
    chunks: tuple[Chunk, ...] = ()


@dataclass(frozen=True)
class HitGroup:
    """Hits sharing the value `key` of the search's `group_by` field, best first."""

    key: Any
    hits: tuple[Hit, ...]


@dataclass(frozen=True)
class SearchResult:
    """Hits best first (or, with group_by, `groups` and no hits). Iterating it, and len(),
    go over `hits`."""

    hits: tuple[Hit, ...]
    groups: tuple[HitGroup, ...] = ()
    returned_k: int = 0
    exhaustive: bool = False  # an exact result (flat index, exact scan, lexical)
    embedder: str = ""  # name@version that embedded the query text

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)


@dataclass(frozen=True)
class UpsertResult:
    """Totals over every batch of one `upsert` call."""

    upserted: int
    chunks: int
    truncated: int  # texts embedded truncated (collections with chunking off)
    embedder: str  # name@version that embedded items sent without a vector
    batches: int
    # The last batch's token (a PostgreSQL store; "" with the embedded one): a read that
    # passes it as consistency_token sees every batch, on any server of the cluster.
    consistency_token: str = ""


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]
    dim: int
    model: str
    embedder: str  # name@version
    token_counts: list[int]


@dataclass(frozen=True)
class EmbedderInfo:
    model: str
    dim: int
    max_seq_length: int
    embedder: str
    device: str
    max_batch_texts: int
    max_text_bytes: int


@dataclass(frozen=True)
class ScoreParts:
    relevance: float
    recency: float
    importance: float
    dense: float | None = None
    lexical: float | None = None
    fused: float | None = None


@dataclass(frozen=True)
class Memory:
    id: str
    namespace: str
    text: str
    metadata: dict[str, Any]
    importance: float
    created_at: float
    updated_at: float
    expires_at: float  # 0 = never
    score: float = 0.0  # recall only
    parts: ScoreParts | None = None  # recall only


@dataclass(frozen=True)
class Remembered:
    id: str
    deduplicated: bool  # an existing near-identical memory was updated instead
    consistency_token: str = ""  # for a later read (recall, list_memories) on any server


@dataclass(frozen=True)
class MemoryPage:
    memories: tuple[Memory, ...]
    next_page_token: str  # "" on the last page


class SearchOptions(TypedDict, total=False):
    """Keyword options of `search` (all optional). `fusion`, `rrf_k` and `dense_weight`
    apply to hybrid mode; `group_size` and `group_limit` to `group_by`."""

    top_k: int
    mode: Mode
    filter: Any
    include_text: bool
    include_metadata: bool
    fusion: FusionName
    rrf_k: int
    dense_weight: float
    chunks_per_hit: int
    group_by: str
    group_size: int
    group_limit: int
    params: SearchParams | Mapping[str, Any]
    timeout: float
    consistency_token: str


class RecallOptions(TypedDict, total=False):
    top_k: int
    mode: Mode
    filter: Any
    fusion: FusionName
    rrf_k: int
    dense_weight: float
    timeout: float
    consistency_token: str


class CollectionOptions(TypedDict, total=False):
    """Keyword options of `create_collection`: `chunking` False turns it off, True or a
    dict / Chunking sets it; `params` a dict / IndexParams; `dim` 0 = the embedder's."""

    metric: MetricName
    index_type: IndexTypeName
    dim: int
    params: IndexParams | Mapping[str, int]
    lexical_index: bool
    chunking: bool | Chunking | Mapping[str, Any]
    timeout: float
