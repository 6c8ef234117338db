"""Domain types of the durable store and its FAISS indexes.

No protobuf here: `ragplane.server.conversions` translates between these and the API messages.
Vectors are float32 numpy arrays of shape [dim] (one) or [n, dim] (many).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class Metric(enum.StrEnum):
    COSINE = "cosine"  # vectors are L2-normalised on write and on query; score = cosine
    IP = "ip"  # score = inner product
    L2 = "l2"  # score = -squared euclidean distance (higher is better everywhere)


class Kind(enum.StrEnum):
    """What a stored collection is for. Each kind has its own names per tenant."""

    COLLECTION = "collection"  # a tenant's vector collection (IndexService)
    MEMORY = "memory"  # a memory namespace of a tenant (MemoryService)


class IndexType(enum.StrEnum):
    FLAT = "flat"
    HNSW = "hnsw"
    IVF_PQ = "ivf_pq"


class Quantization(enum.StrEnum):
    """How a flat or HNSW index holds its vectors; the store always keeps them as float32."""

    NONE = "none"  # float32: 4 bytes per dimension
    INT8 = "int8"  # FAISS's SQ8 scalar quantizer: 1 byte per dimension, rescored exactly


class SearchMode(enum.StrEnum):
    DENSE = "dense"  # nearest neighbours of the query vector
    LEXICAL = "lexical"  # BM25 over item text (SQLite FTS5)
    HYBRID = "hybrid"  # both, fused


class FusionMethod(enum.StrEnum):
    RRF = "rrf"  # reciprocal rank fusion: ranks only
    WEIGHTED = "weighted"  # weighted sum of min-max normalised scores


@dataclass(frozen=True)
class Fusion:
    """How a hybrid search combines its two rankings (see `ragplane.index.fusion`).

    `rrf_k` is RRF's rank constant (> 0); `dense_weight` in [0, 1] is the dense ranking's
    share in both methods (0.5 = plain RRF, or an even weighted sum). The default is the
    weighted sum: it beat RRF on held-out long documents over chunks and on the short
    passages of BENCHMARKS.md section 10 (Weaviate's default is the same kind of fusion)."""

    method: FusionMethod = FusionMethod.WEIGHTED
    rrf_k: int = 60
    dense_weight: float = 0.5


class FilterOp(enum.StrEnum):
    EQ = "eq"
    NE = "ne"
    IN = "in"
    NIN = "nin"
    GT = "gt"
    GTE = "gte"
    LT = "lt"
    LTE = "lte"
    EXISTS = "exists"


@dataclass(frozen=True)
class Condition:
    """`field` may be dotted ("author.name"). `value` is a JSON scalar, or a list for in/nin,
    or a bool (default True) for exists."""

    field: str
    op: FilterOp
    value: Any = None


@dataclass(frozen=True)
class Filter:
    """All `must` hold, at least one `should` holds when any is given, no `must_not` holds."""

    must: tuple[Condition, ...] = ()
    should: tuple[Condition, ...] = ()
    must_not: tuple[Condition, ...] = ()

    def is_empty(self) -> bool:
        return not (self.must or self.should or self.must_not)


class Splitter(enum.StrEnum):
    TEXT = "text"  # paragraphs, then sentences, then words
    MARKDOWN = "markdown"  # Markdown's structure first


@dataclass(frozen=True)
class Chunking:
    """How a collection splits item text longer than `max_tokens` before embedding.

    The store only keeps it; `ragplane.server.chunking` splits. `enabled` False (every
    collection made before chunking) keeps one vector per item, embedded truncated."""

    enabled: bool = False
    max_tokens: int = 0
    overlap_tokens: int = 0
    splitter: Splitter = Splitter.TEXT
    min_tokens: int = 0  # a chunk ends at the first boundary past it (<= max_tokens)


@dataclass(frozen=True)
class Span:
    """One chunk of an item as written: `text[start:end]` (offsets in code points) and its
    vector (float32 [dim])."""

    start: int
    end: int
    vector: np.ndarray


@dataclass(frozen=True)
class IndexParams:
    """Zero means "the default" for every field."""

    hnsw_m: int = 0
    hnsw_ef_construction: int = 0
    hnsw_ef_search: int = 0
    ivf_nlist: int = 0
    ivf_nprobe: int = 0
    pq_m: int = 0
    quantization: Quantization = Quantization.NONE

    def __post_init__(self) -> None:
        # from JSON (the store, the change log) it arrives as a plain string
        object.__setattr__(self, "quantization", Quantization(self.quantization))


@dataclass(frozen=True)
class SearchKnobs:
    """Per-request search parameters (the API's SearchParams); None = the collection's
    default. `validate.check_knobs` refuses those that do not apply to the collection."""

    ef_search: int | None = None  # HNSW: candidate list of the graph search
    nprobe: int | None = None  # IVF_PQ: inverted lists visited
    exact: bool = False  # brute force over the live items' stored float vectors
    oversampling: float | None = None  # lossy codes: top_k x this rescored exactly


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    tenant: str
    dim: int
    metric: Metric
    index_type: IndexType
    embedder: str  # name@version of the embedder whose vectors the collection holds
    generation: int
    count: int  # live items
    tombstones: int  # deleted or replaced vectors still in the index until a rebuild
    params: IndexParams
    created_at: float  # unix seconds
    lexical_index: bool = True  # keeps an FTS5 index of item text (LEXICAL / HYBRID search)
    chunking: Chunking = field(default_factory=Chunking)
    chunks: int = 0  # live vectors: one per chunk (count when no item was split)


@dataclass(frozen=True)
class Record:
    """An item as written or read. `vector` is float32 [dim]; may be None on reads that
    did not ask for vectors."""

    id: str
    vector: np.ndarray | None
    text: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # A text split into chunks: one Span per chunk (then `vector` is None). Empty: one row,
    # `vector`, covering the whole text.
    chunks: Sequence[Span] = ()


@dataclass(frozen=True)
class ChunkHit:
    """A passage of a hit: chunk `index` of the item, `text[start:end]` of its text."""

    index: int
    start: int
    end: int
    score: float
    text: str = ""


@dataclass(frozen=True)
class Hit:
    """`score` orders the hits (higher is better): the dense, lexical or fused score by mode.
    The three parts are None where the mode did not compute them."""

    id: str
    score: float  # higher is better for every metric
    text: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    dense: float | None = None  # similarity by the collection's metric
    lexical: float | None = None  # BM25, negated so higher is better; 0 = no query word
    fused: float | None = None  # hybrid only
    chunks: Sequence[ChunkHit] = ()  # the best chunks, best first (chunking collections)


@dataclass(frozen=True)
class HitGroup:
    """Hits sharing one value (`key`) of a search's group_by metadata field."""

    key: Any
    hits: Sequence[Hit]


@dataclass(frozen=True)
class SearchResult:
    hits: Sequence[Hit]
    returned_k: int
    exhaustive: bool  # exact result: flat index, or an exact scan of the filtered items
    groups: Sequence[HitGroup] = ()  # with group_by (then `hits` is empty)


@dataclass(frozen=True)
class Peer:
    """A server connected to a shared store now (`Follower.peers`)."""

    name: str  # how it names itself to the store, e.g. "ragplane host:pid"
    address: str  # where its connections come from ("local": a Unix socket)
    since: float  # its oldest open connection's start, unix seconds
    connections: int
    this: bool  # the server answering


@dataclass(frozen=True)
class Lease:
    """Once-only work of a shared store held now (a sweep, a rebuild), and by whom."""

    name: str  # e.g. "once/memory-sweep", "rebuild/<tenant>/<kind>/<collection>"
    holder: str  # the holding server's `Peer.name`
    since: float  # when the holder's transaction or statement started, unix seconds
