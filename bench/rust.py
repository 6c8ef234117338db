"""4. embedder_rs against the canonical embedder on the same batches: the G2 ratio."""

from __future__ import annotations

import sys

from bench.common import ROOT, table


def run() -> tuple[dict, str]:
    try:
        from embedder_rs import Embedder  # noqa: F401
    except ImportError as exc:
        return {"skipped": str(exc)}, f"Skipped: embedder_rs is not installed ({exc})."
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_embedder_rs import run_benchmark

    rows = run_benchmark()
    rows = rows if isinstance(rows, list) else rows.get("rows", rows)
    keys = list(rows[0].keys()) if rows else []
    md = table(
        keys, [[f"{r[k]:.3f}" if isinstance(r[k], float) else r[k] for k in keys] for r in rows]
    )
    return {"rows": rows}, md
