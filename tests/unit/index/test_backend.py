"""The store's seam (ragplane.index.backend): both stores define every operation of the
`Store` protocol themselves, with its parameters (a method left out, or one forwarded by
`__getattr__`, fails here and in mypy), and the PostgreSQL follower every `Follower` one.
The factory is the one place that chooses a store."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

from ragplane.index.backend import Follower, Store, StoreConfig, open_store
from ragplane.index.engine import Engine
from ragplane.index.pg.engine import PgEngine
from ragplane.index.pg.follower import LogFollower


def members(protocol: type) -> dict[str, object]:
    """The protocol's own members (methods and properties), by name."""
    return {n: v for n, v in vars(protocol).items()
            if not n.startswith("_") and (callable(v) or isinstance(v, property))}


def test_the_protocols_name_the_operations_the_server_calls():
    assert {"upsert", "delete", "search", "search_hybrid", "rebuild", "of_kind",
            "run_once", "snapshot", "close"} <= set(members(Store))
    assert {"applied", "wait_for", "check", "lag_seconds", "healthy", "store_id"} <= set(
        members(Follower)
    )


@pytest.mark.parametrize("store", [Engine, PgEngine])
def test_every_store_defines_every_operation_with_its_parameters(store):
    for name, proto in members(Store).items():
        impl = inspect.getattr_static(store, name, None)
        assert inspect.isfunction(impl), f"{store.__name__} does not define {name}"
        want = inspect.signature(proto).parameters
        have = inspect.signature(impl).parameters
        for p, param in want.items():
            assert p in have, f"{store.__name__}.{name} lacks parameter {p}"
            assert have[p].kind == param.kind, f"{store.__name__}.{name}({p}): {param.kind}"
            if param.default is not inspect.Parameter.empty:
                assert have[p].default is not inspect.Parameter.empty, (
                    f"{store.__name__}.{name}({p}) has no default"
                )
        extra = [p for p, v in have.items() if p not in want and v.default is v.empty
                 and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
        assert not extra, f"{store.__name__}.{name} requires {extra}, which the protocol lacks"


def test_no_store_forwards_unknown_attributes():
    for store in (Engine, PgEngine, LogFollower):
        assert "__getattr__" not in vars(store)


def test_the_follower_defines_every_member():
    for name, proto in members(Follower).items():
        impl = inspect.getattr_static(LogFollower, name, None)
        if isinstance(proto, property):  # a property, or an attribute set at construction
            init = inspect.getsource(LogFollower.__init__)
            assert impl is not None or f"self.{name}" in init, f"LogFollower lacks {name}"
        else:
            assert inspect.isfunction(impl), f"LogFollower does not define {name}"


def test_the_embedded_store_has_no_follower_and_keeps_its_state_in_the_data_dir(tmp_path):
    from ragplane.core.serverdb import Tables

    backend = open_store(StoreConfig("sqlite", tmp_path))
    try:
        assert isinstance(backend.store, Engine) and backend.follower is None
        assert backend.where == str(tmp_path)
        db = backend.server_db(Tables("own.db", {"t": "things"}, "CREATE TABLE things (x)"))
        assert not db.shared and (tmp_path / "own.db").exists()
        db.close()
    finally:
        backend.close()


def imports(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def test_only_the_factory_and_its_own_package_import_the_postgresql_store():
    root = pathlib.Path(__file__).resolve().parents[3] / "ragplane"
    importers = sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*.py")
        if "/index/pg/" not in p.as_posix()
        and any(m == "ragplane.index.pg" or m.startswith("ragplane.index.pg.")
                for m in imports(p))
    )
    assert importers == ["index/backend.py"]
