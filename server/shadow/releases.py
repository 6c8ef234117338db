"""The release history: one entry of G1/G2 evidence per shadow release, kept in a committed,
human-readable JSON file beside koder.toml (self-hosted-releases.json).

G3 asks for several releases that each passed G1 and G2. A server's own evidence store
lives in its data directory, which a fresh deployment does not have, so G3 counts this
file instead: `ragplane shadow record-release` appends the live evidence of the release a
server runs now (re-recording a version replaces its entry), the file is committed with
the release, and every server that reads it judges each entry again against its own gates.

JSON rather than TOML because the standard library both reads and writes it; entries are
written with sorted keys and one field per line, so a new release is a readable diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import threading
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from core.errors import InvalidArgument
from server.shadow.config import Gates
from server.shadow.evidence import passes_g1, passes_g2, stable
from server.shadow.types import ReleaseEvidence

FILE_NAME = "self-hosted-releases.json"
FORMAT = 1
ABOUT = (
    "Evidence per shadow release, one entry per name@version and case-of-use, written by "
    "`ragplane shadow record-release` from a running server's ShadowStatus. G3 counts the "
    "entries that pass G1 and G2 (judged again against koder.toml's gates) with no errors. "
    "Commit this file with each release."
)
# the numbers of an entry's "evidence" object, each with the type it is read back as
_NUMBERS = {
    f.name: {"int": int, "float": float}[str(f.type)]
    for f in fields(ReleaseEvidence)
    if f.name not in ("shadow", "passed_g1", "passed_g2")
}


@dataclass(frozen=True)
class ReleaseRecord:
    """One recorded release: its evidence and where and when it was measured."""

    use_case: str
    evidence: ReleaseEvidence  # passed_g1 / passed_g2 as judged when recorded
    canonical: str  # name@version it was compared against
    recorded_at: str  # UTC, ISO 8601
    machine: str  # cores, CPU model, OS of the measuring machine
    gates: Gates  # the thresholds in force when recorded

    @property
    def shadow(self) -> str:
        return self.evidence.shadow

    def to_json(self) -> dict[str, Any]:
        ev = dataclasses.asdict(self.evidence)
        return {
            "use_case": self.use_case,
            "shadow": ev.pop("shadow"),
            "canonical": self.canonical,
            "recorded_at": self.recorded_at,
            "machine": self.machine,
            "evidence": ev,
            "gates": dataclasses.asdict(self.gates),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> ReleaseRecord:
        try:
            ev = data["evidence"]
            evidence = ReleaseEvidence(
                shadow=str(data["shadow"]),
                **{k: kind(ev[k]) for k, kind in _NUMBERS.items()},
                passed_g1=bool(ev.get("passed_g1", False)),
                passed_g2=bool(ev.get("passed_g2", False)),
            )
            known = {f.name for f in fields(Gates)}
            gates = Gates(**{k: v for k, v in data.get("gates", {}).items() if k in known})
            return cls(
                use_case=str(data["use_case"]),
                evidence=evidence,
                canonical=str(data.get("canonical", "")),
                recorded_at=str(data.get("recorded_at", "")),
                machine=str(data.get("machine", "")),
                gates=gates,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"{where}: a release entry lacks or garbles {exc}; each entry needs use_case, "
                f"shadow and evidence {{{', '.join(_NUMBERS)}}}"
            ) from None


def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_description() -> str:
    cpu = cpu_model() or platform.processor() or platform.machine()
    return f"{os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}"


def record_from(
    use_case: str, evidence: ReleaseEvidence, canonical: str, gates: Gates, machine: str = ""
) -> ReleaseRecord:
    """An entry for `evidence`, its G1/G2 judged against `gates` now."""
    ev = dataclasses.replace(
        evidence, passed_g1=passes_g1(evidence, gates), passed_g2=passes_g2(evidence, gates)
    )
    return ReleaseRecord(
        use_case=use_case,
        evidence=ev,
        canonical=canonical,
        recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=machine or machine_description(),
        gates=gates,
    )


class ReleaseHistory:
    """The history file at `path` (None: no history, G3 counts only the live release).

    Reads are cached on the file's modification time and size, so a server that evaluates
    its gates on every published sample picks up a newly recorded release without a restart
    and without parsing the file each time."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._cache: tuple[tuple[int, int], list[ReleaseRecord]] | None = None

    def records(self, use_case: str | None = None) -> list[ReleaseRecord]:
        """Every entry (of `use_case`), in the order recorded. A missing file is an empty
        history; a garbled one raises InvalidArgument naming the file."""
        if self.path is None:
            return []
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if self._cache is None or self._cache[0] != key:
                self._cache = (key, self._parse(self.path.read_text()))
            out = self._cache[1]
        return [r for r in out if use_case is None or r.use_case == use_case]

    def _parse(self, text: str) -> list[ReleaseRecord]:
        where = str(self.path)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"{where} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("releases", []), list):
            raise InvalidArgument(f'{where}: expected {{"releases": [...]}}')
        return [ReleaseRecord.from_json(r, where) for r in data.get("releases", [])]

    def counted(self, use_case: str, gates: Gates) -> list[str]:
        """The recorded releases of `use_case` that G3 counts under `gates`."""
        return [r.shadow for r in self.records(use_case) if stable(r.evidence, gates)]

    def record(self, rec: ReleaseRecord) -> bool:
        """Add `rec`, replacing the entry of the same case and release if there is one
        (returns True then). The file is replaced atomically: a reader never sees half."""
        if self.path is None:
            raise InvalidArgument("no release history file is configured")
        current = self.records()
        replaced = any(r.use_case == rec.use_case and r.shadow == rec.shadow for r in current)
        kept = [r for r in current if (r.use_case, r.shadow) != (rec.use_case, rec.shadow)]
        body = {
            "about": ABOUT,
            "format": FORMAT,
            "releases": [r.to_json() for r in [*kept, rec]],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f, indent=2, sort_keys=False)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return replaced


def history_beside(koder_toml: str | os.PathLike[str] | None) -> ReleaseHistory:
    """The history that belongs to a koder.toml: the file of that name in its folder."""
    return ReleaseHistory(Path(koder_toml).parent / FILE_NAME if koder_toml else None)


def render_markdown(records: list[ReleaseRecord], gates_of: dict[str, Gates]) -> list[str]:
    """Markdown lines for `ragplane self-hosted registry`: one table row per recorded
    release, with whether G3 counts it under the case's declared gates."""
    if not records:
        return [f"No release recorded in `{FILE_NAME}` yet (`ragplane shadow record-release`)."]
    lines = [
        "| case | release | recorded | machine | samples | cos min | cos mean | overlap@10 "
        "(probes) | time ratio | upper 95% | timed batches | errors | G1 | G2 | G3 counts |",
        "|" + " --- |" * 15,
    ]
    for r in records:
        e, g = r.evidence, gates_of.get(r.use_case)
        counts = ("yes" if stable(e, g) else "no") if g else "(case not declared)"
        lines.append(
            f"| {r.use_case} | {r.shadow} | {r.recorded_at} | {r.machine} | {e.samples} | "
            f"{e.cosine_min:.7f} | {e.cosine_mean:.7f} | {e.overlap_at_10:.3f} ({e.probes}) | "
            f"{e.time_ratio:.3f} | {e.time_ratio_upper:.3f} | {e.timed_batches} | {e.errors} | "
            f"{'pass' if e.passed_g1 else 'fail'} | {'pass' if e.passed_g2 else 'fail'} | "
            f"{counts} |"
        )
    return lines
