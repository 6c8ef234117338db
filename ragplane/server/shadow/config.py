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

import json
import logging
import tomllib
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from ragplane.core.errors import InvalidArgument

log = logging.getLogger(__name__)
AUTO = "auto"
STATUSES = ("experimental", "shadow-active", "flipped")
POLICIES = ("manual", "auto")


@dataclass(frozen=True)
class Gates:
    min_cosine: float = 0.9999  # G1: the worst vector
    mean_cosine: float = 0.99999  # G1: the average vector
    min_overlap: float = 0.99  # G1: overlap@10 on the probe set
    max_time_ratio: float = 1.05  # G2: upper confidence bound of shadow / canonical time
    # G2: the A/A noise floor (the canonical timed after the shadow against itself before
    # it) must lie within [1 / max_aa_ratio, max_aa_ratio]; outside it, the timings prove
    # nothing (something other than the embedders moved the clock)
    max_aa_ratio: float = 1.05
    min_releases: int = 3  # G3: distinct shadow releases that passed G1 and G2
    min_samples: int = 1000  # vectors compared before G1 can pass
    min_probes: int = 20  # probe queries before overlap counts
    min_timed_batches: int = 30  # interleaved timings (per traffic class) before G2 can pass
    # G1 and G2 are judged per traffic class (server.shadow.classes); a class that carries
    # at least this share of the sampled batches must hold both
    min_class_share: float = 0.05
    # G3: what a recorded release must show to count: this much real shadow time (first
    # to last observation) and this many sampled batches, measured against the same
    # canonical on the same hardware class as the decision at hand
    min_release_hours: float = 24.0
    min_release_batches: int = 1000
    # G2: a class's batches offered while the server was busy must be sampled at least at
    # this share, or its timings describe only the quiet hours (the sampler's
    # min_busy_share keeps it so; drops under load can pull it down)
    min_busy_coverage: float = 0.1
    # G3: a release whose offered batches were mostly dropped measured a biased sample
    max_drop_share: float = 0.5
    # the watch: a serving shadow whose timings prove nothing (A/A floor out of bounds)
    # over this many timed batches of a class is unflipped, not watched for ever
    watch_unproven_batches: int = 100


@dataclass(frozen=True)
class PairConfig:
    use_case: str
    canonical: str
    shadow: str
    status: str = "shadow-active"
    sample_rate: float = 0.1
    policy: str = "manual"
    timing_rate: float = 0.25  # of sampled batches, the share also timed (A/B/A interleaved)
    # of the batches drawn for sampling while requests wait (busy), the share sampled all
    # the same, per traffic class: the evidence must cover loaded hours, not only quiet ones
    min_busy_share: float = 0.2
    # a pause before each of the three timed runs, so that threads one embedder leaves
    # spinning (or caches it evicted) are not charged to the next run
    timing_pause_ms: float = 0.0
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


def load_trusted_keys(path: str | Path) -> dict[str, str]:
    """koder.toml's [release_keys]: the servers whose measurements G3 trusts, as key id ->
    base64 raw Ed25519 public key (server.shadow.signing). A missing file or table: none."""
    p = Path(path)
    if not p.exists():
        return {}
    try:
        keys = tomllib.loads(p.read_text()).get("release_keys") or {}
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{p} is not valid TOML: {exc}") from None
    if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
        raise InvalidArgument(f'{p} [release_keys]: expected "key id" = "base64 public key"')
    return {str(k): v for k, v in keys.items()}


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
    shares = (cfg.sample_rate, cfg.timing_rate, cfg.min_busy_share)
    if not all(0.0 <= x <= 1.0 for x in shares):
        raise InvalidArgument(
            f"{where}: sample_rate, timing_rate and min_busy_share must be in [0, 1]"
        )
    g = cfg.gates
    if not (0.0 <= g.min_busy_coverage <= 1.0 and 0.0 <= g.max_drop_share <= 1.0):
        raise InvalidArgument(f"{where}.gates: min_busy_coverage and max_drop_share in [0, 1]")
    if g.watch_unproven_batches < 1:
        raise InvalidArgument(f"{where}.gates: watch_unproven_batches must be >= 1")
    if cfg.gates.max_aa_ratio < 1.0 or not 0.0 <= cfg.gates.min_class_share <= 1.0:
        raise InvalidArgument(
            f"{where}.gates: max_aa_ratio must be >= 1 and min_class_share in [0, 1]"
        )
    if cfg.timing_pause_ms < 0:
        raise InvalidArgument(f"{where}: timing_pause_ms must be >= 0")
    return cfg


def _installed_from() -> Path | None:
    """The project folder the ragplane distribution was installed from: the local path pip
    recorded in direct_url.json (PEP 610; `pip install .` and `pip install -e .` both write
    it), else the folder above this package when it runs from a source tree."""
    try:
        raw = metadata.distribution("ragplane").read_text("direct_url.json")
        url = json.loads(raw or "{}").get("url", "")
        if url.startswith("file://"):
            return Path(url.removeprefix("file://"))
    except (metadata.PackageNotFoundError, json.JSONDecodeError):
        pass
    here = Path(__file__).resolve().parents[3]
    return here if (here / "pyproject.toml").exists() else None


def koder_toml_candidates() -> list[Path]:
    """Where `koder_toml = "auto"` looks, in order."""
    out = [Path.cwd() / "koder.toml"]
    root = _installed_from()
    if root is not None and root / "koder.toml" not in out:
        out.append(root / "koder.toml")
    return out


def discover_koder_toml(setting: str) -> Path | None:
    """The koder.toml a server reads, from the `koder_toml` setting:

    * "" -- none: no shadow pairs;
    * "auto" -- ./koder.toml, else the koder.toml of the project the package was installed
      from (so a server started from any folder of a source checkout, or installed with
      `pip install <checkout>`, finds the checkout's pairs); a WARNING when neither exists;
    * anything else -- that file, which must exist (InvalidArgument otherwise).

    The file used is logged at INFO: which pairs a server runs must never be a guess."""
    if not setting:
        log.info("koder_toml is empty: no shadow pairs")
        return None
    if setting != AUTO:
        path = Path(setting).expanduser()
        if not path.is_file():
            raise InvalidArgument(
                f"koder_toml {setting!r} does not exist; point --koder-toml / "
                "RAGPLANE_KODER_TOML at the file, or set it to auto or to an empty string"
            )
        log.info("shadow pairs from %s (koder_toml setting)", path.resolve())
        return path
    candidates = koder_toml_candidates()
    for path in candidates:
        if path.is_file():
            log.info("shadow pairs from %s (koder_toml = auto)", path)
            return path
    log.warning(
        "no koder.toml found (looked at %s): no shadow pairs run; set koder_toml "
        "(--koder-toml or RAGPLANE_KODER_TOML) to the file, or to an empty string to mean none",
        ", ".join(map(str, candidates)),
    )
    return None
