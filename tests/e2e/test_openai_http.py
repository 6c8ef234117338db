"""The OpenAI-compatible HTTP API against a real server, through the official `openai`
client: the same vectors and token counts as the Embed RPC (fake embedder, and the real
model on ONNX Runtime), OpenAI's error shape and statuses (400, 401, 403, 413, 429 with
Retry-After, 503 while draining), one admission cap shared with gRPC, metrics, and a
graceful drain that lets an in-flight call finish."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import openai
import pytest

from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import embed_pb2

pytestmark = pytest.mark.e2e

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Dynamic batching lets concurrent requests share a forward pass.",
    "hello",
]
ADMIN_KEY = "bootstrap-admin-secret-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path, **overrides) -> InProcessServer:
    return InProcessServer(tmp_path / "data", http_port=free_port(), **overrides)


_clients: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _clients:
        _clients.pop().close()


def client(srv: InProcessServer, key: str = "unused") -> openai.OpenAI:
    """The official client, without retries (a 429 or 503 must reach the test)."""
    url = f"http://127.0.0.1:{srv.runtime.http.port}/v1"
    _clients.append(openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60))
    return _clients[-1]


def request(srv, path, body=None, headers=None) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of one call; `body` a dict (sent as JSON) or bytes."""
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    req = urllib.request.Request(
        f"http://127.0.0.1:{srv.runtime.http.port}{path}", data=data, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), json.loads(e.read())


def grpc_embed(srv, texts):
    r = srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=texts))
    return np.array([v.values for v in r.vectors], dtype=np.float32), r


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """Fake embedder (dim 64), HTTP on, small limits to break."""
    s = start(
        tmp_path_factory.mktemp("openai"),
        max_text_bytes=1000,
        max_batch_texts=16,
        max_item_text_bytes=1 << 16,
        max_message_bytes=1 << 18,
    )
    yield s
    s.stop()


def test_float_and_base64_equal_the_embed_rpc(srv):
    want, rpc = grpc_embed(srv, TEXTS)
    c = client(srv)
    as_float = c.embeddings.create(input=TEXTS, model="any-name", encoding_format="float")
    assert as_float.object == "list" and as_float.model == rpc.embedder == "fake@1"
    assert [d.index for d in as_float.data] == [0, 1, 2]
    assert all(d.object == "embedding" for d in as_float.data)
    got = np.array([d.embedding for d in as_float.data])
    assert got.shape == (3, 64) and cosines(got, want).min() >= 0.99999
    assert np.array_equal(got.astype(np.float32), want)  # 9 digits give float32 back exactly
    n = sum(rpc.token_counts)
    assert (as_float.usage.prompt_tokens, as_float.usage.total_tokens) == (n, n)
    # the client asks for base64 unless told otherwise, and decodes it itself
    as_b64 = c.embeddings.create(input=TEXTS, model="text-embedding-3-small")
    assert np.array_equal(np.array([d.embedding for d in as_b64.data], np.float32), want)
    assert as_b64.usage.prompt_tokens == n


def test_base64_is_little_endian_float32_and_a_string_is_one_input(srv):
    want, rpc = grpc_embed(srv, ["hello"])
    status, _, body = request(
        srv, "/v1/embeddings", {"input": "hello", "model": "m", "encoding_format": "base64"}
    )
    assert status == 200 and len(body["data"]) == 1
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert np.array_equal(np.frombuffer(raw, "<f4"), want[0])
    n = rpc.token_counts[0]
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_the_models_route_health_and_metrics(srv):
    models = client(srv).models.list()
    assert [m.id for m in models.data] == ["fake-hash"]
    assert models.data[0].model_extra["embedder"] == "fake@1"
    status, _, body = request(srv, "/health")
    assert (status, body) == (200, {"status": "ok"})
    registry = srv.runtime.metrics.registry
    ok = {"route": "/v1/embeddings", "status": "200"}
    before = registry.get_sample_value("ragplane_http_requests_total", ok) or 0
    texts = registry.get_sample_value("ragplane_embed_batch_texts_sum")
    client(srv).embeddings.create(input=["one more text"], model="m")
    assert registry.get_sample_value("ragplane_http_requests_total", ok) == before + 1
    assert registry.get_sample_value("ragplane_embed_batch_texts_sum") == texts + 1  # shared
    assert registry.get_sample_value("ragplane_http_request_seconds_count", {"route": "/v1/models"})


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"input": [], "model": "m"}, "input", "input is empty"),
        ({"input": "", "model": "m"}, "input", "input[0] is empty"),
        ({"input": ["a", "  "], "model": "m"}, "input", "input[1] is empty"),
        ({"model": "m"}, "input", "input is missing"),
        ({"input": 7, "model": "m"}, "input", "not a number"),
        ({"input": ["a", None], "model": "m"}, "input", "input[1] must be a string, not null"),
        ({"input": [101, 7592, 102], "model": "m"}, "input", "token ids is not supported"),
        ({"input": [[101, 102]], "model": "m"}, "input", "token ids is not supported"),
        ({"input": ["x"] * 17, "model": "m"}, "input", "the limit is 16"),
        ({"input": ["é" * 501], "model": "m"}, "input", "1002 bytes; the limit is 1000 bytes"),
        ({"input": "a", "model": 3}, "model", "model must be a string"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "use float or base64"),
        ({"input": "a", "dimensions": 32}, "dimensions", "have 64 dimensions"),
        ({"input": "a", "dimensions": "64"}, "dimensions", "omit dimensions or send 64"),
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
    ],
)
def test_bad_input_is_400_in_openai_shape(srv, body, param, words):
    status, _, got = request(srv, "/v1/embeddings", body)
    assert status == 400, got
    error = got["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_argument"
    assert error["param"] == param and words in error["message"], error


def test_through_the_client_errors_keep_their_shape(srv):
    c = client(srv)
    with pytest.raises(openai.BadRequestError) as e:
        c.embeddings.create(input="a", model="m", dimensions=128)
    assert e.value.status_code == 400 and e.value.param == "dimensions"
    assert e.value.code == "invalid_argument" and "64 dimensions" in e.value.body["message"]
    ok = c.embeddings.create(input="a", model="m", dimensions=64, user="someone")
    assert len(ok.data[0].embedding) == 64
    with pytest.raises(openai.BadRequestError, match="max_text_bytes"):
        c.embeddings.create(input=["x" * 1001], model="m")


def test_over_long_input_is_cut_by_default_and_refused_with_truncate_false(srv):
    long = "w " * 300  # 302 tokens of the fake embedder; its window is 256
    status, _, got = request(srv, "/v1/embeddings", {"input": [long, "short"], "model": "m"})
    assert status == 200 and got["usage"]["prompt_tokens"] == 256 + 3
    status, _, got = request(srv, "/v1/embeddings",
                             {"input": ["short", long], "model": "m", "truncate": False})
    assert status == 400 and got["error"]["param"] == "input", got
    assert "input[1] has 302 tokens, over the model's max_seq_length 256" in (
        got["error"]["message"])
    with pytest.raises(openai.BadRequestError, match="truncate is false"):  # as OpenAI answers
        client(srv).embeddings.create(input=long, model="m", extra_body={"truncate": False})
    ok = client(srv).embeddings.create(input="short", model="m", extra_body={"truncate": False})
    assert ok.usage.prompt_tokens == 3
    status, _, got = request(srv, "/v1/embeddings", {"input": "a", "truncate": "no"})
    assert status == 400 and got["error"]["param"] == "truncate"


def test_a_body_over_the_message_limit_is_413(srv):
    too_big = ["w " * 400] * 400  # about 320 KB of JSON; max_message_bytes is 256 KiB
    with pytest.raises(openai.APIStatusError) as e:
        client(srv).embeddings.create(input=too_big, model="m")
    assert e.value.status_code == 413 and e.value.code == "request_too_large"
    assert "262144 bytes" in e.value.body["message"]
    chunked = request(srv, "/v1/embeddings", iter([b'{"input": "', b"x" * (1 << 18), b'"}']))
    assert chunked[0] == 413, chunked
    assert client(srv).embeddings.create(input="still serving", model="m").data


def test_unknown_routes_answer_in_openai_shape(srv):
    status, _, body = request(srv, "/v1/chat/completions", {"model": "m"})
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, _, body = request(srv, "/v1/embeddings")  # GET
    assert status == 405 and body["error"]["code"] == "method_not_allowed"


def test_api_keys_and_scopes_are_the_grpc_ones(tmp_path):
    srv = start(tmp_path, bootstrap_admin_key=ADMIN_KEY)
    try:
        _, reader = srv.runtime.keys.create("default", ["read"], "reads")
        _, writer = srv.runtime.keys.create("default", ["write"], "writes only")
        assert client(srv, reader).embeddings.create(input="hi", model="m").data
        assert client(srv, ADMIN_KEY).models.list().data
        with pytest.raises(openai.AuthenticationError) as e:
            client(srv, "rpk_nope_not-a-key").embeddings.create(input="hi", model="m")
        assert e.value.status_code == 401
        assert e.value.body == {
            "message": "unknown or revoked API key",
            "type": "authentication_error",
            "param": None,
            "code": "unauthenticated",
        }
        status, headers, body = request(srv, "/v1/embeddings", {"input": "hi"})
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert "header `authorization: Bearer <key>`" in body["error"]["message"]
        with pytest.raises(openai.PermissionDeniedError) as e:
            client(srv, writer).embeddings.create(input="hi", model="m")
        assert e.value.code == "permission_denied" and "'read' scope" in e.value.body["message"]
        assert request(srv, "/health")[0] == 200  # probes need no key, as gRPC health
    finally:
        srv.stop()


class GatedEmbedder(FakeEmbedder):
    """The fake, but each pass waits for `gate` (open at start, for the warm-up)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def embed(self, texts, normalize=True):
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return super().embed(texts, normalize)


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_one_admission_cap_for_both_transports_429_with_retry_after(tmp_path):
    embedder = GatedEmbedder()
    srv = start(tmp_path, embedder=embedder, workers=1)  # admits workers * 8 = 8 calls
    pool = ThreadPoolExecutor(8)
    try:
        admission = srv.runtime.http.api.admission
        embedder.gate.clear()
        c = client(srv)
        held = [pool.submit(c.embeddings.create, input=f"t{i}", model="m") for i in range(8)]
        wait_until(lambda: admission.pool.in_flight == 8, "8 HTTP calls in flight")
        with pytest.raises(openai.RateLimitError) as e:
            client(srv).embeddings.create(input="one too many", model="m")
        assert e.value.status_code == 429 and e.value.code == "resource_exhausted"
        assert int(e.value.response.headers["retry-after"]) >= 1
        assert "limit of 8 concurrent calls" in e.value.body["message"]
        with pytest.raises(grpc.RpcError) as g:  # HTTP's calls count against gRPC's too
            srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["grpc"]))
        assert g.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        embedder.gate.set()
        assert [len(f.result().data) for f in held] == [1] * 8
    finally:
        embedder.gate.set()
        pool.shutdown()
        srv.stop()


def test_drain_lets_the_call_in_flight_finish_and_turns_new_ones_away(tmp_path):
    embedder = GatedEmbedder()
    srv = start(tmp_path, embedder=embedder)
    pool = ThreadPoolExecutor(2)
    try:
        c = client(srv)
        embedder.gate.clear()
        embedder.entered.clear()
        in_flight = pool.submit(c.embeddings.create, input="finish me", model="m")
        assert embedder.entered.wait(30)
        srv.runtime.http.api.draining = True  # what drain() sets before closing the listener
        status, _, body = request(srv, "/health")
        assert status == 503 and body["error"]["code"] == "unavailable"
        with pytest.raises(openai.InternalServerError) as e:
            c.embeddings.create(input="too late", model="m")
        assert e.value.status_code == 503 and "shutting down" in e.value.body["message"]
        closing = pool.submit(srv.runtime.http.close)  # waits for the call in flight
        embedder.gate.set()
        assert len(in_flight.result().data[0].embedding) == 64
        closing.result()
        with pytest.raises(openai.APIConnectionError):  # the listener is gone
            c.embeddings.create(input="after", model="m")
    finally:
        embedder.gate.set()
        pool.shutdown()
        srv.stop()


def test_the_real_model_over_http_equals_grpc(tmp_path, onnx_model):
    srv = start(tmp_path, embedder=onnx_model, embedder_name="onnx", batch_max_tokens=512)
    try:
        want, rpc = grpc_embed(srv, TEXTS)
        r = client(srv).embeddings.create(input=TEXTS, model="all-MiniLM-L6-v2")
        got = np.array([d.embedding for d in r.data])
        assert got.shape == (3, 384) and cosines(got, want).min() >= 0.99999
        assert r.model == onnx_model.identity == rpc.embedder
        assert r.usage.prompt_tokens == sum(onnx_model.count_tokens(TEXTS))
        assert list(rpc.token_counts) == onnx_model.count_tokens(TEXTS)
    finally:
        srv.stop()


def test_ragplane_serve_with_http_port_stops_cleanly_on_sigterm(tmp_path):
    from ragplane.testkit.harness import SubprocessServer

    port = free_port()
    srv = SubprocessServer(tmp_path / "data", "--http-port", str(port))
    srv.start()
    try:
        url = f"http://127.0.0.1:{port}/v1"
        with openai.OpenAI(base_url=url, api_key="-", max_retries=0) as c:
            r = c.embeddings.create(input=["over HTTP"], model="m", encoding_format="float")
        want = srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=["over HTTP"])).vectors[0]
        assert r.data[0].embedding == pytest.approx(list(want.values), abs=1e-6)
    finally:
        rc = srv.terminate()
    log = srv.log_path.read_text()
    assert rc == 0 and f"OpenAI-compatible HTTP on :{port}" in log and "stopped cleanly" in log


def test_with_tls_settings_the_api_is_https_with_the_same_certificate(tmp_path):
    import ssl

    import trustme

    from ragplane.server.app import create_server
    from ragplane.server.settings import Settings

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    settings = Settings.from_mapping(
        {
            "port": 0,
            "http_port": free_port(),
            "data_dir": str(tmp_path / "data"),
            "embedder": "fake",
            "koder_toml": "",
            "tls_cert": str(tmp_path / "server.pem"),
            "tls_key": str(tmp_path / "server.key"),
        }
    )
    server, _, runtime = create_server(settings)
    server.start()
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    try:
        https = f"https://127.0.0.1:{runtime.http.port}/v1"
        with openai.OpenAI(
            base_url=https,
            api_key="-",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(verify=trusting),
        ) as c:
            assert len(c.embeddings.create(input="over tls", model="m").data) == 1
        plain = f"http://127.0.0.1:{runtime.http.port}/v1"
        with openai.OpenAI(base_url=plain, api_key="-", max_retries=0) as c:
            with pytest.raises(openai.APIConnectionError):
                c.embeddings.create(input="in the clear", model="m")
    finally:
        server.stop(1).wait()
        runtime.close()


def test_a_taken_http_port_fails_the_start_and_releases_the_data_directory(tmp_path):
    from ragplane.core.errors import InvalidArgument

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidArgument, match=f"cannot bind HTTP 127.0.0.1:{port}"):
            InProcessServer(tmp_path / "data", http_port=port)
    srv = start(tmp_path)  # the same data directory: its lock was let go
    try:
        assert client(srv).embeddings.create(input="hi", model="m").data
    finally:
        srv.stop()
