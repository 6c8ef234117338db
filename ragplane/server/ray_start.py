"""Starting or joining Ray, once for the two places that do it (`ragplane ingest --ray` /
rebuilds on Ray in `server/bulk`, and `embed_backend = ray_serve`). The caller passes its
`ray` module, so that Ray is imported only where a setting asks for it."""

from __future__ import annotations

from typing import Any

from ragplane.core.errors import Unavailable


def init_ray(ray: Any, target: str, **options: Any) -> None:
    """`ray.init(**options)`. A local start (`target == "local"`) waits a fixed 30 s for its
    GCS and raylet, which a loaded machine, or the first start after an install (Ray's
    binaries not yet in the page cache: seen on a fresh clone, "Timed out waiting for file
    .../gcs_server_port_..."), can miss: it is tried once more. Any other failure, or a
    second timeout, is Unavailable with Ray's reason. ConnectionError (no cluster at the
    address) is left to the caller, which knows what to suggest."""
    attempts = 2 if target == "local" else 1
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**options)
            return
        except ConnectionError:
            raise
        except Exception as exc:  # Ray raises a bare Exception for a start timeout
            ray.shutdown()
            if attempt == attempts or "timed out" not in str(exc).lower():
                raise Unavailable(f"Ray did not start ({target}): {exc}") from None
