"""A headless Chromium driven over the DevTools protocol (CDP), for the viewer's browser test.

    with Browser.start() as b: b.open("file:///..."); b.click("#flip-lost"); b.js("1 + 1")

Clicks are real mouse events at the element's centre (Input.dispatchMouseEvent), not `el.click()`.
Needs a `chromium` binary and the `websockets` package; `find_chromium` says why one is missing.
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

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium(install: bool = True) -> tuple[str | None, str]:
    """(binary, why not): the first Chromium on PATH; else, as root with apt-get, Debian's
    `chromium` package installed once (5 minutes at most)."""
    for name in NAMES:
        if path := shutil.which(name):
            return path, ""
    if not install:
        return None, "no chromium on PATH"
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return None, "no chromium on PATH, and apt-get is absent or needs root to install it"
    try:
        done = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return None, "`apt-get install chromium` did not finish in 300 s (no Debian mirror?)"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return None, f"`apt-get install chromium` failed: {' '.join(tail)}"
    return find_chromium(install=False)


class Browser:
    def __init__(self, proc: subprocess.Popen, profile: str, ws: Any):
        self.proc, self.profile, self.ws, self._id = proc, profile, ws, 0

    @classmethod
    def start(cls, binary: str, width: int = 1400, height: int = 1000) -> Browser:
        from websockets.sync.client import connect

        profile = tempfile.mkdtemp(prefix="cotgap-chromium-")
        args = [
            binary,
            "--headless=new",
            "--no-sandbox",  # root in a container
            "--disable-gpu",
            "--no-first-run",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, deadline = Path(profile) / "DevToolsActivePort", time.time() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{binary} did not open its DevTools port in 30 s")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        ws = connect(page["webSocketDebuggerUrl"], max_size=2**26, open_timeout=10)
        return cls(proc, profile, ws)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, **params: Any) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def js(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20) -> Any:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if value := self.js(expression):
                return value
            time.sleep(0.1)
        raise TimeoutError(f"not true within {timeout} s: {expression}")

    def open(self, url: str) -> None:
        self.send("Page.enable")
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def click(self, selector: str) -> None:
        """A left click at the centre of the first element `selector` matches."""
        sel = json.dumps(selector)
        rect = self.wait_for(
            f"(() => {{ const e = document.querySelector({sel}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=rect["x"],
                y=rect["y"],
                button="left",
                clickCount=1,
            )

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
