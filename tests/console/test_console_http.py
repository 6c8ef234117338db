"""The console over plain HTTP (no browser): keys and scopes as the RPCs judge them, a
refused wrong key, forged actions refused on the server (no admin scope, no CSRF token),
the assets served from the package, and pages built from the domain services."""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from ragplane.v1 import index_pb2

pytestmark = pytest.mark.e2e


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def call(url: str, *, key: str = "", form: dict | None = None) -> tuple[int, dict, str]:
    """(status, headers, body) of one request, redirects not followed."""
    headers = {"cookie": f"ragplane_console={key}"} if key else {}
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with _opener.open(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read().decode()


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf-token" content="([0-9a-f]+)"', html).group(1)


def test_no_key_goes_to_sign_in_and_a_wrong_key_is_refused(console):
    status, headers, _ = call(console.url + "/collections")
    assert status == 303 and headers["location"].startswith("/console/login?next=")
    status, headers, _ = call(console.url + "/collections", key="rpk_nope_nope")
    assert status == 303 and "/console/login" in headers["location"]
    status, headers, body = call(console.url + "/login", form={"key": "rpk_bad_key"})
    assert status == 401 and "unknown or revoked API key" in body
    assert "set-cookie" not in {k.lower() for k in headers}


def test_sign_in_sets_a_strict_http_only_cookie(console):
    status, headers, _ = call(console.url + "/login", form={"key": console.reader,
                                                           "next": "/console/store"})
    cookie = next(v for k, v in headers.items() if k.lower() == "set-cookie")
    assert status == 303 and headers["location"] == "/console/store"
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "Path=/console" in cookie


def test_pages_show_the_services_data(console):
    status, _, body = call(console.url + "/collections", key=console.reader)
    assert status == 200 and 'data-collection="docs"' in body
    status, _, body = call(console.url + "/collections/docs?page=0", key=console.reader)
    assert status == 200 and "doc-0" in body and 'id="next"' not in body  # 30 < a page
    status, _, body = call(console.url + "/store", key=console.reader)
    assert status == 200 and ("embedded" in body or "PostgreSQL" in body)
    assert ">notes<" in body
    status, _, body = call(console.url + "/collections/nope", key=console.reader)
    assert status == 404 and "nope" in body


def test_a_read_only_key_sees_no_action_and_forged_ones_are_refused(console):
    _, _, page = call(console.url + "/collections/docs", key=console.reader)
    assert "/delete" not in page and "/rebuild" not in page and 'id="no-admin"' in page
    token = csrf_of(page)
    for path in ("/collections/docs/delete", "/collections/docs/rebuild",
                 "/flip/embeddings/flip", "/flip/embeddings/unflip"):
        status, _, body = call(console.url + path, key=console.reader,
                               form={"csrf": token, "confirm": "docs"})
        assert status == 403 and "needs the &#39;admin&#39; scope" in body, (path, body)
    info = console.srv.stubs.index.DescribeCollection(
        index_pb2.DescribeCollectionRequest(name="docs"), metadata=console.md())
    assert info.count > 0  # still there
    assert console.srv.runtime.shadow.serving("embeddings") == "fake@1"


def test_an_admin_form_without_its_csrf_token_is_refused(console):
    status, _, body = call(console.url + "/collections/docs/delete", key=console.admin,
                           form={"confirm": "docs"})
    assert status == 403 and "CSRF" in body
    status, _, body = call(console.url + "/collections/docs/delete", key=console.admin,
                           form={"csrf": "0" * 32, "confirm": "docs"})
    assert status == 403


def test_flip_is_refused_with_the_gates_reasons(console):
    _, _, page = call(console.url + "/flip", key=console.admin)
    assert 'id="flip-embeddings"' in page
    status, _, body = call(console.url + "/flip/embeddings/flip", key=console.admin,
                           form={"csrf": csrf_of(page)})
    assert status == 400 and "not flip-eligible" in body and "G1 agreement" in body
    assert console.srv.runtime.shadow.serving("embeddings") == "fake@1"


def test_assets_come_from_the_package(console):
    for asset in ("vendor/chart.umd.min.js", "vendor/htmx.min.js", "console.js",
                  "console.css", "vendor/chart.js.LICENSE.md", "vendor/htmx.LICENSE"):
        status, _, body = call(console.url + "/static/" + asset)
        assert status == 200 and body, asset
    _, _, page = call(console.url + "/flip", key=console.reader)
    assert "http://" not in re.sub(r"<script type=\"application/json\".*?</script>", "", page,
                                   flags=re.S).replace("http://www.w3.org", "")


def test_a_flipped_case_shows_its_watch_and_unflips_from_the_console(console):
    shadow = console.srv.runtime.shadow
    shadow.flip("embeddings", force=True)  # the gates here never hold: forced, as an admin may
    try:
        _, _, page = call(console.url + "/flip", key=console.admin)
        assert 'id="status-embeddings">flipped<' in page and "The watch since the flip" in page
        assert 'id="unflip-embeddings"' in page and 'id="flip-embeddings"' not in page
        status, headers, _ = call(console.url + "/flip/embeddings/unflip", key=console.admin,
                                  form={"csrf": csrf_of(page)})
        assert status == 303 and headers["location"] == "/console/flip"
        assert shadow.serving("embeddings") == "fake@1"
        _, _, page = call(console.url + "/flip", key=console.admin)
        assert "admin unflip" in page  # the history names it
    finally:
        shadow.unflip("embeddings")


def test_without_keys_a_loopback_server_opens_the_console_and_says_so(tmp_path):
    from ragplane.testkit.harness import InProcessServer
    from tests.console.conftest import free_port

    srv = InProcessServer(tmp_path / "data", http_port=free_port())
    try:
        status, _, body = call(f"http://127.0.0.1:{srv.runtime.http.port}/console/collections")
        assert status == 200 and "authentication is off" in body
    finally:
        srv.stop()


def test_playground_columns_take_filters_groups_and_vectors(console):
    base = console.url + "/playground/results?"
    q = {"collection": "docs", "text": "attribute access", "top_k": 3}
    flt = '{"must": [{"field": "n", "op": "lt", "value": 2}]}'
    _, _, body = call(base + urllib.parse.urlencode({**q, "mode": "dense", "filter": flt}),
                      key=console.reader)
    assert sorted(re.findall(r'data-id="([^"]+)"', body)) == ["doc-0", "doc-1"]
    _, _, body = call(base + urllib.parse.urlencode({**q, "mode": "hybrid", "group_by": "lang"}),
                      key=console.reader)
    assert '<h3 class="group">en</h3>' in body
    vec = ",".join(["0.125"] * 64)
    _, _, body = call(base + urllib.parse.urlencode({**q, "text": "", "vector": vec,
                                                     "mode": "dense"}), key=console.reader)
    assert len(re.findall(r'data-id="', body)) == 3
    _, _, body = call(base + urllib.parse.urlencode({**q, "text": "", "vector": vec,
                                                     "mode": "lexical"}), key=console.reader)
    assert 'class="error"' in body and "send text" in body
