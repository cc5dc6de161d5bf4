"""Fixtures for the browser tests: a real Herald gateway in demo mode and a
headless Chromium driven by Selenium.

Needs the Debian packages `chromium` and `chromium-driver` (the tests are
skipped, with the reason, when they are missing) and
`pip install -r Tests/browser/requirements.txt`. The gateway binary is
`.build/debug/herald` or $HERALD_BIN; a missing binary fails the tests.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTEN_RE = re.compile(r"^listening on (http://[^\s:]+:\d+)\s*$")
SERVER_KEY = "demo-server-key"


def _find(names: list[str], env: str) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


@pytest.fixture(scope="session")
def browser_paths() -> tuple[str, str]:
    chrome = _find(["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"], "CHROME_BIN")
    driver = _find(["chromedriver"], "CHROMEDRIVER")
    if not chrome or not driver:
        pytest.skip("Chromium is not installed (need `chromium` and `chromedriver`: "
                    "apt-get install -y chromium chromium-driver)")
    return chrome, driver


def herald_binary() -> Path:
    p = Path(os.environ.get("HERALD_BIN", ".build/debug/herald"))
    return p if p.is_absolute() else REPO_ROOT / p


class Gateway:
    """`herald serve --host 127.0.0.1 --port 0 --store memory --demo`, stopped with SIGTERM.
    `store` replaces `memory` (e.g. `sqlite:PATH`, for a restart that keeps the history)."""

    def __init__(self, log_dir: Path, extra_args: list[str] | None = None, store: str = "memory"):
        self.log_dir = log_dir
        self.extra_args = extra_args or []
        self.store = store
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.runs = 0

    def start(self, port: int = 0) -> "Gateway":
        """Starts it on `port` (0: any free one). A restart on the port it had
        (to test clients reconnecting) can find the port taken for a moment by
        another process, which the kernel may have given it since the stop;
        then it is tried again for up to 30 s."""
        deadline = time.monotonic() + 30
        while True:
            if self._start(port):
                return self
            if port == 0 or "Address already in use" not in self.stderr_tail() or time.monotonic() > deadline:
                pytest.fail(f"gateway did not print `listening on http://HOST:PORT`; stderr:\n{self.stderr_tail()}",
                            pytrace=False)
            time.sleep(0.2)

    def _start(self, port: int) -> bool:
        binary = herald_binary()
        if not binary.exists():
            pytest.fail(f"herald binary not found at {binary}: build it (swift build) or set HERALD_BIN", pytrace=False)
        self.runs += 1
        self.log_path = self.log_dir / f"stderr-{self.runs}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary), "serve", "--host", "127.0.0.1", "--port", str(port), "--store", self.store, "--demo",
             *self.extra_args],
            stdout=subprocess.PIPE, stderr=self.log, cwd=REPO_ROOT, text=True, bufsize=1,
            # Its own session: signals meant for the test's process group do not
            # stop it mid-test; stop() ends it by pid.
            start_new_session=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            m = LISTEN_RE.match(line)
            if m:
                url = m.group(1)
        if url is None:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            return False
        self.url = url
        return True

    @property
    def port(self) -> int:
        assert self.url
        return int(self.url.rsplit(":", 1)[1])

    def stderr_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> int | None:
        """SIGTERM; the exit status, or None when it did not exit within 10 s (then killed)."""
        assert self.proc
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self.log.close()
        return rc

    def server_get(self, path: str) -> dict:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {SERVER_KEY}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def publish(self, user: str, app_notification_id: str, title: str, **fields) -> dict:
        body = {"appNotificationId": app_notification_id, "payload": {"title": title}, **fields}
        req = urllib.request.Request(
            f"{self.url}/v1/apps/demo/users/{user}/notifications", method="POST",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {SERVER_KEY}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())


def pushing_gateway(folder: Path, push: dict) -> Gateway:
    """A demo gateway whose `demo` app (the config file's, server key
    SERVER_KEY) pushes with `push` (besides the alert pointers); its
    token secret is kept as `token_secret`."""
    config = folder / "herald.json"
    secret = uuid.uuid4().hex
    config.write_text(json.dumps({"apps": [{"id": "demo", "serverKey": SERVER_KEY, "tokenSecret": secret,
                                            "push": {"alert": {"title": "/title", "body": "/body"}, **push}}]}))
    g = Gateway(folder, ["--config", str(config)]).start()
    g.token_secret = secret
    return g


def _stop_checked(gw: Gateway) -> None:
    rc = gw.stop()
    assert rc == 0, f"gateway exited {rc} after SIGTERM (SPEC 6: 0 within 10 s); stderr:\n{gw.stderr_tail()}"


@pytest.fixture(scope="module")
def gateway_proc(browser_paths, tmp_path_factory) -> Gateway:
    """One demo gateway per test module."""
    gw = Gateway(tmp_path_factory.mktemp("herald")).start()
    yield gw
    _stop_checked(gw)


@pytest.fixture(scope="module")
def gateway(gateway_proc) -> str:
    """The base URL of the module's demo gateway."""
    return gateway_proc.url


@pytest.fixture
def fresh_gateway(browser_paths, tmp_path_factory) -> Gateway:
    """A gateway of the test's own (it may restart it)."""
    gw = Gateway(tmp_path_factory.mktemp("herald")).start()
    yield gw
    if gw.proc and gw.proc.poll() is None:
        _stop_checked(gw)


@pytest.fixture
def driver(browser_paths):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: pip install -r Tests/browser/requirements.txt", pytrace=False)
    chrome, chromedriver = browser_paths
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000", "--force-device-scale-factor=1", "--lang=en-US"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_script_timeout(60)
    yield d
    try:
        logs = d.get_log("browser")
    except Exception:  # noqa: BLE001 - logs are a diagnostic only
        logs = []
    for entry in logs:
        print("browser:", entry.get("level"), entry.get("message"))
    d.quit()
    uncaught = [e["message"] for e in logs if "Uncaught" in e.get("message", "")]
    assert not uncaught, f"uncaught JavaScript errors in the page: {uncaught}"


def assert_accessible(driver, what: str = "the page", context: str | None = None) -> None:
    """axe-core (axe-selenium-python bundles it) finds no violation in the
    page as it is now, or in the elements `context` selects."""
    from axe_selenium_python import Axe

    axe = Axe(driver)
    axe.inject()
    violations = axe.run(context=context)["violations"]
    # Axe.report cannot print targets inside a shadow root (they are lists): say them here.
    assert not violations, f"{what}: " + json.dumps(
        [{"id": v["id"], "help": v["help"], "nodes": [(n["target"], n["failureSummary"]) for n in v["nodes"]]}
         for v in violations], indent=1)


def rfc3339_in(seconds: float) -> str:
    """The time `seconds` from now as Herald writes times (UTC, milliseconds):
    a snooze's end for a test to see it wake."""
    t = time.time() + seconds
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
