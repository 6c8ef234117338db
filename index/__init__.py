"""Durable vector collections: SQLite store + FAISS indexes, filters, generations, rebuilds."""

from index.engine import Engine
from index.progress import RebuildProgress
from index.types import (
    CollectionInfo,
    Condition,
    Filter,
    FilterOp,
    Hit,
    IndexParams,
    IndexType,
    Kind,
    Metric,
    Record,
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
    "Record",
    "RebuildProgress",
    "SearchResult",
]
