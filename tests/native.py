"""The native build the tests need (embedder_rs): a skip where it may be absent, a failure
where it is expected.

`make test` builds embedder_rs (`make install`) and runs scripts/run_tests.sh, which sets
RAGPLANE_REQUIRE_EMBEDDER_RS=1: there a missing or broken build fails the tests that need
it instead of skipping them. A bare `pytest` on a checkout without the build skips them.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_ENV = "RAGPLANE_REQUIRE_EMBEDDER_RS"


def require_embedder_rs() -> ModuleType:
    """The built `embedder_rs` package. Usable at module level (a skip there skips the
    module, a failure is a collection error) or inside a test.

    Fails when RAGPLANE_REQUIRE_EMBEDDER_RS=1 and the package does not import or imports
    without its native module; otherwise skips in those cases.
    """
    try:
        module = importlib.import_module("embedder_rs")
    except ImportError as exc:
        problem = f"embedder_rs does not import ({type(exc).__name__}: {exc})"
    else:
        if hasattr(module, "Embedder"):
            return module
        # the crate's source folder at the repository root imports as a namespace package
        where = list(getattr(module, "__path__", [])) or getattr(module, "__file__", "?")
        problem = f"embedder_rs imports without its native module (from {where})"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(
            f"{problem}, but {REQUIRE_ENV}=1 says the build is expected: "
            "`make install` builds it (maturin, embedder_rs/)",
            pytrace=False,
        )
    pytest.skip(f"{problem}: `make install` builds it", allow_module_level=True)
