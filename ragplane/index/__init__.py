"""Durable vector collections: SQLite store + FAISS indexes, filters, generations, rebuilds."""

from ragplane.index.engine import Engine
from ragplane.index.progress import RebuildProgress
from ragplane.index.types import (
    CollectionInfo,
    Condition,
    Filter,
    FilterOp,
    Hit,
    IndexParams,
    IndexType,
    Kind,
    Metric,
    Quantization,
    Record,
    SearchKnobs,
    SearchResult,
)

__all__ = [
    "CollectionInfo",
    "Condition",
    "Engine",
    "Filter",
    "FilterOp",
    "Hit",
    "IndexParams",
    "IndexType",
    "Kind",
    "Metric",
    "Quantization",
    "Record",
    "RebuildProgress",
    "SearchKnobs",
    "SearchResult",
]
