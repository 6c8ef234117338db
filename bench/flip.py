"""`python -m bench.flip` (`make flip-demo`): the embeddings case flipping on its own
evidence, end to end, with the real model.

It starts `ragplane serve` with a fresh data directory, the canonical embedder of the
device (ONNX Runtime on a CPU) and embedder_rs as the shadow at sample rate 1.0 under
`policy = "auto"`, builds a collection with the canonical, then sends real text until the
server flips by itself. Once flipped it shows `ragplane shadow status`, that new vectors
come from embedder_rs, that searching the collection the canonical built still works (G1
makes the pair compatible) and that `ragplane shadow unflip` goes back.

The pair, its gate thresholds and G3's release history are the repository's (koder.toml,
self-hosted-releases.json); only the evidence minimums are lowered so the demo fits a few
minutes on 2 cores, and the output says so. When a gate holds the flip back, the command
names it with its numbers and exits with EXIT_HELD.

Exit status: 0 flipped and every check held; 3 (EXIT_HELD) a gate holds the flip back;
4 no decision within --timeout; 1 a check failed; 2 embedder_rs is not installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from bench.common import ROOT, Server, start_server
from ragplane.server.shadow.releases import FILE_NAME
from ragplane.testkit.texts import corpus, long_passages, sentences, topic_passages
from ragplane.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    embed_pb2,
    embed_pb2_grpc,
    index_pb2,
    index_pb2_grpc,
    search_pb2,
    search_pb2_grpc,
)

# the model is loaded offline by the processes this starts
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EXIT_OK, EXIT_FAILED, EXIT_NO_RUST, EXIT_HELD, EXIT_TIMEOUT = 0, 1, 2, 3, 4
CASE = "embeddings"
# Evidence minimums for the demo (the repository's: 1000 vectors, 20 probes, 30 timed
# batches per class, and 3 releases each measured over 24 h and 1000 batches against this
# canonical on this hardware class, which no fresh machine can have). The thresholds
# themselves -- cosine, overlap, A/A floor, time ratio, class share -- stay as declared.
DEMO_MINIMUMS = {
    "min_samples": 300,
    "min_probes": 20,
    "min_timed_batches": 30,
    "min_releases": 1,
    "min_release_hours": 0,
    "min_release_batches": 0,
}


def write_koder(
    folder: Path,
    *,
    policy: str,
    minimums: dict[str, int],
    timing_rate: float = 1.0,
    history: Path = ROOT / FILE_NAME,
) -> Path:
    """A copy of the repository's embeddings pair at sample rate 1.0 with `policy` and
    `minimums`, and beside it a copy of the release `history` (the committed one unless
    told; read, never written, by the server)."""
    declared = tomllib.loads((ROOT / "koder.toml").read_text())["self_hosted"][CASE]
    gates = {**declared.get("gates", {}), **minimums}
    lines = [
        f"[self_hosted.{CASE}]",
        f'canonical = "{declared["canonical"]}"',
        f'shadow = "{declared["shadow"]}"',
        'status = "shadow-active"',
        "sample_rate = 1.0",
        f'policy = "{policy}"',
        f"timing_rate = {timing_rate}",
        f"min_busy_share = {declared.get('min_busy_share', 0.2)!r}",
        "",
        f"[self_hosted.{CASE}.gates]",
        *(f"{k} = {v!r}" for k, v in gates.items()),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    koder = folder / "koder.toml"
    koder.write_text("\n".join(lines) + "\n")
    if history.exists():
        shutil.copy(history, folder / FILE_NAME)
    return koder


def start(koder: Path, data_dir: Path) -> Server:
    return start_server(
        "embedder=auto", "device=cpu", f"koder_toml={koder}", data_dir=data_dir, timeout=600
    )


def shadow_case(channel) -> admin_pb2.ShadowCase:
    stub = admin_pb2_grpc.AdminServiceStub(channel)
    (case,) = stub.ShadowStatus(admin_pb2.ShadowStatusRequest(use_case=CASE), timeout=30).cases
    return case


def live_release(case: admin_pb2.ShadowCase) -> admin_pb2.ReleaseEvidence:
    return next(
        (r for r in case.releases if r.shadow == case.shadow),
        admin_pb2.ReleaseEvidence(shadow=case.shadow),
    )


def gate_lines(case: admin_pb2.ShadowCase) -> list[str]:
    return [
        f"  {g.name}: {'pass' if g.passed else 'FAIL'} -- {g.value}"
        + (f" -- still missing: {g.missing}" if g.missing else "")
        for g in case.gates
    ]


def cli(port: int, *args: str) -> str:
    """`ragplane shadow ...` against the demo server, as a person would type it."""
    out = subprocess.run(
        # the `ragplane` entry point: `python -m ragplane.server.cli` would register the
        # sub-commands on a second copy of the module, not on the app it runs
        [sys.executable, "-c", "from ragplane.server.cli import main; main()", "shadow", "--addr"]
        + [f"127.0.0.1:{port}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
    )
    if out.returncode:
        raise RuntimeError(f"ragplane shadow {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
    return out.stdout


def _enough_evidence(case: admin_pb2.ShadowCase) -> bool:
    """G1 and G2 ask for no more evidence (vectors, probes, timed batches in any class
    that carries traffic): more traffic cannot change their verdict's basis."""
    wanting = ("more compared vectors", "more probe queries", "more timed batches")
    return not any(w in g.missing for g in case.gates[:2] for w in wanting)


def traffic_classes(batch: int) -> list[list[list[str]]]:
    """Batches of real text in each traffic class the gates judge, to send in turn: short
    sentences, paragraphs, and passages that fill the model's window."""
    short = [t for t in sentences() if len(t.split()) <= 15]
    medium = list(topic_passages(max_words=80, min_words=40))
    window = long_passages(min_words=200)
    return [
        [pool[i : i + batch] for i in range(0, len(pool) - batch, batch)]
        for pool in (short, medium, window)
    ]


def class_lines(case: admin_pb2.ShadowCase) -> str:
    rel = live_release(case)
    return "; ".join(
        f"{c.name} {c.share:.0%}: {c.timed_batches} timed, ratio {c.time_ratio:.3f} "
        f"upper95 {c.time_ratio_upper:.3f} A/A {c.aa_time_ratio:.3f} B/B {c.bb_time_ratio:.3f}"
        for c in rel.classes
    )


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flip", description=__doc__.split("\n")[0])
    p.add_argument("--timeout", type=float, default=480.0, help="seconds of traffic at most")
    p.add_argument("--batch", type=int, default=8, help="texts per Embed call")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument(
        "--history",
        type=Path,
        default=ROOT / FILE_NAME,
        help=f"the release history G3 reads (default: the committed {FILE_NAME})",
    )
    args = p.parse_args()
    try:
        import embedder_rs

        version = embedder_rs.__version__
    except (ImportError, AttributeError) as exc:
        print(f"embedder_rs is not installed ({exc}); `make install` builds it")
        return EXIT_NO_RUST

    work = Path(tempfile.mkdtemp(prefix="ragplane-flip-"))
    koder = write_koder(work, policy="auto", minimums=DEMO_MINIMUMS, history=args.history)
    gates = tomllib.loads(koder.read_text())["self_hosted"][CASE]["gates"]
    print(f"flip demo: embedder_rs {version} shadowing the canonical, policy auto, sample 1.0")
    print(
        "  DEMO SETTING: evidence minimums lowered to "
        + ", ".join(f"{k} = {v}" for k, v in DEMO_MINIMUMS.items())
        + " (koder.toml asks for more); every threshold is the repository's:"
    )
    print("  " + ", ".join(f"{k} = {v}" for k, v in gates.items() if k not in DEMO_MINIMUMS))
    print(
        f"  G3 reads the release history {args.history} plus the live release; a release "
        "counts only when measured against this canonical on this hardware class, so on a "
        "fresh machine the live release alone (min_releases = 1) is what the demo can show"
    )
    t0 = time.monotonic()
    srv = start(koder, work / "data")
    try:
        code = _demo(srv, args)
    finally:
        srv.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"({time.monotonic() - t0:.0f} s; exit {code})")
    return code


def _fill_docs(index: index_pb2_grpc.IndexServiceStub, docs: list[str]) -> Any:
    """Collection "docs" holding `docs` (ids = their positions), embedded by the server."""
    index.CreateCollection(index_pb2.CreateCollectionRequest(name="docs"), timeout=60)
    for i in range(0, len(docs), 50):
        index.Upsert(
            index_pb2.UpsertRequest(
                collection="docs",
                items=[
                    common_pb2.Item(id=str(j), text=t)
                    for j, t in enumerate(docs[i : i + 50], start=i)
                ],
            ),
            timeout=300,
        )
    return index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs"))


def _demo(srv: Server, args: argparse.Namespace) -> int:
    ch = srv.channel()
    embed = embed_pb2_grpc.EmbedServiceStub(ch)
    docs = corpus(200)
    info = _fill_docs(index_pb2_grpc.IndexServiceStub(ch), docs)
    print(f"1. collection docs: {info.count} passages embedded by {info.embedder} (canonical)")
    case = _until_decided(ch, embed, args)
    if isinstance(case, int):
        return case
    return _after_flip(srv, case, docs, info)


def _until_decided(ch, embed, args: argparse.Namespace) -> admin_pb2.ShadowCase | int:
    """Real traffic until the case flips (its ShadowCase) or an exit code: held, timeout."""
    print(
        "2. traffic: Embed calls of real text, short sentences, paragraphs and window-length "
        "passages in turn, until the server decides"
    )
    deadline = time.monotonic() + args.timeout
    pools = traffic_classes(args.batch)
    i, last, shown = 0, 0.0, -1
    case = shadow_case(ch)
    while case.serving != case.shadow:
        if time.monotonic() > deadline:
            print(f"no decision within {args.timeout:.0f} s:")
            print("\n".join(gate_lines(case)))
            return EXIT_TIMEOUT
        pool = pools[i % len(pools)]
        batch = pool[(i // len(pools)) % len(pool)]
        i += 1
        t = time.perf_counter()
        embed.Embed(embed_pb2.EmbedRequest(texts=batch), timeout=60)
        # a steady load, not a flood: the shadow samples only while no request waits and
        # times each sample A/B/A (three embeds), so leave it room to keep up
        time.sleep(2 * (time.perf_counter() - t))
        if time.monotonic() - last < 3:
            continue
        last = time.monotonic()
        case = shadow_case(ch)
        rel = live_release(case)
        if rel.samples == shown:
            continue
        shown = rel.samples
        print(
            f"   {rel.samples} vectors compared (min cos {rel.cosine_min:.7f}, "
            f"{rel.errors} errors), {rel.probes} probes (overlap@10 {rel.overlap_at_10:.3f}); "
            + class_lines(case)
        )
        if case.serving != case.shadow and _enough_evidence(case):
            time.sleep(1.0)  # the last published sample may be flipping right now
            case = shadow_case(ch)
            if case.serving == case.shadow:
                break
            held = [g for g in case.gates if not g.passed]
            print(
                f"HELD BACK: the evidence minimums are met and {len(held)} gate(s) do not "
                f"hold, so {case.use_case} stays on {case.serving}:"
            )
            print("\n".join(gate_lines(case)))
            names = ", ".join(g.name.split()[0] for g in held)
            print(f"flip held back by {names}: " + " | ".join(g.missing for g in held))
            return EXIT_HELD
    return case


def _after_flip(srv: Server, case: admin_pb2.ShadowCase, docs: list[str], info: Any) -> int:
    """What a flipped case serves: new vectors, search over the canonical's, the unflip."""
    embed = embed_pb2_grpc.EmbedServiceStub(srv.channel())
    search = search_pb2_grpc.SearchServiceStub(srv.channel())
    flip = case.history[-1]
    print(f"3. flipped by itself: {flip.action} -> {flip.serving} ({flip.reason})")
    print(cli(srv.port, "status", CASE))

    r = embed.Embed(embed_pb2.EmbedRequest(texts=["vectors after the flip"]), timeout=60)
    ok = r.embedder == case.shadow
    print(f"4. new vectors come from {r.embedder}: {'ok' if ok else 'WRONG'}")
    hits = 0
    for j in (3, 57, 111, 190):
        res = search.Search(
            search_pb2.SearchRequest(collection="docs", text=docs[j], top_k=1), timeout=60
        )
        hits += res.hits[0].id == str(j)
    print(
        f"5. search over docs ({info.embedder} vectors) with {res.embedder} queries: "
        f"{hits} of 4 passages find themselves first"
    )
    ok = ok and hits == 4
    print(cli(srv.port, "unflip", CASE).splitlines()[0])
    r = embed.Embed(embed_pb2.EmbedRequest(texts=["vectors after the unflip"]), timeout=60)
    back = r.embedder == case.canonical
    print(f"6. after `ragplane shadow unflip {CASE}`: {r.embedder} answers again")
    return EXIT_OK if ok and back else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
