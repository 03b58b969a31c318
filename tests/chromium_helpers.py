"""Headless Chromium driven through the Chrome DevTools protocol, for the tests of the HTML report and the docs site.

`find_chromium()` returns the browser (Debian's `chromium`; installed with apt-get where it is missing
and the process may install: root), or None with the reason. `Browser` launches it headless on
127.0.0.1 with a throwaway profile, opens a page, evaluates JavaScript, clicks an element with real
mouse events (Input.dispatchMouseEvent at the element's centre), types with real key events and takes
screenshots.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def find_chromium() -> tuple[str | None, str]:
    """(path of the chromium binary or None, why not)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path, ""
    if not shutil.which("apt-get"):
        return None, "chromium is not installed and there is no apt-get to install it"
    if os.geteuid() != 0:
        return None, "chromium is not installed and installing it needs root (apt-get install -y chromium)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if r.returncode != 0:
            return None, f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-300:]}"
    path = shutil.which("chromium")
    return (path, "") if path else (None, "apt-get installed chromium but no `chromium` is on PATH")


class Browser:
    """One headless Chromium with one page, spoken to over its DevTools websocket."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000, timeout: float = 30.0) -> None:
        import websocket  # websocket-client (the dev extra)

        self.profile = tempfile.mkdtemp(prefix="kt-chromium-")
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [binary, *FLAGS, "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._port()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("chromium opened no page")
            time.sleep(0.1)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=timeout,
                                              suppress_origin=True)
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _port(self) -> int:
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.05)
        raise TimeoutError("chromium wrote no DevToolsActivePort")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def open(self, url: str) -> None:
        """Load `url` afresh (through about:blank, so that another fragment of the same page reloads it)
        and wait until the document has loaded."""
        for target in ("about:blank", url):
            self.send("Page.navigate", url=target)
            deadline = time.monotonic() + self.timeout
            while self.eval("document.readyState === 'complete' && location.href") != target:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{target} did not load")
                time.sleep(0.05)

    def eval(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}: {r['exceptionDetails'].get('text')} {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def errors(self) -> list[str]:
        """The uncaught JavaScript exceptions seen so far (their descriptions)."""
        self.eval("0")  # let pending events arrive
        return [e["params"]["exceptionDetails"].get("exception", {}).get("description", "?")
                for e in self.events if e.get("method") == "Runtime.exceptionThrown"]

    def click(self, selector: str) -> None:
        """A real click: mouse pressed and released at the centre of the element `selector` names."""
        box = self.eval(f"""(() => {{ const el = document.querySelector({json.dumps(selector)});
            if (!el) return null; el.scrollIntoView({{block: "center"}}); const r = el.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2]; }})()""")
        if box is None:
            raise LookupError(f"no element {selector!r} to click")
        x, y = box
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type(self, text: str) -> None:
        """Real typing into the focused element: a key pressed and released per character (pages that listen to
        key events, not only to `input`, see each one)."""
        for ch in text:
            self.send("Input.dispatchKeyEvent", type="keyDown", key=ch, text=ch, unmodifiedText=ch)
            self.send("Input.dispatchKeyEvent", type="keyUp", key=ch)

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
