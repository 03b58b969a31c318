"""The documentation site (mkdocs.yml, docs/): the strict build passes on the repository's pages and fails on a
broken link and on a broken anchor, the README's links into docs/ land on pages and headings that exist, and the
built site renders in headless Chromium with its navigation and a search box that finds a page.

`mkdocs build --strict` turns every warning into an error, and mkdocs.yml's `validation` makes a link to a missing
page and an anchor no heading has a warning: the two failing builds below show that a docs change which breaks one
fails CI. The README is not a page of the site (GitHub renders it), so its links are checked here against the built
site's pages and heading ids. The tests skip, saying why, where the `docs` extra or Chromium is not installed.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: seconds a build may take here before the test calls it hung (one takes 5-10 s on 2 cores)
BUILD_TIMEOUT = 300


def _need_mkdocs() -> None:
    for module, package in (("mkdocs", "mkdocs"), ("material", "mkdocs-material"),
                            ("mkdocstrings_handlers.python", "mkdocstrings-python")):
        pytest.importorskip(module, reason=f"{package} is not installed (pip install -e '.[docs]')")


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the project at `root` (its mkdocs.yml, docs/, README.md) into `site`."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(root / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The repository's site, built strictly once for this module (the build's seconds in the test log)."""
    _need_mkdocs()
    out = tmp_path_factory.mktemp("site")
    t0 = time.perf_counter()
    r = build(REPO, out)
    print(f"mkdocs build --strict: {time.perf_counter() - t0:.1f} s")
    assert r.returncode == 0, f"the strict build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return out


def test_the_strict_build_passes_with_every_page_and_the_api_reference(site):
    pages = [p.relative_to(site).parent.as_posix() for p in site.rglob("index.html")]
    for page in ("getting-started", "selftrain", "trace", "findings", "decisions", "api/configs", "api/methods"):
        assert page in pages, (page, sorted(pages))
    api = (site / "api" / "configs" / "index.html").read_text(encoding="utf-8")
    # the reference is generated from the source: a class's docstring and a field's --help text (docs/_griffe)
    assert "SelfTrainConfig" in api and "LoraTrainConfig" in api and "GeneratorConfig" in api
    assert "Z, self-training iterations" in api
    methods = (site / "api" / "methods" / "index.html").read_text(encoding="utf-8")
    assert "A method&#39;s registry entry" in methods or "A method's registry entry" in methods
    # the README's quick start is on the site, taken from the README itself
    start = re.sub(r"<[^>]+>", "", (site / "getting-started" / "index.html").read_text(encoding="utf-8"))
    assert "accelerate launch recipes/selftrain.py" in start and "--8&lt;--" not in start


def _project_copy(tmp_path: Path) -> Path:
    """A copy of the docs and mkdocs.yml beside links to the README and the package (the API reference reads it)."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(REPO / "docs", root / "docs")
    for name in ("README.md", "knowtrace_train"):
        (root / name).symlink_to(REPO / name)
    return root


def test_a_broken_link_fails_the_strict_build(tmp_path):
    _need_mkdocs()
    root = _project_copy(tmp_path)
    page = root / "docs" / "methods.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the old page](no-such-page.md).\n", encoding="utf-8")
    r = build(root, tmp_path / "site")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    assert "no-such-page.md" in out and "not found among documentation files" in out, out[-2000:]


def test_a_broken_anchor_fails_the_strict_build(tmp_path):
    _need_mkdocs()
    root = _project_copy(tmp_path)
    page = root / "docs" / "methods.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [a heading](selftrain.md#no-such-heading).\n",
                    encoding="utf-8")
    r = build(root, tmp_path / "site")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    assert "does not contain an anchor '#no-such-heading'" in out, out[-2000:]


def test_the_readmes_links_into_docs_land_on_pages_and_headings_that_exist(site):
    """GitHub renders the README, so its links are relative to the repository root: docs/<page>.md#<heading id>."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)\s]+)\)", readme)
    assert len(links) >= 10, links
    bad = []
    for link in links:
        path, _, anchor = link.partition("#")
        if not (REPO / path).exists():
            bad.append(f"{link}: no file {path}")
            continue
        if path.endswith(".md"):
            page = path[len("docs/"):-len(".md")]
            html = (site / ("" if page == "index" else page) / "index.html").read_text(encoding="utf-8")
            if anchor and f'id="{anchor}"' not in html:
                bad.append(f"{link}: no heading with id {anchor!r} on {page}")
    assert not bad, bad


# -- the built site in a real browser ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (the search runs in a web worker, which a file:// page may not start)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    from chromium_helpers import Browser, find_chromium

    path, why = find_chromium()
    if path is None:
        pytest.skip(f"no headless Chromium: {why}")
    pytest.importorskip("websocket", reason="websocket-client is not installed (pip install -e '.[dev]')")
    b = Browser(path)
    yield b
    b.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    """Where the browser tests leave their screenshots: $KT_TEST_ARTIFACTS, else pytest's tmp."""
    env = os.environ.get("KT_TEST_ARTIFACTS")
    path = Path(env) if env else tmp_path_factory.mktemp("docs-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _page_state(browser) -> dict:
    return browser.eval("""(() => ({
        title: document.title,
        h1: (document.querySelector('article h1') || {}).textContent || null,
        navLinks: [...document.querySelectorAll('nav.md-nav--primary a.md-nav__link')].map(a => a.textContent.trim()),
        search: !!document.querySelector('input.md-search__input'),
        images: [...document.querySelectorAll('article img')].map(i => [i.getAttribute('src'), i.naturalWidth]),
    }))()""")


def _wait(browser, expression: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = browser.eval(expression)
        if value:
            return value
        time.sleep(0.1)
    return browser.eval(expression)


def test_the_start_page_renders_with_its_navigation_and_a_search_that_finds_a_page(served, browser, artifacts):
    browser.open(served + "/")
    state = _page_state(browser)
    assert state["h1"] and "knowtrace-train" in state["h1"], state
    for entry in ("Getting started", "TRACE", "DoG", "The findings, and where each lives", "Configs"):
        assert entry in state["navLinks"], (entry, state["navLinks"])
    assert state["search"], "no search box"
    browser.screenshot(artifacts / "docs_start.png")
    # a real search: click into the box and type; the worker indexes the site and lists the pages that match
    browser.click("input.md-search__input")
    # the worker says when its index is ready: the result list's meta line leaves "Initializing search"
    meta = _wait(browser, """(() => { const m = document.querySelector('.md-search-result__meta');
        const t = m ? m.textContent.trim() : ''; return t && !/initializ/i.test(t) ? t : null; })()""", timeout=60)
    assert meta, "the search index never became ready"
    browser.type("backtracing")
    hits = _wait(browser, """(() => { const r = [...document.querySelectorAll('.md-search-result__item a')];
        return r.length ? r.map(a => a.getAttribute('href')) : null; })()""")
    assert hits and any("backtracing" in h for h in hits), hits
    browser.screenshot(artifacts / "docs_search.png")
    assert not browser.errors(), browser.errors()


def test_a_method_page_renders_with_its_navigation_search_box_and_figures(served, browser, artifacts):
    browser.open(served + "/trace/")
    state = _page_state(browser)
    assert state["h1"] and state["h1"].strip().startswith("TRACE"), state
    assert "TRACE" in state["title"] and "Getting started" in state["navLinks"] and state["search"], state
    browser.open(served + "/report/")
    images = _wait(browser, """(() => { const i = [...document.querySelectorAll('article img')];
        return i.length && i.every(x => x.complete) ? i.map(x => [x.getAttribute('src'), x.naturalWidth]) : null; })()""")
    assert images and all(width > 0 for _, width in images), json.dumps(images)
    browser.screenshot(artifacts / "docs_report_page.png")
    assert not browser.errors(), browser.errors()
