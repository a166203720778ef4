"""Helpers of the browser tests: Debian's Chromium (apt) driven by Playwright, never
Playwright's own browser download. (Not a conftest.py, for the reason tests/web/web_helpers.py
gives.)"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
#: The flags that work on this project's machines (no sandbox as root, no GPU, no background network).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: ``pytestmark`` of a browser test module: skipped without playwright or without Chromium.
NEEDS_CHROMIUM = [
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None, reason="needs the playwright package (pip install playwright)"
    ),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]


def chromium() -> Iterator[Any]:
    """A headless Chromium, for a module-scoped ``browser`` fixture (``yield from chromium()``);
    Playwright starts it with a fresh, empty profile (its own ``--user-data-dir``)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()
