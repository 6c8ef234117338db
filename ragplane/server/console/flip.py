"""The flip page: per case-of-use, what ShadowStatus says (through `AdminOps`, the RPC's
own path), its evidence as charts (`series.py`), the committed release history, and Flip
/ Unflip for admin keys (refused by the manager with the gates' own reasons)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ragplane.server.admin import AdminOps
from ragplane.server.console import series
from ragplane.server.shadow.types import CaseStatus

MAX_TIME_RATIO = 1.05  # G2's line when a case's gates cannot be read (DESIGN.md)
# the parts of a release entry shown as its evidence; every other field is provenance
_EVIDENCE = ("samples", "cosine_min", "cosine_mean", "overlap_at_10", "time_ratio",
             "time_ratio_upper", "aa_time_ratio", "timed_batches", "errors", "batches",
             "seconds", "passed_g1", "passed_g2")


class FlipPages:
    def __init__(self, admin: AdminOps) -> None:
        self.admin = admin
        shadow = admin.shadow
        self.sampler = series.Sampler(shadow.status) if shadow is not None else None

    def page(self, request: Request, form: dict[str, str]):
        shadow = self.admin.shadow
        if shadow is None:
            return "flip.html", {"cases": []}
        cases = self.admin.shadow_status(None)
        assert self.sampler is not None
        self.sampler.sample(cases)
        return "flip.html", {"cases": [self._view(c) for c in cases]}

    def _limit(self, use_case: str) -> float:
        case = self.admin.shadow.cases.get(use_case) if self.admin.shadow else None
        return case.cfg.gates.max_time_ratio if case is not None else MAX_TIME_RATIO

    def _view(self, c: CaseStatus) -> dict[str, Any]:
        cur = series.current(c)
        view: dict[str, Any] = {"case": c, "current": cur, "records": [], "charts": "{}"}
        if c.status == "unavailable":
            return view
        store = self.admin.shadow.store
        charts = {
            "limit": self._limit(c.use_case),
            "ratio": series.ratio_series(store, c, "shadow"),
            "watch": series.ratio_series(store, c, "watch") if c.status == "flipped" else {},
            "samples": self.sampler.series(c.use_case) if self.sampler else [],
        }
        view["charts"] = json.dumps(charts, allow_nan=False).replace("</", "<\\/")
        view["counts"] = series.counts_of(cur) if cur is not None else {}
        view["class_counts"] = [series.counts_of(k) for k in cur.classes] if cur else []
        view["records"] = [_record(r.to_json()) for r in self.admin.shadow.history.records(
            c.use_case)]
        return view

    def flip(self, request: Request, form: dict[str, str]) -> Response:
        self.admin.flip(request.path_params["case"], force=False)
        return RedirectResponse("/console/flip", 303)

    def unflip(self, request: Request, form: dict[str, str]) -> Response:
        self.admin.unflip(request.path_params["case"])
        return RedirectResponse("/console/flip", 303)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()


def _record(entry: dict[str, Any]) -> dict[str, Any]:
    """A release entry as the page shows it: its evidence, its classes, and everything
    else (where, when, on what, the gates, a signature when entries carry one) as its
    provenance, whatever fields the entry has."""
    ev = dict(entry.get("evidence") or {})
    classes = ev.pop("classes", [])
    provenance = {k: v for k, v in entry.items() if k not in ("evidence", "use_case")}
    return {
        "shadow": entry.get("shadow", ""),
        "evidence": {k: ev[k] for k in _EVIDENCE if k in ev},
        "more": {k: v for k, v in ev.items() if k not in _EVIDENCE},
        "classes": classes,
        "provenance": {k: v if isinstance(v, str | int | float | bool) else json.dumps(v)
                       for k, v in provenance.items()},
    }
