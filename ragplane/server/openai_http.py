"""The OpenAI-compatible embeddings API: a Starlette app, served beside gRPC by
`ragplane.server.http_server`.

- `POST /v1/embeddings` answers as OpenAI's does, through the same `EmbeddingService.embed`
  as the Embed RPC (the default use case: its serving embedder, its batcher shared with
  gRPC callers, the shadow's sampling), after the same API keys (the scope of Embed) and
  the same admission: the call runs on the gRPC handler pool and asks the same
  `Admission`, so one cap on concurrent calls counts both transports.
- `GET /v1/models` lists the serving model; `GET /health` is 200 while serving and 503 once
  the server drains.

Errors take OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`. A domain
error's gRPC status (the one table, `interceptors.STATUS_OF`) becomes an HTTP status by the
mapping google.rpc.Code documents, and `code` is that gRPC status in lower case, so callers
of either transport read the same word; 429 carries Retry-After. Anything else is a bug:
500, logged with its traceback and a request id to quote.

Two choices differ from OpenAI's API. `model` may be any string, as Text Embeddings
Inference allows: clients send their own defaults (`text-embedding-ada-002`), the server
embeds with the one model it serves, and the reply's `model` names the embedder that
answered (name@version). Token ids as input are refused: they are another tokenizer's ids
(tiktoken's) and would mean nothing to this model.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import grpc
import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ragplane.core.errors import InvalidArgument, ResourceExhausted, Unavailable
from ragplane.server.admission import Admission
from ragplane.server.auth import KeyStore
from ragplane.server.embedding.service import EmbeddingService, EmbedResult
from ragplane.server.interceptors import request_id, status_of
from ragplane.server.metrics import Metrics

log = logging.getLogger(__name__)

#: The RPCs whose scopes the routes need: an embedding needs what Embed needs.
EMBED_RPC = "/ragplane.v1.EmbedService/Embed"
INFO_RPC = "/ragplane.v1.EmbedService/Info"

#: gRPC status -> HTTP status, as google.rpc.Code documents them.
HTTP_STATUS_OF: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

#: OpenAI's error `type` per HTTP status; any other status is a "server_error".
_TYPE_OF = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

_JSON_TYPE = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


class FieldError(InvalidArgument):
    """Bad input at one field of the body: OpenAI's `param` (None: the body as a whole)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


class BodyTooLarge(Exception):
    """The body is over the limit (413); not a domain error: only HTTP has bodies."""


@dataclass(frozen=True)
class EmbeddingsRequest:
    texts: list[str]
    base64: bool  # encoding_format "base64": little-endian float32, as OpenAI
    # TEI's choice: true (the default) cuts a text at the model's window, as the gRPC Embed
    # does; false refuses a longer one with 400, as OpenAI's API does
    truncate: bool = True


def parse_embeddings(body: bytes, dim: int) -> EmbeddingsRequest:
    """The body of `POST /v1/embeddings` -> what to embed; FieldError on anything we do not
    serve. The texts' limits (count, bytes, empty) are `EmbeddingService`'s to check."""
    try:
        data = json.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise FieldError(None, f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FieldError(None, "the body must be a JSON object with `input` and `model`")
    if "input" not in data:
        raise FieldError("input", "input is missing; send a string or an array of strings")
    texts = _texts(data["input"])
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise FieldError("model", f"model must be a string, not {_json_type(model)}")
    fmt = data.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise FieldError(
            "encoding_format", f"encoding_format {fmt!r} is not supported; use float or base64"
        )
    dims = data.get("dimensions")
    if dims is not None and (type(dims) is not int or dims != dim):
        raise FieldError(
            "dimensions",
            f"dimensions {dims!r} is not supported: this model's vectors have {dim} "
            f"dimensions and are not shortened; omit dimensions or send {dim}",
        )
    truncate = data.get("truncate", True)
    if type(truncate) is not bool:
        raise FieldError("truncate", f"truncate must be true or false, not {_json_type(truncate)}")
    return EmbeddingsRequest(texts, base64=fmt == "base64", truncate=truncate)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise FieldError(
            "input", f"input must be a string or an array of strings, not {_json_type(value)}"
        )
    if any(isinstance(x, list) for x in value) or (value and all(type(x) is int for x in value)):
        raise FieldError(
            "input",
            "input as token ids is not supported: they would be another tokenizer's ids, "
            "meaningless to this model; send the text (LangChain's OpenAIEmbeddings: "
            "check_embedding_ctx_length=False)",
        )
    for i, x in enumerate(value):
        if not isinstance(x, str):
            raise FieldError("input", f"input[{i}] must be a string, not {_json_type(x)}")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return _JSON_TYPE.get(type(value), type(value).__name__)


def encode_embeddings(result: EmbedResult, as_base64: bool) -> bytes:
    """OpenAI's reply: one `embedding` per text, in input order, and the tokens counted by
    the embedder's tokenizer (the token_counts the Embed RPC reports).

    The vectors' JSON is written here rather than by `json`: floats with 9 significant
    digits, which give back every float32 exactly, are a third shorter and about twice as
    quick to write as the 17 of `json`'s float64 repr, and base64 needs no escaping."""
    if not np.isfinite(result.vectors).all():
        raise ValueError(f"{result.embedder} returned a vector that is not finite")
    if as_base64:
        le = result.vectors.astype("<f4", copy=False)
        values = ['"' + base64.b64encode(row.tobytes()).decode("ascii") + '"' for row in le]
    else:
        values = [
            "[" + ",".join(map(format, row, repeat(".9g"))) + "]" for row in result.vectors.tolist()
        ]
    data = ",".join(
        f'{{"object":"embedding","index":{i},"embedding":{v}}}' for i, v in enumerate(values)
    )
    tokens = sum(result.token_counts)
    tail = _json(
        {"model": result.embedder, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )
    return b'{"object":"list","data":[' + data.encode() + b"]," + tail[1:]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def error_body(status: int, message: str, code: str, param: str | None = None) -> bytes:
    error = {"message": message, "type": _TYPE_OF.get(status, "server_error"), "param": param}
    return _json({"error": {**error, "code": code}})


class OpenAIApi:
    """The routes, over the services a server already runs. `app` is the ASGI app."""

    def __init__(
        self,
        embedding: EmbeddingService,
        keys: KeyStore,
        metrics: Metrics,
        admission: Admission,
        *,
        max_body_bytes: int,
        started_at: float | None = None,
        mounts: Sequence[BaseRoute] = (),  # more apps on the port: the console (/console)
    ) -> None:
        self.embedding = embedding
        self.keys = keys
        self.metrics = metrics
        self.admission = admission
        self.max_body_bytes = max_body_bytes
        self.started_at = int(started_at if started_at is not None else time.time())
        self.draining = False  # set when the server stops: new calls get 503
        self.app = Starlette(
            routes=[
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                *mounts,
            ],
            exception_handlers={HTTPException: self._no_route},
        )

    async def embeddings(self, request: Request) -> Response:
        return await self._call(request, "/v1/embeddings", EMBED_RPC, self._embed)

    async def models(self, request: Request) -> Response:
        return await self._call(request, "/v1/models", INFO_RPC, self._models)

    async def health(self, request: Request) -> Response:
        if self.draining:
            return self._error(Unavailable("the server is shutting down"), "/health")
        return Response(_json({"status": "ok"}), media_type="application/json")

    def _embed(self, body: bytes) -> bytes:
        """On a handler thread: parse, embed, encode (JSON of many floats is CPU work that
        would stall the event loop)."""
        req = parse_embeddings(body, self.embedding.dim)
        try:
            result = self.embedding.embed(req.texts, truncate=req.truncate,
                                          allow_empty_text=False, field="input")
        except InvalidArgument as exc:  # the texts' limits: the field is `input`
            raise FieldError("input", str(exc)) from None
        return encode_embeddings(result, req.base64)

    def _models(self, _body: bytes) -> bytes:
        e = self.embedding.serving_embedder()
        model = {
            "id": e.model,
            "object": "model",
            "created": self.started_at,
            "owned_by": "ragplane",
            "embedder": e.identity,
            "dimensions": e.dim,
            "max_input_tokens": e.max_seq_length,
        }
        return _json({"object": "list", "data": [model]})

    async def _call(
        self, request: Request, route: str, rpc: str, work: Callable[[bytes], bytes]
    ) -> Response:
        """What every API route does around its `work`: the request id, draining, the API
        key, admission, the body, the handler pool, errors in OpenAI's shape, metrics."""
        t0 = time.perf_counter()
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex[:16]
        request_id.set(rid)
        try:
            if self.draining:
                raise Unavailable("the server is shutting down; retry on another instance")
            self.keys.check(rpc, request.headers.get("authorization", ""), sent_as="header")
            if not self.admission.admit():
                raise ResourceExhausted(self.admission.message())
            body = await self._body(request) if request.method == "POST" else b""
            ctx = contextvars.copy_context()  # the request id and principal, on the pool
            loop = asyncio.get_running_loop()
            content = await loop.run_in_executor(self.admission.pool, ctx.run, work, body)
            response = Response(content, media_type="application/json")
        except Exception as exc:
            response = self._error(exc, route)
        response.headers["x-request-id"] = rid
        seconds = time.perf_counter() - t0
        log.debug("%s %s %d %.2fms", request.method, route, response.status_code, seconds * 1e3)
        self.metrics.observe_http(route, response.status_code, seconds)
        return response

    async def _body(self, request: Request) -> bytes:
        """The body, refused (413) past `max_body_bytes`. A body up to twice the limit is
        read to its end and dropped, so that a client still writing it reads the 413
        rather than a reset connection; a longer one is refused by its Content-Length
        before any of it is read, or cut off as it streams in."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > 2 * limit:
            raise BodyTooLarge(f"the body is {declared} bytes; the limit is {limit} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > 2 * limit:
                break
        if size > limit:
            raise BodyTooLarge(f"the body is over the limit of {limit} bytes")
        return b"".join(chunks)

    def _error(self, exc: Exception, route: str) -> Response:
        headers: dict[str, str] = {}
        code = status_of(exc)
        if isinstance(exc, BodyTooLarge):
            status, name, message = 413, "request_too_large", f"{exc} (max_message_bytes)"
        elif code is None:
            rid = request_id.get()
            log.error("bug in %s (request %s)", route, rid, exc_info=exc)
            status, name = 500, "internal"
            message = f"internal error (request id {rid}); this is a bug"
        else:
            status, name, message = HTTP_STATUS_OF.get(code, 500), code.name.lower(), str(exc)
        if isinstance(exc, ResourceExhausted):
            headers["retry-after"] = str(max(1, math.ceil(exc.retry_after)))
        if status == 401:
            headers["www-authenticate"] = "Bearer"
        body = error_body(status, message, name, getattr(exc, "param", None))
        return Response(body, status, headers, media_type="application/json")

    async def _no_route(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        name = "not_found" if exc.status_code == 404 else "method_not_allowed"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        body = error_body(exc.status_code, message, name)
        return Response(body, exc.status_code, exc.headers, media_type="application/json")
