"""`ragplane ingest DIR` with its default options on a folder holding one 4 MiB document
and about 20 MB in all, against a server with the real model (issue 40's done-when: it
completes, exit 0, on a loaded 2-core machine).

The folder is built from `bench.documents_set`'s real documents: the large document is
many of them joined up to just under the 4 MiB limit of one item's text, the others are
the documents themselves, each written under several names with its paragraphs in a
seeded order (so the texts differ), until the folder holds `--mb` MB. The command runs as
a user runs it, in a child process; its exit code, time and summary are printed.

    python -m bench.ingest_folder [--mb 20] [--big-mib 4] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import start_server
from bench.documents_set import build

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MAX_TEXT = 4 << 20  # bulk.files.MAX_TEXT_BYTES: the most text one document may have


def write_folder(d: Path, total_mb: float, big_mib: float, seed: int) -> tuple[int, int]:
    """(files, bytes) of the folder written at `d`."""
    docs = [x.text for x in build(200, per_doc=1, seed=seed).docs]
    rng = random.Random(seed)
    d.mkdir(parents=True, exist_ok=True)
    big_limit = min(MAX_TEXT - 4096, int(big_mib * (1 << 20)))
    parts, size = [], 0
    for text in docs * 8:
        n = len(text.encode("utf-8")) + 2
        if size + n > big_limit:
            break
        parts.append(text)
        size += n
    (d / "big.txt").write_text("\n\n".join(parts), encoding="utf-8")
    total, files, copy = (d / "big.txt").stat().st_size, 1, 0
    while total < total_mb * 1e6:
        for i, text in enumerate(docs):
            paras = text.split("\n\n")
            rng.shuffle(paras)
            path = d / f"doc-{copy:02d}-{i:03d}.md"
            path.write_text("\n\n".join(paras), encoding="utf-8")
            total += path.stat().st_size
            files += 1
            if total >= total_mb * 1e6:
                break
        copy += 1
    return files, total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=20.0, help="the folder's size, MB (1e6 bytes)")
    p.add_argument("--big-mib", type=float, default=4.0, help="the large document's MiB")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", default="", help="build the folder here and keep it")
    a = p.parse_args()
    tmp = Path(a.keep or tempfile.mkdtemp(prefix="ragplane-ingest-folder-"))
    files, size = write_folder(tmp / "kb", a.mb, a.big_mib, a.seed)
    big = (tmp / "kb" / "big.txt").stat().st_size
    print(f"folder: {files} files, {size:,} bytes; big.txt {big:,} bytes "
          f"({big / (1 << 20):.2f} MiB)", flush=True)
    server = start_server("embedder=auto", "koder_toml=", "device=cpu", timeout=600)
    try:
        load0 = os.getloadavg()
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "ragplane.server.cli", "ingest", str(tmp / "kb"),
               "--collection", "kb", "--create", "--addr", f"127.0.0.1:{server.port}"]
        rc = subprocess.call(cmd)
        secs = time.monotonic() - t0
        load1 = os.getloadavg()
    finally:
        server.stop()
    print(f"exit {rc} after {secs:,.0f} s; {platform.python_version()}, {os.cpu_count()} "
          f"CPUs, load {'/'.join(f'{x:.1f}' for x in load0)} at the start, "
          f"{'/'.join(f'{x:.1f}' for x in load1)} at the end", flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
