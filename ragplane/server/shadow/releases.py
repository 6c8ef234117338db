"""The release history: one entry of G1/G2 evidence per shadow release, kept in a committed,
human-readable JSON file beside koder.toml (self-hosted-releases.json).

G3 asks for several releases that each passed G1 and G2. A server's own evidence store
lives in its data directory, which a fresh deployment does not have, so G3 counts this
file instead: `ragplane shadow record-release` appends the live evidence of the release a
server runs now (re-recording a version replaces its entry), the file is committed with
the release, and every server that reads it judges each entry again against its own gates.

JSON rather than TOML because the standard library both reads and writes it; entries are
written one field per line, so a new release is a readable diff. Each entry is signed by
the server that measured it (server.shadow.signing); an entry whose signature does not
verify under a key koder.toml trusts is listed with the reason and never counted. Entries
are written back exactly as read, so recording one release never breaks another's
signature.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ragplane.core.errors import InvalidArgument
from ragplane.server.shadow.classes import NAMES
from ragplane.server.shadow.config import Gates, load_trusted_keys
from ragplane.server.shadow.gates import agreement_gate, judge, performance_gate, stable
from ragplane.server.shadow.hardware import cpu_model
from ragplane.server.shadow.signing import Signer, verify
from ragplane.server.shadow.types import ClassEvidence, ReleaseEvidence

FILE_NAME = "self-hosted-releases.json"
FORMAT = 1
ABOUT = (
    "Evidence per shadow release, one entry per name@version and case-of-use, written by "
    "the server that measured it (`ragplane shadow record-release`, which asks it to), under "
    "that server's gates. G3 counts an entry only when it was measured against the canonical "
    "and on the hardware class of the decision at hand, over the minimum shadow time and "
    "batches, and passes G1 and G2 per traffic class (judged again against koder.toml's "
    "gates) with no errors, and only when its signature verifies under a key that koder.toml's "
    "[release_keys] trusts. Commit this file with each release."
)
_KINDS = {"int": int, "float": float}
# the numbers of an entry's "evidence" object and of each of its classes, with the type
# each is read back as (an entry from before a number existed reads it as 0)
_NUMBERS = {f.name: _KINDS[str(f.type)] for f in fields(ReleaseEvidence) if str(f.type) in _KINDS}
_CLASS_NUMBERS = {
    f.name: _KINDS[str(f.type)] for f in fields(ClassEvidence) if str(f.type) in _KINDS
}


@dataclass(frozen=True)
class ReleaseRecord:
    """One recorded release: its evidence and where and when it was measured."""

    use_case: str
    evidence: ReleaseEvidence  # passed_g1 / passed_g2 as judged when recorded
    canonical: str  # name@version it was compared against
    hardware: str  # the hardware class it was measured on (server.shadow.hardware)
    recorded_at: str  # UTC, ISO 8601
    machine: str  # cores, CPU model, OS of the measuring machine
    gates: Gates  # the thresholds in force when recorded
    # the entry as read from the file (None: made here, not yet written)
    raw: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # why its signature does not verify under the trusted keys ("" when it does)
    untrusted: str = field(default="", compare=False)

    @property
    def key_id(self) -> str:
        """The key that signed the entry, as the entry says ("" when unsigned)."""
        sig = (self.raw or {}).get("signature")
        return str(sig.get("key_id", "")) if isinstance(sig, dict) else ""

    @property
    def shadow(self) -> str:
        return self.evidence.shadow

    def to_json(self) -> dict[str, Any]:
        ev = dataclasses.asdict(self.evidence)
        for k in ("canonical", "hardware", "phase", "last_error"):
            ev.pop(k)
        return {
            "use_case": self.use_case,
            "shadow": ev.pop("shadow"),
            "canonical": self.canonical,
            "hardware": self.hardware,
            "recorded_at": self.recorded_at,
            "machine": self.machine,
            "evidence": ev,
            "gates": dataclasses.asdict(self.gates),
        }

    @classmethod
    def from_json(
        cls, data: dict[str, Any], where: str, trusted: Mapping[str, str] | None = None
    ) -> ReleaseRecord:
        """An entry of the file; `trusted` (key id -> public key) judges its signature."""
        try:
            ev = data["evidence"]
            classes = tuple(
                ClassEvidence(
                    name=str(c["name"]),
                    **{k: kind(c.get(k, 0)) for k, kind in _CLASS_NUMBERS.items()},
                    **{k: bool(c.get(k, False)) for k in ("carried", "passed_g1", "passed_g2")},
                )
                for c in ev.get("classes", [])
                if c.get("name") in NAMES
            )
            evidence = ReleaseEvidence(
                shadow=str(data["shadow"]),
                **{k: kind(ev.get(k, 0)) for k, kind in _NUMBERS.items()},
                passed_g1=bool(ev.get("passed_g1", False)),
                passed_g2=bool(ev.get("passed_g2", False)),
                canonical=str(data.get("canonical", "")),
                hardware=str(data.get("hardware", "")),
                classes=classes,
            )
            known = {f.name for f in fields(Gates)}
            gates = Gates(**{k: v for k, v in data.get("gates", {}).items() if k in known})
            return cls(
                use_case=str(data["use_case"]),
                evidence=evidence,
                canonical=evidence.canonical,
                hardware=evidence.hardware,
                recorded_at=str(data.get("recorded_at", "")),
                machine=str(data.get("machine", "")),
                gates=gates,
                raw=data,
                untrusted=verify(data, trusted or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(
                f"{where}: a release entry lacks or garbles {exc}; each entry needs use_case, "
                f"shadow and evidence {{{', '.join(_NUMBERS)}}}"
            ) from None


def machine_description() -> str:
    cpu = cpu_model() or platform.processor() or platform.machine()
    return f"{os.cpu_count()} cores, {cpu}, {platform.system()} {platform.release()}"


def failing_reasons(ev: ReleaseEvidence, g: Gates) -> list[str]:
    """Why `ev` would not count for G3 under the gates `g`: each failing gate with what it
    still misses, as ShadowStatus and a refused flip say it."""
    ev = judge(ev, g)
    gates = (agreement_gate(ev, g), performance_gate(ev, g))
    return [f"{x.name}: {x.missing or x.value}" for x in gates if not x.passed]


def record_from(
    use_case: str, evidence: ReleaseEvidence, gates: Gates, machine: str = ""
) -> ReleaseRecord:
    """An entry for `evidence`, its G1/G2 judged against `gates` now."""
    ev = judge(evidence, gates)
    return ReleaseRecord(
        use_case=use_case,
        evidence=ev,
        canonical=ev.canonical,
        hardware=ev.hardware,
        recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine=machine or machine_description(),
        gates=gates,
    )


class ReleaseHistory:
    """The history file at `path` (None: no history, G3 counts only the live release),
    judged under the `trusted` signing keys (key id -> base64 raw public key).

    Reads are cached on the file's modification time and size, so a server that evaluates
    its gates on every published sample picks up a newly recorded release without a restart
    and without parsing the file each time."""

    def __init__(
        self, path: str | os.PathLike[str] | None, trusted: Mapping[str, str] | None = None
    ) -> None:
        self.path = Path(path) if path else None
        self.trusted = dict(trusted or {})
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
        return [ReleaseRecord.from_json(r, where, self.trusted) for r in data.get("releases", [])]

    def verified(self, use_case: str) -> tuple[list[ReleaseRecord], list[tuple[str, str]]]:
        """The entries of `use_case` whose signature verifies, and (release, why) of those
        that do not."""
        ok, refused = [], []
        for r in self.records(use_case):
            if r.untrusted:
                refused.append((r.shadow, r.untrusted))
            else:
                ok.append(r)
        return ok, refused

    def counted(self, use_case: str, gates: Gates) -> list[str]:
        """The recorded releases of `use_case` that G3 counts under `gates`: signed by a
        trusted key, and passing."""
        ok, _ = self.verified(use_case)
        return [r.shadow for r in ok if stable(judge(r.evidence, gates), gates)]

    def record(self, rec: ReleaseRecord) -> bool:
        """Add `rec` (as its `raw` entry when it has one: see `sign`), replacing the entry
        of the same case and release if there is one (returns True then). The other
        entries are written back as read. The file is replaced atomically: a reader never
        sees half."""
        if self.path is None:
            raise InvalidArgument("no release history file is configured")
        current = self.records()
        replaced = any(r.use_case == rec.use_case and r.shadow == rec.shadow for r in current)
        kept = [r for r in current if (r.use_case, r.shadow) != (rec.use_case, rec.shadow)]
        body = {
            "about": ABOUT,
            "format": FORMAT,
            "releases": [dict(r.raw) if r.raw is not None else r.to_json() for r in [*kept, rec]],
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


def sign(rec: ReleaseRecord, signer: Signer) -> ReleaseRecord:
    """`rec` with its entry signed by `signer` (what `ReleaseHistory.record` writes)."""
    return dataclasses.replace(rec, raw=signer.sign(rec.to_json()), untrusted="")


def history_beside(koder_toml: str | os.PathLike[str] | None) -> ReleaseHistory:
    """The history that belongs to a koder.toml: the file of that name in its folder,
    judged under the keys the koder.toml trusts."""
    if not koder_toml:
        return ReleaseHistory(None)
    return ReleaseHistory(Path(koder_toml).parent / FILE_NAME, load_trusted_keys(koder_toml))


def render_markdown(records: list[ReleaseRecord], gates_of: dict[str, Gates]) -> list[str]:
    """Markdown lines for `ragplane self-hosted registry`: one table row per recorded
    release, with whether G3 counts it under the case's declared gates."""
    if not records:
        return [f"No release recorded in `{FILE_NAME}` yet (`ragplane shadow record-release`)."]
    lines = [
        "| case | release | canonical | hardware | recorded | machine | shadow hours | "
        "batches | samples | cos min | cos mean | overlap@10 (probes) | time ratio | "
        "upper 95% | timed batches | errors | G1 | G2 | signed by | passes today |",
        "|" + " --- |" * 20,
    ]
    for r in records:
        g = gates_of.get(r.use_case)
        e = judge(r.evidence, g) if g else r.evidence
        counts = ("yes" if stable(e, g) else "no") if g else "(case not declared)"
        if r.untrusted:
            counts = "no (signature)"
        signed = r.key_id + (" (trusted)" if not r.untrusted else f": {r.untrusted}")
        lines.append(
            f"| {r.use_case} | {r.shadow} | {r.canonical} | {r.hardware or '(not recorded)'} | "
            f"{r.recorded_at} | {r.machine} | {e.seconds / 3600:.1f} | {e.batches} | {e.samples} | "
            f"{e.cosine_min:.7f} | {e.cosine_mean:.7f} | {e.overlap_at_10:.3f} ({e.probes}) | "
            f"{e.time_ratio:.3f} | {e.time_ratio_upper:.3f} | {e.timed_batches} | {e.errors} | "
            f"{'pass' if e.passed_g1 else 'fail'} | {'pass' if e.passed_g2 else 'fail'} | "
            f"{signed.strip(': ') or '-'} | {counts} |"
        )
    return lines
