"""Headless Chromium for ``report.html``: the Debian ``chromium`` package driven by Playwright for Python.

Used by ``python -m parity.report.html --screenshot`` and by ``tests/parity/test_report_html.py``.
Playwright's own browser download (``playwright install``) is never used: the browser is the
system's (:data:`CHROMIUM`, ``apt-get install chromium``), started with the flags below, a fresh
empty profile, and every request that is not ``file://`` aborted and recorded, so a page that tries
the network is seen (Playwright: https://playwright.dev/python/docs/api/class-browsertype#browser-type-launch).
"""

from __future__ import annotations

# Deferred imports: playwright is an optional dependency (the dev extra); it is imported when a browser starts.

import contextlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

CHROMIUM = os.environ.get("PARITY_CHROMIUM", "/usr/bin/chromium")
"""The Chromium executable (``PARITY_CHROMIUM`` overrides the Debian package's path)."""

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def missing() -> str | None:
    """Why no browser can start here (a sentence), or None when Chromium and Playwright are both there."""
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set PARITY_CHROMIUM)"
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python is not installed (pip install playwright; the dev extra has it)"
    return None


@contextlib.contextmanager
def chromium():
    """Yield a Playwright ``BrowserContext`` on :data:`CHROMIUM` with a new empty profile
    (``launch_persistent_context`` on a fresh ``--user-data-dir``); closed afterwards.

    Raises:
        RuntimeError: :func:`missing` says why no browser can start.
    """
    why = missing()
    if why:
        raise RuntimeError(why)
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="parity-chromium-")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                            args=list(FLAGS), viewport={"width": 1400, "height": 1000})
            try:
                yield browser
            finally:
                browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def open_page(browser, path: Path):
    """Open ``path`` (a file) in a new page of ``browser`` (from :func:`chromium`); return ``(page, log)``.

    ``log`` has ``"requests"`` (every URL that was not ``file://``, aborted) and ``"errors"`` (console
    errors and uncaught exceptions). The page is loaded and its script has run (``body[data-ready]``).
    """
    log: dict[str, list[str]] = {"requests": [], "errors": []}
    page = browser.new_page()

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            log["requests"].append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("console", lambda m: log["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: log["errors"].append(str(e)))
    page.goto(Path(path).resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=20_000)
    return page, log


def screenshot(html_path: Path, png: Path) -> Path:
    """Save a PNG of the page's default view (the live part: controls, numbers and its two charts).

    Raises:
        RuntimeError: no browser (:func:`missing`), or the page made a network request or logged an error.
    """
    with chromium() as browser:
        page, log = open_page(browser, html_path)
        page.wait_for_timeout(300)
        Path(png).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(png), full_page=False)
        if log["requests"] or log["errors"]:
            raise RuntimeError(f"report.html asked for the network or logged errors: {log}")
    return Path(png)
