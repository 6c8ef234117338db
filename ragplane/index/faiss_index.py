"""FAISS index construction, search parameters, selectors and durable checkpoints.

Every index is an `IndexIDMap2` over the real index so that FAISS ids are the store's
int64 sequence numbers (`items.seq`). Nothing here touches SQLite.

Checkpoint files are named ``g{generation}-s{seq}-{crc32:08x}.faiss``: the generation,
the highest sequence number the index covers, and a checksum of the file's bytes. They
are written to a temporary file, fsynced and renamed, so a reader sees either a whole
checkpoint or none; the checksum catches a file damaged afterwards, in which case the
caller rebuilds from the store.
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from ragplane.index.types import IndexParams, IndexType, Metric, Quantization

log = logging.getLogger(__name__)

DEFAULT_HNSW_M = 32
DEFAULT_HNSW_EF_CONSTRUCTION = 128
DEFAULT_HNSW_EF_SEARCH = 128
# IVF-PQ needs enough points to train its coarse quantizer and 256-centroid codebooks.
IVF_MIN_TRAIN = 2048
# A quantizer learns each dimension's range from the collection's vectors; fewer than this
# and the collection serves float vectors until a rebuild can train one.
QUANT_MIN_TRAIN = 1000
# Candidates per wanted hit that an index of lossy codes hands to the exact rescoring
# (SearchParams.oversampling), and the most candidates one query may rescore.
OVERSAMPLING_IVF_PQ = 10.0
OVERSAMPLING_QUANTIZED = 3.0
MAX_OVERSAMPLING = 100.0
MAX_RESCORED = 10_000

_CKPT_RE = re.compile(r"^g(\d+)-s(-?\d+)-([0-9a-f]{8})\.faiss$")


def faiss_metric(metric: Metric) -> int:
    return int(faiss.METRIC_L2 if metric == Metric.L2 else faiss.METRIC_INNER_PRODUCT)


def _default_pq_m(dim: int) -> int:
    # two dimensions per sub-quantizer on small vectors, at most 96 codes (4 dimensions each
    # for the canonical 384): on 1M embedding-like vectors 96 bytes keep the true top 10
    # among the 100 rescored candidates at 0.993 where 64 bytes (6 dimensions each) left 0.966,
    # below what the rebuild's canary read (BENCHMARKS.md 17); must divide dim.
    for m in range(max(1, dim // 2), 0, -1):
        if dim % m == 0 and m <= 96:
            return m
    return 1


def resolve_params(index_type: IndexType, dim: int, params: IndexParams, n: int = 0) -> IndexParams:
    """Fill zero ("default") fields of `params`; `n` is the number of vectors to index."""
    p = params
    if index_type == IndexType.HNSW:
        p = replace(
            p,
            hnsw_m=p.hnsw_m or DEFAULT_HNSW_M,
            hnsw_ef_construction=p.hnsw_ef_construction or DEFAULT_HNSW_EF_CONSTRUCTION,
            hnsw_ef_search=p.hnsw_ef_search or DEFAULT_HNSW_EF_SEARCH,
        )
        p = _trainable_quantization(p, n)
    elif index_type == IndexType.IVF_PQ:
        nlist = p.ivf_nlist or max(1, min(int(math.sqrt(max(n, 1))), max(1, n // 39)))
        p = replace(
            p,
            ivf_nlist=nlist,
            # 64 lists (all, when fewer), or twice the square root of nlist: at 1M (nlist
            # 1,000) nprobe 64 found 0.993 of the true top 10 at 3x the q/s of a quarter of
            # the lists (0.995); at 30,000 (nlist 173) 26 lists found 0.962, 64 0.998
            ivf_nprobe=p.ivf_nprobe or min(nlist, max(64, round(2 * math.sqrt(nlist)))),
            pq_m=p.pq_m or _default_pq_m(dim),
        )
    else:
        p = _trainable_quantization(p, n)
    return p


def _trainable_quantization(p: IndexParams, n: int) -> IndexParams:
    if p.quantization != Quantization.NONE and n < QUANT_MIN_TRAIN:
        return replace(p, quantization=Quantization.NONE)
    return p


def needs_training(index_type: IndexType, rparams: IndexParams) -> bool:
    """Whether an index of `index_type` built with `rparams` learns from vectors before adding."""
    return index_type == IndexType.IVF_PQ or rparams.quantization != Quantization.NONE


def lossy(index_type: IndexType, rparams: IndexParams) -> bool:
    """Whether the index holds lossy codes (scores are approximate, even for flat): its
    candidates are rescored with the stored float vectors."""
    return needs_training(index_type, rparams)


def default_oversampling(index_type: IndexType) -> float:
    return OVERSAMPLING_IVF_PQ if index_type == IndexType.IVF_PQ else OVERSAMPLING_QUANTIZED


def rescore_depth(k: int, oversampling: float) -> int:
    """How many candidates to rescore for `k` hits: k x oversampling, within MAX_RESCORED."""
    return min(max(k, math.ceil(k * oversampling)), max(k, MAX_RESCORED))


def validate_params(index_type: IndexType, dim: int, params: IndexParams) -> None:
    """Raise ValueError with a readable message for impossible parameters."""
    for name in (
        "hnsw_m",
        "hnsw_ef_construction",
        "hnsw_ef_search",
        "ivf_nlist",
        "ivf_nprobe",
        "pq_m",
    ):
        v = getattr(params, name)
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"index parameter {name} must be a non-negative integer, got {v!r}")
    if params.hnsw_m > 256:
        raise ValueError(f"hnsw_m {params.hnsw_m} is too large (max 256)")
    if params.hnsw_ef_search > 10_000 or params.hnsw_ef_construction > 10_000:
        raise ValueError("hnsw ef parameters must be at most 10000")
    if index_type == IndexType.IVF_PQ and params.pq_m and dim % params.pq_m:
        raise ValueError(f"pq_m {params.pq_m} must divide the dimension {dim}")
    if params.quantization != Quantization.NONE and index_type == IndexType.IVF_PQ:
        raise ValueError(
            "quantization applies to flat and hnsw collections; ivf_pq already stores "
            "product-quantized codes (choose pq_m instead)"
        )


def ivf_trainable(n: int, params: IndexParams) -> bool:
    return n >= max(IVF_MIN_TRAIN, 39 * max(params.ivf_nlist, 1))


def pq_nbits(n: int) -> int:
    """Bits per PQ code: 8 (256 centroids) once there are enough points to train that many
    (FAISS wants 39 per centroid), fewer below, so small collections train fast and well."""
    return int(min(8, max(4, math.floor(math.log2(max(n, 16) / 39)))))


def new_index(
    index_type: IndexType, dim: int, metric: Metric, params: IndexParams, n: int = 0
) -> faiss.IndexIDMap2:
    """An empty index of `index_type` (resolved params); `n` is how many vectors it will train on.
    IVF-PQ and quantized indexes come back untrained (`needs_training`)."""
    fm = faiss_metric(metric)
    sq = "SQ8" if params.quantization == Quantization.INT8 else ""
    if index_type == IndexType.FLAT:
        return faiss.index_factory(dim, f"IDMap2,{sq or 'Flat'}", fm)
    if index_type == IndexType.HNSW:
        idx = faiss.index_factory(dim, f"IDMap2,HNSW{params.hnsw_m}{'_' + sq if sq else ''}", fm)
        faiss.downcast_index(idx.index).hnsw.efConstruction = params.hnsw_ef_construction
        return idx
    if index_type == IndexType.IVF_PQ:
        # "np": no polysemous training, which costs ~20x the rest of training and only
        # helps Hamming-filtered search, which we do not use
        return faiss.index_factory(
            dim, f"IDMap2,IVF{params.ivf_nlist},PQ{params.pq_m}x{pq_nbits(n)}np", fm
        )
    raise ValueError(f"unknown index type {index_type!r}")


def search_params(
    index_type: IndexType, params: IndexParams, k: int, sel: faiss.IDSelector | None,
    ef_search: int | None = None, nprobe: int | None = None,
) -> Any:
    """FAISS's search parameters: the collection's (`params`, resolved) unless a request
    overrides ef_search / nprobe (validated against the collection before)."""
    if index_type == IndexType.HNSW:
        ef = ef_search or params.hnsw_ef_search
        return faiss.SearchParametersHNSW(sel=sel, efSearch=max(ef, k))
    if index_type == IndexType.IVF_PQ:
        return faiss.SearchParametersIVF(sel=sel, nprobe=nprobe or params.ivf_nprobe)
    if sel is None:
        return None
    return faiss.SearchParameters(sel=sel)


class BitmapSelector:
    """An IDSelectorBitmap over sequence numbers; keeps its bytes alive with it."""

    __slots__ = ("bits", "sel")

    def __init__(self, mask: np.ndarray | None = None, *, bits: np.ndarray | None = None) -> None:
        if bits is None:
            assert mask is not None, "a selector needs a mask or its bits"
            bits = np.packbits(mask, bitorder="little")
        self.bits = bits
        self.sel = faiss.IDSelectorBitmap(int(self.bits.shape[0]) * 8, faiss.swig_ptr(self.bits))


class LiveBits:
    """A set of sequence numbers stored as a little-endian bitmap, one bit per number, so
    it doubles as FAISS's IDSelectorBitmap without conversion. Not thread-safe: callers
    hold the collection's lock."""

    __slots__ = ("bits",)

    def __init__(self, capacity: int = 1024) -> None:
        self.bits = np.zeros(max(1, (capacity + 7) // 8), dtype=np.uint8)

    @property
    def capacity(self) -> int:
        return int(self.bits.shape[0]) * 8

    def add(self, seqs: np.ndarray) -> None:
        if not seqs.size:
            return
        need = (int(seqs.max()) >> 3) + 1
        if need > self.bits.shape[0]:
            grown = np.zeros(max(need, 2 * self.bits.shape[0]), dtype=np.uint8)
            grown[: self.bits.shape[0]] = self.bits
            self.bits = grown
        np.bitwise_or.at(self.bits, seqs >> 3, np.left_shift(1, seqs & 7).astype(np.uint8))

    def discard(self, seqs: np.ndarray) -> None:
        seqs = seqs[seqs < self.capacity]
        if seqs.size:
            keep = np.invert(np.left_shift(1, seqs & 7).astype(np.uint8))
            np.bitwise_and.at(self.bits, seqs >> 3, keep)

    def contains(self, seqs: np.ndarray) -> np.ndarray:
        out = np.zeros(seqs.shape[0], dtype=bool)
        inside = seqs < self.capacity
        s = seqs[inside]
        out[inside] = ((self.bits[s >> 3] >> (s & 7).astype(np.uint8)) & 1).astype(bool)
        return out

    def to_array(self) -> np.ndarray:
        return np.flatnonzero(np.unpackbits(self.bits, bitorder="little")).astype(np.int64)

    def selector(self) -> BitmapSelector:
        return BitmapSelector(bits=self.bits)


def checkpoint_files(directory: Path, generation: int) -> list[tuple[int, Path, int]]:
    """(seq, path, crc) of this generation's checkpoint files, newest (highest seq) first."""
    out = []
    if directory.is_dir():
        for p in directory.iterdir():
            m = _CKPT_RE.match(p.name)
            if m and int(m.group(1)) == generation:
                out.append((int(m.group(2)), p, int(m.group(3), 16)))
    out.sort(key=lambda t: (t[0], t[1].stat().st_mtime_ns), reverse=True)
    return out


def parse_checkpoint_name(name: str) -> tuple[int, int] | None:
    m = _CKPT_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def fsync_dir(directory: Path) -> None:
    """fsync a folder (its entries), or a file."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StagedCheckpoint:
    """An index written to a temporary file in the checkpoint directory, not yet visible."""

    tmp: Path
    crc: int


def stage_checkpoint(directory: Path, index: faiss.Index) -> StagedCheckpoint:
    """Stream `index` into a temporary file, computing its CRC on the way.

    FAISS writes through a callback in 1 MiB blocks, so no in-memory copy of the index is
    made (faiss.serialize_index would build one in a growing buffer and copy it again into
    numpy: up to three times the index's size at once). The caller holds whatever lock
    keeps `index` still; `commit_checkpoint` (fsync, rename) needs no lock.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".tmp-", suffix=".faiss", dir=directory)
    crc = 0
    try:
        with os.fdopen(fd, "wb") as f:

            def write(block: bytes) -> int:
                nonlocal crc
                crc = zlib.crc32(block, crc)
                return f.write(block)

            faiss.write_index(index, faiss.PyCallbackIOWriter(write, 1 << 20))
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return StagedCheckpoint(Path(name), crc & 0xFFFFFFFF)


def commit_checkpoint(
    directory: Path, generation: int, seq: int, staged: StagedCheckpoint
) -> Path:
    """Make a staged checkpoint durable and visible under its final name; older checkpoints
    of the same generation are removed once it is."""
    final = directory / f"g{generation}-s{seq}-{staged.crc:08x}.faiss"
    try:
        with open(staged.tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(staged.tmp, final)
    except BaseException:
        staged.tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    for _, p, _ in checkpoint_files(directory, generation):
        if p != final:
            p.unlink(missing_ok=True)
    return final


def write_checkpoint(directory: Path, generation: int, seq: int, index: faiss.Index) -> Path:
    """Atomically write `index` as the checkpoint of `generation` covering `seq`."""
    return commit_checkpoint(directory, generation, seq, stage_checkpoint(directory, index))


def _file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc & 0xFFFFFFFF


def load_checkpoint(directory: Path, generation: int) -> tuple[faiss.Index, int] | None:
    """The newest readable checkpoint of `generation` as (index, covered seq), or None.

    A file whose checksum does not match or that FAISS cannot parse is logged and skipped;
    the caller then rebuilds from the store. The file is read twice (checksum, then FAISS
    straight from disk) rather than held in memory beside the index it becomes.
    """
    for seq, path, crc in checkpoint_files(directory, generation):
        try:
            if _file_crc(path) != crc:
                raise ValueError("checksum mismatch")
            idx = faiss.read_index(str(path))
        except Exception as e:  # a torn or damaged file must never stop start-up
            log.warning("ignoring unreadable index checkpoint %s: %s", path.name, e)
            continue
        return idx, seq
    return None


# FAISS's OpenMP threads for the calling thread's next search (libgomp keeps the count per
# thread). A flat index answers one query on one thread however many it is given, and the
# team's other threads spin-wait meanwhile: measured on 2 cores (faiss-cpu 1.x, 384
# dimensions), one query over 2,000 vectors took 121 us of CPU on one thread and 263 us
# on two in the same wall time, over 100,000 vectors 14.8 ms and 28.1 ms. The graph and
# IVF indexes start no team for a single query.
_OMP_DEFAULT = faiss.omp_get_max_threads()
_omp = threading.local()


def threads_for(queries: int) -> None:
    """One OpenMP thread for a single query, the process default for a batch."""
    want = 1 if queries == 1 else _OMP_DEFAULT
    if getattr(_omp, "threads", _OMP_DEFAULT) != want:
        faiss.omp_set_num_threads(want)
        _omp.threads = want


# Batched exact search over a flat index with numpy's BLAS. FAISS answers a batch of
# queries with one sgemm, but the OpenBLAS bundled in the faiss-cpu wheel falls back to a
# generic kernel on current x86 CPUs (threadpoolctl reports "Prescott"), several times
# slower than numpy's. Single queries stay on FAISS's own SIMD scan.
BLAS_MIN_QUERIES = 4
_CHUNK_ROWS = 65_536


def flat_batch_search(
    index: faiss.IndexIDMap2,
    q: np.ndarray,
    k: int,
    metric: Metric,
    allowed: Callable[[np.ndarray], np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of `q` [nq, d] over the flat `index`, as FAISS returns it: distances
    (higher-better for ip, squared L2 lower-better) and ids, -1 padded. `allowed(ids)` gives
    a boolean mask of ids that may be returned (tombstones and filters).

    Scores come from numpy's sgemm; the top k of each score block is kept by FAISS's own
    per-query heaps (C++, one pass over the block, rows in parallel), about twice as fast as
    numpy's argpartition + merge at 32 queries over 100k rows.
    """
    flat = faiss.downcast_index(index.index)
    n, d = flat.ntotal, flat.d
    nq = q.shape[0]
    l2 = metric == Metric.L2
    # the heap keeps the k largest scores; l2 is ranked on the negated squared distance
    best = np.empty((nq, k), dtype=np.float32)
    pos = np.empty((nq, k), dtype=np.int64)
    heap = faiss.float_minheap_array_t()
    heap.nh, heap.k = nq, k
    heap.val, heap.ids = faiss.swig_ptr(best), faiss.swig_ptr(pos)
    heap.heapify()
    if n:
        xb = faiss.rev_swig_ptr(flat.get_xb(), n * d).reshape(n, d)
        ids = faiss.vector_to_array(index.id_map)
        qn = (q * q).sum(axis=1, keepdims=True) if l2 else None
        for start in range(0, n, _CHUNK_ROWS):
            x = xb[start : start + _CHUNK_ROWS]
            s = q @ x.T  # [nq, rows]
            if l2:
                s = 2 * s - qn - (x * x).sum(axis=1)[None, :]
            if allowed is not None:
                s[:, ~allowed(ids[start : start + _CHUNK_ROWS])] = -np.inf
            s = np.ascontiguousarray(s, dtype=np.float32)
            heap.addn(s.shape[1], faiss.swig_ptr(s), start, 0, nq)
        heap.reorder()  # best first
    # empty slots keep FAISS's neutral (-FLT_MAX, id -1); a masked -inf score never
    # beats it, so a filled slot is exactly one with an id
    found = pos >= 0
    out_i = np.where(found, ids[np.where(found, pos, 0)] if n else -1, -1)
    worst = np.float32(np.inf if l2 else -np.inf)
    out_d = np.where(found, -best if l2 else best, worst).astype(np.float32)
    return out_d, out_i
