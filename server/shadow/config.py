"""The [self_hosted] declarations of koder.toml: one canonical/shadow pair per case-of-use.

[self_hosted.embeddings]
canonical = "sentence-transformers"
shadow = "embedder_rs"
status = "shadow-active"      # experimental -> shadow-active -> flipped
sample_rate = 0.1
policy = "manual"             # or "auto": flip as soon as every gate holds
[self_hosted.embeddings.gates]
min_cosine = 0.9999
...
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from server.errors import InvalidArgument

STATUSES = ("experimental", "shadow-active", "flipped")
POLICIES = ("manual", "auto")


@dataclass(frozen=True)
class Gates:
    min_cosine: float = 0.9999  # G1: the worst vector
    mean_cosine: float = 0.99999  # G1: the average vector
    min_overlap: float = 0.99  # G1: overlap@10 on the probe set
    max_time_ratio: float = 1.05  # G2: upper confidence bound of shadow / canonical time
    min_releases: int = 3  # G3: distinct shadow releases that passed G1 and G2
    min_samples: int = 1000  # vectors compared before G1 can pass
    min_probes: int = 20  # probe queries before overlap counts
    min_timed_batches: int = 30  # interleaved timings before G2 can pass


@dataclass(frozen=True)
class PairConfig:
    use_case: str
    canonical: str
    shadow: str
    status: str = "shadow-active"
    sample_rate: float = 0.1
    policy: str = "manual"
    timing_rate: float = 0.25  # of sampled batches, the share also timed (A/B/A interleaved)
    probe_corpus: int = 2000  # sampled texts kept, with both embedders' vectors, for overlap
    probe_queries: int = 50
    gates: Gates = field(default_factory=Gates)


def load_pairs(path: str | Path) -> dict[str, PairConfig]:
    """Parse koder.toml; a missing file or section means no pairs."""
    p = Path(path)
    if not p.exists():
        return {}
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{p} is not valid TOML: {exc}") from None
    pairs = {}
    for case, spec in (data.get("self_hosted") or {}).items():
        pairs[case] = parse_pair(case, spec, where=f"{p} [self_hosted.{case}]")
    return pairs


def parse_pair(case: str, spec: dict[str, Any], where: str = "") -> PairConfig:
    spec = dict(spec)
    gates = spec.pop("gates", {}) or {}
    known = {f.name for f in fields(PairConfig)} - {"use_case", "gates"}
    unknown = set(spec) - known
    if unknown:
        raise InvalidArgument(f"{where}: unknown keys {sorted(unknown)}; known {sorted(known)}")
    gknown = {f.name for f in fields(Gates)}
    if set(gates) - gknown:
        raise InvalidArgument(f"{where}.gates: unknown keys {sorted(set(gates) - gknown)}")
    for key in ("canonical", "shadow"):
        if not spec.get(key):
            raise InvalidArgument(f"{where}: `{key}` is required")
    cfg = PairConfig(use_case=case, gates=Gates(**gates), **spec)
    if cfg.status not in STATUSES:
        raise InvalidArgument(f"{where}: status {cfg.status!r}; use one of {STATUSES}")
    if cfg.policy not in POLICIES:
        raise InvalidArgument(f"{where}: policy {cfg.policy!r}; use manual or auto")
    if not 0.0 <= cfg.sample_rate <= 1.0 or not 0.0 <= cfg.timing_rate <= 1.0:
        raise InvalidArgument(f"{where}: sample_rate and timing_rate must be in [0, 1]")
    return cfg
