"""Run inside a network namespace with no route out (tests/web/test_docs_offline.py): serve the
dashboard on the namespace's loopback, open /docs in Debian's chromium with nothing blocked
by the test, and print as JSON what the page asked for and whether Swagger UI drew the API.

Usage: python -m tests.web.docs_offline ARCHIVE_URL PORT SCREENSHOT"""

from __future__ import annotations

import json
import sys
from typing import Any

from iepm.web.server import serve_in_background
from testkit.browser import ARGS, CHROMIUM


def main(archive_url: str, port: int, screenshot: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    handle = serve_in_background(archive_url, "127.0.0.1", port)
    requests: list[str] = []
    failed: list[str] = []
    errors: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(30_000)
                page.on("request", lambda r: requests.append(r.url))
                page.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" else None,
                )
                page.goto(f"{handle.url}docs")
                page.locator(".opblock-summary-path", has_text="/api/v1/results").first.wait_for()
                operations = page.locator(".opblock").count()
                page.screenshot(path=screenshot, full_page=False)
            finally:
                browser.close()
    finally:
        handle.stop()
    return {"operations": operations, "requests": requests, "failed": failed, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
