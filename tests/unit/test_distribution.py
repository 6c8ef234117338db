"""The server distribution installs one import name, `ragplane`: nothing named `server`,
`index`, `core` or `testkit` lands at the top of site-packages to collide with other
projects' modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from ragplane.testkit.harness import ROOT


def test_the_wheel_holds_only_ragplane_at_the_top(tmp_path):
    src = tmp_path / "src"  # build from a copy: setuptools writes build/ beside the sources
    shutil.copytree(
        ROOT / "ragplane", src / "ragplane", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp_path / "dist").glob("ragplane-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"ragplane"}, top
    for module in (
        "ragplane/core/errors.py",
        "ragplane/index/engine.py",
        "ragplane/server/app.py",
        "ragplane/server/shadow/gates.py",
        "ragplane/testkit/harness.py",
        "ragplane/v1/admin_pb2.py",
        "ragplane/v1/admin_pb2.pyi",
        "ragplane/py.typed",
    ):
        assert module in names, module
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ragplane = ragplane.server.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
