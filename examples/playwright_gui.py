#!/usr/bin/env python3
"""A GUI agent's environment on Orchard Env: Chromium runs headless inside a sandbox, and the trainer
drives it with Playwright for Python over the Chrome DevTools Protocol through the SDK's port forward.

The sandbox serves a small page (an input box and a button whose click writes the input's text into
``<p id=out>``) with ``python3 -m http.server`` on its loopback, and runs Chromium with remote debugging
on its loopback (port 9222). ``sbx.forward_port(9222)`` gives a local port tunnelling to it through the
gateway (RBAC ``create sandboxes/portforward``); ``connect_over_cdp`` attaches Playwright to that
browser. Playwright opens the page (``127.0.0.1`` is the sandbox's loopback: the browser is in the
sandbox), types, clicks, reads ``#out`` and takes a screenshot. Playwright's own browsers are not needed
(no ``playwright install``): only the ``playwright`` package on the trainer's side.

    pip install ./sdk/python playwright==1.65.2   # from a checkout
    python examples/playwright_gui.py GATEWAY_URL TOKEN NAMESPACE IMAGE

``IMAGE`` needs ``chromium`` and ``python3`` (the real node's ``debian-chromium``: Debian trixie with
``chromium``, ``fonts-dejavu-core`` and ``python3``). Prints one JSON line (the text read back, the
screenshot's size in bytes and its PNG dimensions) and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
import urllib.request

from playwright.sync_api import sync_playwright

from orchard_env import SandboxClient

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>orchard gui</title></head>
<body style="font-family: sans-serif; margin: 40px">
  <h1>Orchard Env GUI check</h1>
  <input id="in" type="text" placeholder="type here" style="font-size: 24px">
  <button id="go" style="font-size: 24px"
          onclick="document.getElementById('out').textContent = document.getElementById('in').value">Copy</button>
  <p id="out" style="font-size: 24px"></p>
</body></html>
"""
#: What the "agent" types; the page copies it into #out when the button is clicked.
TEXT = "hello from the trainer"
VIEWPORT = {"width": 1024, "height": 640}
CDP_PORT = 9222
CHROMIUM = [
    "chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--no-first-run", "--no-default-browser-check", "--remote-debugging-address=127.0.0.1",
    f"--remote-debugging-port={CDP_PORT}", "--user-data-dir=/tmp/chrome", "about:blank",
]


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first one, right after the 8-byte signature)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


def wait_for_cdp(local_port: int, browser, timeout: float = 90.0) -> dict:
    """Polls ``/json/version`` through the forward until Chromium's DevTools answers; fails early
    with Chromium's output when it exited."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{local_port}/json/version", timeout=5) as answer:
                return json.load(answer)
        except (OSError, ValueError) as error:
            last = error
        info = browser.status()
        if not info.running:
            raise SystemExit(f"chromium exited ({info.exit_code}):\n{info.stdout}\n{info.stderr}")
        if time.monotonic() > deadline:
            raise SystemExit(f"chromium's DevTools did not answer within {timeout:.0f} s ({last}):\n{info.stderr}")
        time.sleep(0.5)


def run(client: SandboxClient, image: str) -> dict:
    # Chromium wants a few hundred MiB: ask for them rather than rely on the operator's default memory.
    with client.create(image, generate_name="gui-", cpu="250m", memory="1Gi") as sbx:
        sbx.upload("/srv/page.html", PAGE)
        sbx.start_process(["python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", "/srv", "8000"])
        browser = sbx.start_process(CHROMIUM)
        with sbx.forward_port(CDP_PORT) as cdp:
            version = wait_for_cdp(cdp, browser)
            with sync_playwright() as playwright:
                # http://: Playwright reads /json/version and follows its webSocketDebuggerUrl, which
                # Chromium builds from the Host header it was asked with (127.0.0.1:<local port>).
                chromium = playwright.chromium.connect_over_cdp(f"http://127.0.0.1:{cdp}")
                context = chromium.new_context(viewport=VIEWPORT, device_scale_factor=1)
                page = context.new_page()
                page.goto("http://127.0.0.1:8000/page.html")
                page.fill("#in", TEXT)
                page.click("#go")
                out = page.text_content("#out")
                shot = page.screenshot(type="png")
                context.close()
                chromium.close()
    width, height = png_size(shot)
    return {"browser": version.get("Browser"), "out": out, "screenshot_bytes": len(shot),
            "width": width, "height": height}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gateway", help="gateway URL, e.g. http://localhost:8443")
    parser.add_argument("token", help="bearer token of a user allowed sandboxes and sandboxes/portforward")
    parser.add_argument("namespace")
    parser.add_argument("image", help="image with chromium and python3")
    args = parser.parse_args(argv)
    with SandboxClient(args.gateway, args.token, namespace=args.namespace) as client:
        result = run(client, args.image)
    print(json.dumps(result), flush=True)
    problems = []
    if result["out"] != TEXT:
        problems.append(f"#out is {result['out']!r}, not {TEXT!r}")
    if (result["width"], result["height"]) != (VIEWPORT["width"], VIEWPORT["height"]):
        problems.append(f"the screenshot is {result['width']}x{result['height']}, not the viewport {VIEWPORT}")
    if result["screenshot_bytes"] <= 1000:
        problems.append(f"the screenshot has only {result['screenshot_bytes']} bytes")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
