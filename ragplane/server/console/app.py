"""The operator's console: server-rendered pages (Jinja2, a little htmx, Chart.js) under
`/console` on the HTTP port, over the same domain services as the RPCs.

Every call goes the way an RPC goes: the API key (kept in a cookie: `session.py`), the
same admission and handler pool as gRPC and the OpenAI API, errors by the interceptor's
status table, metrics per route. Pages render on the handler pool: their reads are
SQLite, FAISS and the embedder, which would stall the event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlsplit

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ragplane.core.errors import ResourceExhausted, Unauthenticated, Unavailable
from ragplane.index.backend import Backend
from ragplane.server.admin import AdminOps
from ragplane.server.admission import Admission
from ragplane.server.auth import KeyStore, Principal
from ragplane.server.collections import CollectionService
from ragplane.server.console import filters, pages
from ragplane.server.console.flip import FlipPages
from ragplane.server.console.jobs import RebuildJobs
from ragplane.server.console.session import Sessions
from ragplane.server.interceptors import request_id, status_of
from ragplane.server.memory import MemoryService
from ragplane.server.metrics import Metrics
from ragplane.server.openai_http import HTTP_STATUS_OF  # google.rpc.Code's mapping
from ragplane.server.settings import Settings

log = logging.getLogger(__name__)
HERE = Path(__file__).parent


class ConsoleRuntime(Protocol):
    """What the console reads: the services a server runs (`ragplane.server.app.Runtime`)."""

    settings: Settings
    collections: CollectionService
    memory: MemoryService
    admin: AdminOps
    keys: KeyStore
    backend: Backend
    started_at: float


#: Every page: scripts and styles only from the package (no inline script runs, no other
#: site frames a page to click its buttons), nothing cached (pages show a tenant's data).
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

Work = Callable[[Request, dict[str, str]], "tuple[str, dict[str, Any]] | Response"]


class Console:
    """The console's routes; `app` is the ASGI app mounted at /console."""

    def __init__(
        self, runtime: ConsoleRuntime, metrics: Metrics, admission: Admission,
        draining: Callable[[], bool] = lambda: False,
    ) -> None:
        self.rt = runtime
        self.metrics = metrics
        self.admission = admission
        self.draining = draining
        self.sessions = Sessions(runtime.keys, secure=bool(runtime.settings.tls_cert))
        self.jobs = RebuildJobs(runtime.admin)
        self.flip = FlipPages(runtime.admin)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True, trim_blocks=True, lstrip_blocks=True,
        )
        filters.install(self.env)
        p = pages.Pages(runtime, self.jobs)
        get, post = ["GET"], ["POST"]
        routes = [
            Route("/", self._home, methods=get),
            Route("/login", self._login_form, methods=get),
            Route("/login", self._login, methods=post),
            Route("/logout", self._logout, methods=post),
            self._route("/collections", p.collections),
            self._route("/collections/{name}", p.collection),
            self._route("/collections/{name}/delete", p.delete, post, "Deleting a collection"),
            self._route("/collections/{name}/rebuild", p.rebuild, post, "A rebuild"),
            self._route("/collections/{name}/progress", p.progress),
            self._route("/playground", p.playground.page),
            self._route("/playground/results", p.playground.results),
            self._route("/flip", self.flip.page),
            self._route("/flip/{case}/flip", self.flip.flip, post, "A flip"),
            self._route("/flip/{case}/unflip", self.flip.unflip, post, "An unflip"),
            self._route("/store", p.store),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        self.app = Starlette(routes=routes)

    def _route(
        self, path: str, work: Work, methods: list[str] | None = None, action: str = ""
    ) -> Route:
        async def endpoint(request: Request) -> Response:
            return await self._call(request, "/console" + path, work, action)

        return Route(path, endpoint, methods=methods or ["GET"])

    async def _call(self, request: Request, route: str, work: Work, action: str) -> Response:
        """What every page and action does around its `work`: draining, the key (and the
        admin scope and CSRF token for an action), admission, the handler pool, errors,
        metrics."""
        t0 = time.perf_counter()
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        request_id.set(rid)
        principal: Principal | None = None
        try:
            if self.draining():
                raise Unavailable("the server is shutting down")
            principal = self.sessions.principal(request)
            form: dict[str, str] = dict(request.query_params)
            if request.method == "POST":
                form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
                self.sessions.check_csrf(request, form.get("csrf", ""))
                self.sessions.require_admin(principal, action)
            if not self.admission.admit():
                raise ResourceExhausted(self.admission.message())
            ctx = contextvars.copy_context()  # the request id and principal, on the pool
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(self.admission.pool, ctx.run, work, request, form)
            if isinstance(out, Response):
                response = out
            else:
                response = self._render(request, principal, *out)
        except Unauthenticated as exc:
            if request.method == "GET" and not request.headers.get("hx-request"):
                target = quote(request.url.path + (f"?{request.url.query}" if request.url.query
                                                    else ""))
                response = RedirectResponse(f"/console/login?next={target}", 303)
            else:
                response = self._error(request, principal, exc)
        except Exception as exc:
            response = self._error(request, principal, exc)
        response.headers.update(SECURITY_HEADERS)
        response.headers["x-request-id"] = rid
        self.metrics.observe_http(route, response.status_code, time.perf_counter() - t0)
        return response

    def _render(
        self, request: Request, principal: Principal | None, template: str,
        context: dict[str, Any], status: int = 200,
    ) -> Response:
        html = self.env.get_template(template).render(
            request=request,
            principal=principal,
            is_admin=principal is not None and "admin" in principal.scopes,
            auth_on=self.sessions.enabled,
            csrf=self.sessions.csrf(request),
            path=request.url.path,
            **context,
        )
        return HTMLResponse(html, status)

    def _error(self, request: Request, principal: Principal | None, exc: Exception) -> Response:
        code = status_of(exc)
        headers: dict[str, str] = {}
        if code is None:
            rid = request_id.get()
            log.error("bug in %s (request %s)", request.url.path, rid, exc_info=exc)
            status, name, message = 500, "internal", f"internal error (request id {rid}); a bug"
        else:
            status, name, message = HTTP_STATUS_OF.get(code, 500), code.name.lower(), str(exc)
        if isinstance(exc, ResourceExhausted):
            headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
        ref = urlsplit(request.headers.get("referer", ""))
        back = ref.path if ref.netloc == request.url.netloc and ref.path.startswith(
            "/console/") else "/console/collections"
        context = {"status": status, "code": name, "message": message, "back": back}
        response = self._render(request, principal, "error.html", context, status)
        response.headers.update(headers)
        return response

    # -- signing in ----------------------------------------------------------------------

    async def _home(self, request: Request) -> Response:
        return RedirectResponse("/console/collections", 303)

    async def _login_form(self, request: Request, error: str = "", status: int = 200) -> Response:
        nxt = request.query_params.get("next", "")
        context = {"next": nxt if nxt.startswith("/console/") else "", "error": error}
        response = self._render(request, None, "login.html", context, status)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _login(self, request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
        key = form.get("key", "")
        try:
            self.sessions.sign_in(key)
        except Exception as exc:
            if status_of(exc) is None:
                raise
            self.metrics.observe_http("/console/login", 401, 0.0)
            return await self._login_form(request, str(exc), 401)
        nxt = form.get("next", "")
        response = RedirectResponse(nxt if nxt.startswith("/console/") else "/console/", 303)
        self.sessions.set_cookie(response, key)
        return response

    async def _logout(self, request: Request) -> Response:
        response = RedirectResponse("/console/login", 303)
        self.sessions.clear_cookie(response)
        return response

    def close(self) -> None:
        self.flip.close()
