"""The console in a real browser (headless chromium through Selenium): sign in with a
key, a collection made through the API listed with its count, the playground's top 5 the
Search RPC's with the chunk marked at the RPC's offsets, the flip page's charts drawn
from live shadow traffic, what a read-only key is shown, and a wrong key refused. Each
page is saved as a 1280x800 screenshot under test-artifacts/console/."""

from __future__ import annotations

import urllib.parse

import pytest

from ragplane.v1 import common_pb2, index_pb2, search_pb2
from tests.console.browser import chrome, screenshot
from tests.console.conftest import document

pytestmark = pytest.mark.e2e

# words from the middle of one document (a chunk past its first), so lexical search (all
# the words) finds it and its chunk's offsets are not 0
QUERY = " ".join(document(3).split()[400:406])


@pytest.fixture(scope="module")
def browser():
    driver = chrome()
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def by_css(driver, css):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def sign_in(driver, console, key):
    driver.delete_all_cookies()
    driver.get(console.url + "/login")
    by_css(driver, "#key")[0].send_keys(key)
    by_css(driver, "#login button")[0].click()
    # the click does not wait for the navigation: a page asked for meanwhile would go
    # without the cookie the sign-in sets
    wait_for(driver, "return document.readyState === 'complete' && "
                     "!!document.querySelector('#who, #login-error')")


def wait_for(driver, script, timeout=30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script))


def test_a_wrong_key_is_refused(browser, console):
    browser.delete_all_cookies()
    browser.get(console.url + "/collections")
    assert browser.current_url.startswith(console.url + "/login")
    sign_in(browser, console, "rpk_0000_wrong")
    assert "unknown or revoked API key" in by_css(browser, "#login-error")[0].text
    screenshot(browser, "login")
    browser.get(console.url + "/collections")
    assert "/login" in browser.current_url  # no cookie was set


def test_sign_in_lists_the_collection_with_its_count(browser, console):
    sign_in(browser, console, console.admin)
    assert browser.current_url.endswith("/console/collections")
    row = by_css(browser, 'tr[data-collection="docs"]')[0]
    info = console.srv.stubs.index.DescribeCollection(
        index_pb2.DescribeCollectionRequest(name="docs"), metadata=console.md())
    assert row.find_element("css selector", ".count").text == f"{info.count:,}" == "30"
    screenshot(browser, "collections")
    browser.get(console.url + "/collections/docs")
    ids = [td.text for td in by_css(browser, "#items tbody td:first-child")]
    assert ids[:3] == ["doc-0", "doc-1", "doc-2"] and len(ids) == 30
    screenshot(browser, "collection")


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_playground_shows_the_search_rpcs_top_5_with_its_chunks(browser, console, mode):
    sign_in(browser, console, console.admin)
    pb_mode = {"dense": common_pb2.SEARCH_MODE_DENSE, "lexical": common_pb2.SEARCH_MODE_LEXICAL,
               "hybrid": common_pb2.SEARCH_MODE_HYBRID}[mode]
    rpc = console.srv.stubs.search.Search(search_pb2.SearchRequest(
        collection="docs", text=QUERY, top_k=5, mode=pb_mode, include_text=True),
        metadata=console.md())
    assert len(rpc.hits) == 5
    qs = urllib.parse.urlencode({"collection": "docs", "text": QUERY, "top_k": 5})
    browser.get(f"{console.url}/playground?{qs}")
    # each mode's column loads its own results (htmx), all three at once
    wait_for(browser, f"return document.querySelector('#mode-{mode} .results')")
    hits = by_css(browser, f"#mode-{mode} article.hit")
    assert [h.get_attribute("data-id") for h in hits] == [h.id for h in rpc.hits]
    for shown, hit in zip(hits, rpc.hits, strict=True):
        marks = shown.find_elements("css selector", "mark")
        chunk = hit.chunks[0]
        assert [(int(m.get_attribute("data-start")), int(m.get_attribute("data-end")))
                for m in marks] == [(chunk.start, chunk.end)]
        assert marks[0].text.split() == hit.text[chunk.start : chunk.end].split()
    if mode == "hybrid":
        wait_for(browser, "return document.querySelectorAll('.results').length === 3")
        screenshot(browser, "playground")


def test_the_flip_page_draws_its_charts(browser, console):
    sign_in(browser, console, console.admin)
    browser.get(console.url + "/flip")
    assert by_css(browser, "#status-embeddings")[0].text == "shadow-active"
    drawn = wait_for(browser, "const c = document.querySelector('.charts');"
                              "return c && c.dataset.drawn && Number(c.dataset.drawn);")
    assert drawn >= 3
    painted = browser.execute_script("""
        return [...document.querySelectorAll('.charts canvas')].map((c) => {
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
          return n; });""")
    assert painted and all(n > 500 for n in painted), painted
    gates = [td.text for td in by_css(browser, "table.gates tbody tr td:first-child")]
    assert gates[:3] == ["G1 agreement", "G2 performance", "G3 stability"]
    assert by_css(browser, "#flip-embeddings")  # an admin key sees Flip
    browser.execute_script("window.scrollTo(0, document.querySelector('.charts').offsetTop - 80)")
    screenshot(browser, "flip")


def test_the_store_page(browser, console):
    sign_in(browser, console, console.admin)
    browser.get(console.url + "/store")
    assert by_css(browser, "#store-kind")[0].text.split()[0] in ("embedded", "PostgreSQL")
    rows = [tr.text for tr in by_css(browser, "#namespaces tbody tr")]
    assert any(r.startswith("notes 1") for r in rows), rows
    screenshot(browser, "store")


def test_a_read_only_key_sees_no_working_admin_action(browser, console):
    sign_in(browser, console, console.reader)
    assert "read" == by_css(browser, "#scopes")[0].text
    for page in ("/collections/docs", "/flip"):
        browser.get(console.url + page)
        forms = [f.get_attribute("action") for f in by_css(browser, "form[method=post]")]
        assert forms == [console.url + "/logout"], (page, forms)
        assert by_css(browser, "#no-admin")
    # a forged action from this very page, with its cookie and CSRF token, is refused
    status = browser.execute_async_script("""
        const done = arguments[0];
        const csrf = document.querySelector('meta[name=csrf-token]').content;
        fetch('/console/flip/embeddings/unflip', {method: 'POST',
              headers: {'content-type': 'application/x-www-form-urlencoded'},
              body: 'csrf=' + csrf}).then((r) => done(r.status));""")
    assert status == 403


def test_an_admin_rebuilds_and_deletes_behind_confirmations(browser, console):
    md = console.md()
    idx = console.srv.stubs.index
    idx.CreateCollection(index_pb2.CreateCollectionRequest(name="scratch"), metadata=md)
    idx.Upsert(index_pb2.UpsertRequest(collection="scratch", items=[
        common_pb2.Item(id=str(i), text=f"note number {i}") for i in range(20)]), metadata=md)
    sign_in(browser, console, console.admin)
    browser.get(console.url + "/collections/scratch")
    by_css(browser, "#rebuild-form button")[0].click()
    browser.switch_to.alert.accept()
    wait_for(browser, "const j = document.querySelector('#job');"
                      "return j && j.dataset.done === 'yes';")
    assert "Rebuild finished" in by_css(browser, "#rebuild-progress")[0].text
    assert idx.DescribeCollection(index_pb2.DescribeCollectionRequest(name="scratch"),
                                  metadata=md).generation == 2
    by_css(browser, "#delete-form input[name=confirm]")[0].send_keys("scratch")
    by_css(browser, "#delete-form button")[0].click()
    browser.switch_to.alert.dismiss()  # cancelled: nothing happens
    assert browser.current_url.endswith("/collections/scratch")
    by_css(browser, "#delete-form button")[0].click()
    browser.switch_to.alert.accept()
    assert browser.current_url.endswith("/console/collections")
    assert not by_css(browser, 'tr[data-collection="scratch"]')
