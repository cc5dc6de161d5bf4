"""Helpers for Herald's end-to-end tests.

Everything here talks to a real gateway process over real sockets: HTTP via
`requests`, WebSockets via `websockets.sync.client`. Device tokens are minted
in plain Python (hmac + hashlib + base64) so the tests do not trust the
gateway's own token code. The wire contract is /work/shared/SPEC.md.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
import json
import os
import queue
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

import requests
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as _ws_connect

REPO_ROOT = Path(__file__).resolve().parents[2]

APPS = {
    "app.one": {"serverKey": "sk-one", "tokenSecret": "ts-one"},
    "app.two": {"serverKey": "sk-two", "tokenSecret": "ts-two"},
}
CONFIG = {"apps": [{"id": k, **v} for k, v in APPS.items()]}

# SPEC: "Every time on the wire is RFC 3339 UTC with milliseconds and `Z`".
TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
LISTEN_RE = re.compile(r"^listening on (?P<scheme>https?)://(?P<host>[^\s:]+):(?P<port>\d+)$")

NOTIFICATION_FIELDS = {
    "id", "appNotificationId", "userId", "payload", "priority", "groupName",
    "displayTimeToLive", "targetPlatforms", "targetTags", "createdAt",
    "updatedAt", "expiresAt", "readState", "seenState", "userActionState", "version",
}

# Waits for something that must happen are deadlines, not delays: they end as
# soon as it happens, so they are generous (sanitizer builds on a loaded
# 2-core machine are 5-10x slower). Waits for something that must not happen
# stay short: they cannot fail a correct gateway, only miss a late mistake.
FRAME_WAIT = 10.0     # how long to wait for an expected frame
SILENCE_WAIT = 0.7    # how long to watch for frames that must not come
CLOSE_WAIT = 20.0     # how long to wait for an expected close
WELCOME_WAIT = 20.0   # how long to wait for the welcome after a hello
HTTP_TIMEOUT = 30.0


def herald_binary() -> Path:
    p = Path(os.environ.get("HERALD_BIN", ".build/debug/herald"))
    if not p.is_absolute():
        p = REPO_ROOT / p
    return p


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Polls `cond` until it answers something truthy (answered) or the deadline
    passes (AssertionError). For waiting on an event instead of sleeping."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {v!r})")
        time.sleep(interval)


def complete_lines(gw: "Gateway") -> list[str]:
    """The gateway's log lines so far, without one still being written."""
    return gw.stderr_path.read_text().split("\n")[:-1]


def refused_start(config: dict, folder: Path) -> str:
    """`herald serve` with `config`, which must stop it at start with one
    line on stderr and status 2 (a bad config key); answers that line."""
    path = folder / "herald.json"
    path.write_text(json.dumps(config))
    r = subprocess.run([herald_binary(), "serve", "--store", "memory", "--port", "0", "--config", path],
                       capture_output=True, timeout=30)
    lines = r.stderr.decode().splitlines()
    assert (r.returncode, len(lines)) == (2, 1), r.stderr
    return lines[0]


def reload(gw: "Gateway", config) -> str:
    """Writes `config` (a dict, or raw text) over the gateway's config file
    and sends SIGHUP; answers the log line that ends the reload (done, or
    refused)."""
    seen = len(complete_lines(gw))
    gw.config_path.write_text(config if isinstance(config, str) else json.dumps(config))
    gw.proc.send_signal(signal.SIGHUP)
    return wait_until(lambda: next((l for l in complete_lines(gw)[seen:]
                                    if "config reloaded from" in l or "config reload refused" in l), None),
                      "the reload's log line")


def uid(prefix: str = "u") -> str:
    """A fresh id that keeps tests independent on a shared gateway."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def partition_of(app: str, user: str, count: int) -> int:
    """The gateway's partition of a user (32-bit FNV-1a of app id, a zero
    byte and user id, modulo the count: `Partition.index`)."""
    h = 2166136261
    for b in app.encode() + b"\0" + user.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h % count


def uid_in(partition: int, count: int, prefix: str = "u", app: str = "app.one") -> str:
    """A fresh id of a user of `app` in `partition` of `count`."""
    while partition_of(app, u := uid(prefix), count) != partition:
        pass
    return u


# --------------------------------------------------------------------------
# Time

def parse_time(s: Any) -> _dt.datetime:
    assert isinstance(s, str) and TIME_RE.match(s), f"not an RFC 3339 UTC ms time with Z: {s!r}"
    return _dt.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.timezone.utc)


def iso(ts: float) -> str:
    """Seconds since the epoch -> 2026-11-22T10:00:00.000Z."""
    d = _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


def epoch_seconds(s: str) -> float:
    return parse_time(s).timestamp()


# --------------------------------------------------------------------------
# Tokens (HS256 JWT, built by hand)

def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def sign_jwt(header: dict, claims: dict, secret: str | bytes | None, alg: str = "HS256") -> str:
    h = b64url(json.dumps(header, separators=(",", ":")).encode())
    c = b64url(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{h}.{c}".encode()
    if secret is None:
        sig = b""
    else:
        key = secret.encode() if isinstance(secret, str) else secret
        digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}.get(alg, hashlib.sha256)
        sig = hmac.new(key, signing_input, digest).digest()
    return f"{h}.{c}.{b64url(sig)}"


_MISSING = object()


def mint_token(sub: str, app: str = "app.one", *, secret: str | None = None, ttl: int = 3600,
               exp: Any = _MISSING, iat: Any = _MISSING, nbf: Any = None, dev: str | None = None,
               alg: str = "HS256", header: dict | None = None, extra: dict | None = None) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {"app": app, "sub": sub}
    claims["iat"] = now if iat is _MISSING else iat
    claims["exp"] = now + ttl if exp is _MISSING else exp
    if nbf is not None:
        claims["nbf"] = nbf
    if dev is not None:
        claims["dev"] = dev
    if extra:
        claims.update(extra)
    claims = {k: v for k, v in claims.items() if v is not None}
    if secret is None:
        secret = APPS.get(app, {}).get("tokenSecret", "no-such-secret")
    hdr = header if header is not None else {"alg": alg, "typ": "JWT"}
    return sign_jwt(hdr, claims, secret, alg)


def decode_jwt(token: str) -> tuple[dict, dict, bytes]:
    parts = token.split(".")
    assert len(parts) == 3, f"not a JWT: {token!r}"
    return json.loads(b64url_decode(parts[0])), json.loads(b64url_decode(parts[1])), b64url_decode(parts[2])


def verify_jwt(token: str, secret: str) -> dict:
    """Checks an HS256 token with `secret`; answers its claims."""
    header, claims, sig = decode_jwt(token)
    assert header.get("alg") == "HS256", header
    h, c, _ = token.split(".")
    want = hmac.new(secret.encode(), f"{h}.{c}".encode(), hashlib.sha256).digest()
    assert hmac.compare_digest(want, sig), "token signature does not verify with the app's tokenSecret"
    return claims


# --------------------------------------------------------------------------
# Checks of wire shapes

def check_error(resp: requests.Response, status: int, code: str | None = None) -> dict:
    """SPEC 6: `{"error": {"code": "...", "message": "..."}}`."""
    assert resp.status_code == status, (
        f"{resp.request.method} {resp.request.url}: want {status}, got {resp.status_code}: {resp.text[:500]}")
    code = code or {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                    405: "method_not_allowed", 412: "precondition_failed", 413: "too_large",
                    429: "rate_limited", 503: "unavailable"}[status]
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(f"error body is not JSON: {resp.text[:300]!r}")
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    assert body["error"].get("code") == code, body
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
    return body


def check_notification(n: dict) -> dict:
    assert isinstance(n, dict), n
    missing = NOTIFICATION_FIELDS - set(n)
    assert not missing, f"notification lacks {sorted(missing)}: {n}"
    assert isinstance(n["id"], str) and n["id"], n
    assert isinstance(n["payload"], dict), n
    assert n["priority"] in ("normal", "high"), n
    assert n["readState"] in ("unread", "read"), n
    assert n["seenState"] in ("unseen", "seen"), n
    assert n["userActionState"] in ("noInteraction", "activated", "dismissed", "snoozed"), n
    assert isinstance(n["version"], int) and not isinstance(n["version"], bool) and n["version"] >= 1, n
    for k in ("createdAt", "updatedAt", "expiresAt"):
        parse_time(n[k])
    return n


def check_change(c: dict) -> dict:
    assert isinstance(c, dict), c
    assert isinstance(c.get("seq"), int) and not isinstance(c["seq"], bool), c
    if c.get("op") == "upsert":
        check_notification(c.get("notification"))
    elif c.get("op") == "delete":
        assert isinstance(c.get("id"), str), c
        assert isinstance(c.get("appNotificationId"), str), c
        assert c.get("reason") in ("deleted", "expired", "hidden"), c
    elif c.get("op") == "preferences":
        check_preferences(c.get("preferences"))
    else:
        raise AssertionError(f"change op is not upsert, delete or preferences: {c}")
    return c


def check_preferences(p: dict) -> dict:
    """SPEC section 12's shape: both default channels, groups, critical, version, updatedAt."""
    assert isinstance(p, dict) and set(p) == {"default", "groups", "critical", "version", "updatedAt"}, p
    assert set(p["default"]) == {"inbox", "push"} and all(isinstance(v, bool) for v in p["default"].values()), p
    for g in p["groups"].values():
        assert set(g) <= {"inbox", "push"} and all(isinstance(v, bool) for v in g.values()), p
    assert isinstance(p["version"], int) and p["version"] >= 0, p
    assert (p["updatedAt"] is None) == (p["version"] == 0), p
    if p["updatedAt"] is not None:
        assert TIME_RE.match(p["updatedAt"]), p
    return p


def change_anid(c: dict) -> str:
    return c["notification"]["appNotificationId"] if c["op"] == "upsert" else c["appNotificationId"]


def change_nid(c: dict) -> str:
    return c["notification"]["id"] if c["op"] == "upsert" else c["id"]


def changes_in(frames: Iterable[dict]) -> list[dict]:
    """The changes carried by `change` and `changes` frames, in order."""
    out = []
    for f in frames:
        if f["type"] == "change":
            out.append(check_change(f["change"]))
        elif f["type"] == "changes":
            assert isinstance(f.get("changes"), list), f
            out.extend(check_change(c) for c in f["changes"])
    return out


def assert_strictly_increasing(seqs: list[int], what: str = "seq") -> None:
    for a, b in zip(seqs, seqs[1:]):
        assert b > a, f"{what} not strictly increasing: ... {a}, {b} ... in {seqs}"


# --------------------------------------------------------------------------
# The gateway process

class Gateway:
    """One `herald serve` process with helpers for its HTTP and WS APIs."""

    def __init__(self, binary: Path, workdir: Path, config: dict | None = CONFIG,
                 extra_args: list[str] | None = None, store: str = "memory", ca: Path | None = None,
                 preexec_fn: Callable[[], None] | None = None):
        """`ca`: the certificates (PEM) a TLS gateway's must verify against;
        `preexec_fn`: run in the child before exec (resource limits)."""
        self.binary = binary
        self.ca = ca
        self.preexec_fn = preexec_fn
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.args = [str(binary), "serve", "--host", "127.0.0.1", "--port", "0", "--store", store]
        if config is not None:
            self.config_path = workdir / "herald.json"
            self.config_path.write_text(json.dumps(config))
            self.args += ["--config", str(self.config_path)]
        self.args += list(extra_args or [])
        self.stderr_path = workdir / "herald.stderr.log"
        self.proc: subprocess.Popen | None = None
        self.listen_line: str | None = None
        self.extra_stdout: list[str] = []
        self.stdout_closed = threading.Event()   # set once stdout reached its end
        self.base = ""
        self.ws_url = ""
        self._local = threading.local()

    # ---- process

    def start(self, timeout: float = 60.0) -> "Gateway":
        if not self.binary.exists():
            raise AssertionError(f"herald binary not found at {self.binary} (set HERALD_BIN or build it)")
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, preexec_fn=self.preexec_fn,
                                     stderr=self._stderr, cwd=self.workdir)
        lines: queue.Queue = queue.Queue()

        def pump():
            assert self.proc and self.proc.stdout
            for raw in iter(self.proc.stdout.readline, b""):
                lines.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise AssertionError(f"gateway did not print 'listening on ...' within {timeout}s; "
                                     f"stderr: {self.stderr_tail()}")
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                rc = self.proc.wait(5)
                raise AssertionError(f"gateway exited ({rc}) before listening; stderr: {self.stderr_tail()}")
            m = LISTEN_RE.match(line)
            if m:
                self.listen_line = line
                break
            self.extra_stdout.append(line)
        self.host, self.port = m.group("host"), int(m.group("port"))
        assert self.port != 0, line
        tls = m.group("scheme") == "https"
        assert tls == (self.ca is not None), f"{line}: a TLS gateway needs `ca`, a plain one none"
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ws_url = f"{'wss' if tls else 'ws'}://127.0.0.1:{self.port}/v1/ws"

        def drain():
            while True:
                line = lines.get()
                if line is None:
                    self.stdout_closed.set()
                    return
                self.extra_stdout.append(line)

        threading.Thread(target=drain, daemon=True).start()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then wait; answers the exit status (None if it hung and was killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            return self.stderr_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def metric(self, series: str, absent: float | None = None) -> float:
        """The value of one series of /metrics, e.g. `herald_connections{transport="poll"}`;
        `absent` when it is not there (a labelled counter shows once counted), else an error."""
        text = self.request("GET", "/metrics").text
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        if absent is not None:
            return absent
        raise AssertionError(f"{series} not in /metrics")

    # ---- HTTP

    @property
    def http(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def request(self, method: str, path: str, *, key: str | None = None, token: str | None = None,
                device: str | None = None, headers: dict | None = None, **kw) -> requests.Response:
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        if device is not None:
            h["Herald-Device"] = device
        kw.setdefault("timeout", HTTP_TIMEOUT)
        if self.ca is not None:
            # Per request: REQUESTS_CA_BUNDLE in the environment would win over the session's.
            kw.setdefault("verify", str(self.ca))
        return self.http.request(method, self.base + path, headers=h, **kw)

    def server(self, method: str, path: str, app: str = "app.one", key: str | None = None, **kw) -> requests.Response:
        """`/v1/apps/{app}{path}` with the app's server key."""
        if key is None:
            key = APPS[app]["serverKey"]
        return self.request(method, f"/v1/apps/{app}{path}", key=key, **kw)

    def me(self, method: str, path: str, token: str, **kw) -> requests.Response:
        """`/v1/me{path}` with a device token."""
        return self.request(method, f"/v1/me{path}", token=token, **kw)

    def publish_raw(self, user: str, body: Any, app: str = "app.one", **kw) -> requests.Response:
        return self.server("POST", f"/users/{user}/notifications", app=app, json=body, **kw)

    def publish(self, user: str, anid: str | None = None, payload: dict | None = None,
                app: str = "app.one", expect: int | tuple = (200, 201), **fields) -> dict:
        body = {"appNotificationId": anid or uid("n"), "payload": payload if payload is not None else {"title": "hi"}}
        body.update(fields)
        r = self.publish_raw(user, body, app=app)
        want = expect if isinstance(expect, tuple) else (expect,)
        assert r.status_code in want, f"publish: want {want}, got {r.status_code}: {r.text[:500]}"
        out = r.json()
        check_notification(out["notification"])
        assert isinstance(out["seq"], int), out
        return out

    def get_notification(self, user: str, nid: str, app: str = "app.one") -> dict | None:
        r = self.server("GET", f"/users/{user}/notifications/{nid}", app=app)
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        return check_notification(r.json()["notification"])

    def list_all(self, user: str, app: str = "app.one", **params) -> list[dict]:
        """Every notification of a user through the server API, following `next`."""
        out: list[dict] = []
        before = None
        for _ in range(100):
            q = {"limit": 500, **params}
            if before:
                q["before"] = before
            r = self.server("GET", f"/users/{user}/notifications", app=app, params=q)
            assert r.status_code == 200, r.text
            body = r.json()
            out.extend(body["notifications"])
            before = body.get("next")
            if not before:
                return out
        raise AssertionError("history paging did not end")

    def api_token(self, user: str, app: str = "app.one", ttl: int | None = None, device: str | None = None) -> str:
        body: dict[str, Any] = {"userId": user}
        if ttl is not None:
            body["ttlSeconds"] = ttl
        if device is not None:
            body["deviceId"] = device
        r = self.server("POST", "/tokens", app=app, json=body)
        assert r.status_code == 200, r.text
        return r.json()["token"]

    def token(self, user: str, app: str = "app.one", **kw) -> str:
        return mint_token(user, app, **kw)

    def devices(self, user: str, app: str = "app.one") -> dict[str, dict]:
        r = self.server("GET", f"/users/{user}/devices", app=app)
        assert r.status_code == 200, r.text
        return {d["deviceId"]: d for d in r.json()["devices"]}

    # ---- WebSocket

    def ws(self, **kw) -> "WsClient":
        if self.ca is None:
            return WsClient(self.ws_url, **kw)
        sock = SerialTLSSocket.open(self.host, self.port, ssl.create_default_context(cafile=str(self.ca)),
                                    timeout=kw.get("open_timeout", WsClient.OPEN_TIMEOUT))
        # The TLS is ours: websockets speaks plain WebSocket over it.
        return WsClient(self.ws_url.replace("wss://", "ws://", 1), sock=sock, **kw)

    def connect(self, user: str, device: str | None = None, app: str = "app.one", token: str | None = None,
                **hello) -> tuple["WsClient", list[dict], dict]:
        """Connects and says hello; answers (client, catch-up frames, welcome)."""
        c = self.ws()
        frames, welcome = c.hello(token or mint_token(user, app), device or uid("d"), **hello)
        return c, frames, welcome


class Closed(Exception):
    def __init__(self, code: int | None, reason: str):
        super().__init__(f"connection closed: {code} {reason}")
        self.code = code
        self.reason = reason


class SerialTLSSocket:
    """A TLS client connection websockets' reading thread and its writers can
    share. CPython's ssl sockets before 3.13.6 let two threads into one
    OpenSSL session at once (python/cpython#137583 added the lock). Under
    TLS 1.3 a write racing the read of the gateway's session tickets could
    end up waiting in a read of its own: the upgrade request was never sent,
    and the gateway closed the connection at its request deadline (about 1
    in 170 connections here). OpenSSL works on memory buffers under a lock;
    the socket is read and written outside it."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_hostname: str):
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname=server_hostname)
        self.lock = threading.Lock()       # the TLS session and its buffers
        self.send_lock = threading.Lock()  # records leave in the order they were made
        while True:  # one thread: websockets starts its reader after this
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_made()
                self._take(self.sock.recv(65536))
        self._send_made()

    @classmethod
    def open(cls, host: str, port: int, ctx: ssl.SSLContext, timeout: float) -> "SerialTLSSocket":
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            tls = cls(sock, ctx, host)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return tls

    def __getattr__(self, name: str) -> Any:
        # fileno (websockets selects on it), settimeout, shutdown, close, ...
        return getattr(self.sock, name)

    def _take(self, data: bytes) -> None:
        with self.lock:
            if data:
                self.incoming.write(data)
            else:
                self.incoming.write_eof()

    def _send_made(self, wait: bool = True) -> None:
        if not self.send_lock.acquire(blocking=wait):
            return  # a writer sends it with its own record
        try:
            with self.lock:
                out = self.outgoing.read()
            if out:
                self.sock.sendall(out)
        finally:
            self.send_lock.release()

    def recv(self, bufsize: int) -> bytes:
        """All the plaintext there is, past `bufsize` too: a record left
        decrypted here would not make the socket readable again."""
        while True:
            chunks: list[bytes] = []
            eof = False
            with self.lock:
                while True:
                    try:
                        data = self.tls.read(65536)
                    except ssl.SSLWantReadError:
                        break
                    except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                        data = b""
                    if not data:
                        eof = True
                        break
                    chunks.append(data)
                made = self.outgoing.pending > 0
            if made:  # an answer OpenSSL owes (a key update)
                self._send_made(wait=False)
            if chunks:
                return b"".join(chunks)
            if eof:
                return b""
            self._take(self.sock.recv(65536))

    def sendall(self, data) -> None:
        with self.send_lock:
            with self.lock:
                self.tls.write(data)
                out = self.outgoing.read()
            self.sock.sendall(out)


class WsClient:
    OPEN_TIMEOUT = 20

    def __init__(self, url: str, **kw):
        kw.setdefault("open_timeout", self.OPEN_TIMEOUT)
        kw.setdefault("close_timeout", 2)
        kw.setdefault("max_size", None)
        kw.setdefault("compression", None)
        kw.setdefault("ping_interval", None)
        self.conn = _ws_connect(url, **kw)
        if hasattr(self.conn, "pending_legacy_warning"):
            self.conn.pending_legacy_warning = False   # websockets >= 16 warns about direct use
        self.log: list[dict] = []
        self._ref = 0

    def ref(self) -> str:
        self._ref += 1
        return f"r{self._ref}"

    def send(self, obj: dict) -> None:
        self.conn.send(json.dumps(obj))

    def send_raw(self, data, text: bool | None = None) -> None:
        self.conn.send(data, text=text)

    def recv(self, timeout: float = FRAME_WAIT) -> dict:
        """The next frame as a dict. TimeoutError if none; Closed if the connection ended."""
        try:
            msg = self.conn.recv(timeout=timeout)
        except TimeoutError:
            raise
        except ConnectionClosed as e:
            raise Closed(e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else "") from None
        assert isinstance(msg, str), f"gateway sent a binary frame: {msg[:100]!r}"
        obj = json.loads(msg)
        assert isinstance(obj, dict), f"frame is not a JSON object: {msg[:200]}"
        assert next(iter(obj), None) == "type", f"`type` must come first: {msg[:200]}"
        self.log.append(obj)
        return obj

    def hello(self, token: str, device_id: str | None, timeout: float = WELCOME_WAIT,
              **fields) -> tuple[list[dict], dict]:
        """Says hello; answers (catch-up frames, welcome). `timeout` bounds the whole catch-up."""
        msg: dict[str, Any] = {"type": "hello", "token": token}
        if device_id is not None:
            msg["deviceId"] = device_id
        msg.update({k: v for k, v in fields.items()})
        self.send(msg)
        frames: list[dict] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                f = self.recv(max(0.05, deadline - time.monotonic()))
            except TimeoutError:
                raise AssertionError(f"no welcome within {timeout}s; got {len(frames)} frames: {frames[:3]}")
            except Closed as e:
                raise AssertionError(f"closed ({e.code} {e.reason}) before welcome; got {frames}")
            if f["type"] == "welcome":
                check_welcome(f)
                return frames, f
            assert f["type"] in ("changes", "reset"), f"before welcome only catch-up frames may come: {f}"
            frames.append(f)

    def recv_until(self, pred: Callable[[dict], bool], timeout: float = FRAME_WAIT) -> tuple[dict, list[dict]]:
        """Reads until a frame matches; answers it and the frames read before it."""
        skipped: list[dict] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching frame within {timeout}s; got {skipped}")
            try:
                f = self.recv(left)
            except TimeoutError:
                continue
            if pred(f):
                return f, skipped
            skipped.append(f)

    def expect(self, type_: str, timeout: float = FRAME_WAIT, ref: str | None = None) -> tuple[dict, list[dict]]:
        return self.recv_until(lambda f: f["type"] == type_ and (ref is None or f.get("ref") == ref), timeout)

    def expect_changes(self, n: int, timeout: float = FRAME_WAIT) -> tuple[list[dict], list[dict]]:
        """Reads until `n` changes arrived; answers (changes, all frames read)."""
        frames: list[dict] = []
        deadline = time.monotonic() + timeout
        while len(changes_in(frames)) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"wanted {n} changes within {timeout}s; got frames {frames}")
            try:
                frames.append(self.recv(left))
            except TimeoutError:
                continue
        return changes_in(frames), frames

    def collect_until(self, cond: Callable[[list[dict]], bool], frames: list[dict] | None = None,
                      timeout: float = FRAME_WAIT, what: str = "") -> list[dict]:
        """Reads frames until `cond(frames read so far)` holds, counting the
        `frames` already read; answers all of them. For waiting on something
        that may come in any order with other frames (a change and its counts,
        a broadcast before or after an ack) instead of a quiet period."""
        out = list(frames or [])
        deadline = time.monotonic() + timeout
        while not cond(out):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what or 'expected frames'} within {timeout}s; got {out}")
            try:
                out.append(self.recv(left))
            except TimeoutError:
                continue
        return out

    def expect_counts(self, unread: int, frames: list[dict] | None = None,
                      timeout: float = FRAME_WAIT) -> list[dict]:
        """Reads until a `counts` frame with this `unread` (among `frames`
        or after them); answers every frame read, `frames` first."""
        return self.collect_until(lambda fs: any(f["type"] == "counts" and f.get("unread") == unread for f in fs),
                                  frames, timeout, f"counts frame with unread {unread}")

    def drain(self, quiet: float = SILENCE_WAIT) -> list[dict]:
        """Every frame until the connection is quiet for `quiet` seconds. Not a
        wait for an expected frame (a slow gateway would look quiet): wait for
        those first (expect_*, collect_until), then drain for any extra."""
        out = []
        while True:
            try:
                out.append(self.recv(quiet))
            except TimeoutError:
                return out

    def assert_silent(self, seconds: float = SILENCE_WAIT, ignore: tuple[str, ...] = ()) -> None:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                f = self.recv(left)
            except TimeoutError:
                return
            assert f["type"] in ignore, f"expected no frames, got {f}"

    def expect_close(self, timeout: float = CLOSE_WAIT) -> tuple[int | None, list[dict]]:
        """Reads until the gateway closes; answers (close code, frames read)."""
        frames: list[dict] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"connection still open after {timeout}s; frames {frames}")
            try:
                frames.append(self.recv(left))
            except TimeoutError:
                continue
            except Closed as e:
                return e.code, frames

    def ping(self, timeout: float = FRAME_WAIT) -> dict:
        r = self.ref()
        self.send({"type": "ping", "ref": r})
        f, _ = self.expect("pong", timeout, ref=r)
        return f

    def request(self, msg: dict, timeout: float = FRAME_WAIT) -> tuple[dict, list[dict]]:
        """Sends a message with a fresh ref; answers its ack/error and the frames before it."""
        msg = dict(msg)
        msg.setdefault("ref", self.ref())
        self.send(msg)
        return self.recv_until(lambda f: f["type"] in ("ack", "error") and f.get("ref") == msg["ref"], timeout)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_welcome(w: dict) -> dict:
    assert w["type"] == "welcome", w
    assert isinstance(w.get("cursor"), int) and not isinstance(w["cursor"], bool), w
    assert isinstance(w.get("epoch"), str) and w["epoch"], w
    assert isinstance(w.get("connectionId"), str) and w["connectionId"], w
    assert isinstance(w.get("unread"), int) and not isinstance(w["unread"], bool), w
    assert isinstance(w.get("unseen"), int) and not isinstance(w["unseen"], bool), w
    return w


def reset_notifications(frames: list[dict]) -> list[dict]:
    """Checks catch-up `reset` frames (<= 500 each, only the last final) and answers their notifications."""
    assert frames, "expected reset frames"
    out = []
    for i, f in enumerate(frames):
        assert f["type"] == "reset", f"expected a reset frame, got {f}"
        assert isinstance(f.get("notifications"), list), f
        assert len(f["notifications"]) <= 500, f"reset frame of {len(f['notifications'])} > 500"
        assert isinstance(f.get("cursor"), int), f
        assert isinstance(f.get("epoch"), str), f
        assert f.get("final") is (i == len(frames) - 1), f"only the last reset frame is final: {[x.get('final') for x in frames]}"
        out.extend(check_notification(n) for n in f["notifications"])
    return out


# --------------------------------------------------------------------------
# Raw HTTP, for requests that `requests` would tidy up or give up on

class RawWebSocket:
    """A WebSocket client over a plain socket that sends frames exactly as
    given, also those a client library refuses to send (a close frame with a
    reserved code or a reason that is not UTF-8, a flood of pings)."""

    def __init__(self, gw: "Gateway", timeout: float = CLOSE_WAIT):
        self.sock = socket.create_connection(("127.0.0.1", gw.port), timeout=timeout)
        self.sock.sendall(b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, f"connection ended; unread {self.buf[:200]!r}"
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    @staticmethod
    def frame(opcode: int, payload: bytes = b"", fin: bool = True) -> bytes:
        """One masked client frame (RFC 6455 5.2)."""
        n = len(payload)
        length = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big") if n < 65536 \
            else bytes([0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        return bytes([(0x80 if fin else 0) | opcode]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> tuple[int, bytes]:
        """The next server frame: (opcode, payload)."""
        b0, b1 = self._take(2)
        assert b1 & 0x80 == 0, "server frames are not masked"
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(self._take(2), "big")
        elif n == 127:
            n = int.from_bytes(self._take(8), "big")
        return b0 & 0x0F, self._take(n)

    def hello(self, token: str, device: str = "d1") -> None:
        """Says hello and reads up to the welcome."""
        self.send(self.frame(0x1, json.dumps({"type": "hello", "token": token, "deviceId": device}).encode()))
        while True:
            op, data = self.recv_frame()
            if op == 0x1 and json.loads(data)["type"] == "welcome":
                return

    def expect_close(self, answer: bool = True) -> tuple[int | None, list[tuple[int, bytes]]]:
        """Reads up to the gateway's close frame and (unless it answers ours)
        answers it; then the connection must end. Answers (its code, the
        frames before it)."""
        frames = []
        while (f := self.recv_frame())[0] != 0x8:
            frames.append(f)
        body = f[1]
        if answer:
            self.send(self.frame(0x8, body[:2]))
        assert read_until_eof(self.sock) == b"", "nothing after the close frame"
        self.sock.close()
        return (int.from_bytes(body[:2], "big") if len(body) >= 2 else None), frames


class RawResponse:
    def __init__(self, status: int, headers: dict, body: bytes):
        self.status_code = status
        self.headers = headers
        self.content = body
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


def parse_response(data: bytes) -> tuple[RawResponse, bytes] | None:
    """The first complete HTTP response in `data` and the bytes after it,
    or None while it is incomplete (framed by Content-Length or chunked)."""
    head_b, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head_b.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if "chunked" in hdrs.get("transfer-encoding", "").lower():
        body, buf = b"", rest
        while True:
            size_line, sep, buf = buf.partition(b"\r\n")
            if not sep:
                return None
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                return RawResponse(status, hdrs, body), buf.partition(b"\r\n")[2]
            if len(buf) < size + 2:
                return None
            body, buf = body + buf[:size], buf[size + 2:]
    length = int(hdrs.get("content-length", "0"))
    if len(rest) < length:
        return None
    return RawResponse(status, hdrs, rest[:length]), rest[length:]


def parse_responses(data: bytes) -> list[RawResponse]:
    """Every complete response in `data`, in order."""
    out = []
    while (parsed := parse_response(data)) is not None:
        r, data = parsed
        out.append(r)
    return out


# Notification ids no gateway gives: among them a NUL, which PostgreSQL text
# cannot hold (asking it about one used to fail every write of the batch).
IDS_OF_NO_FORM = ["a\u0000b", "n_01J\u0000", "n_" + "Z" * 25 + "\u00e9", "n_" + "U" * 26]


def assert_ids_of_no_form_are_unknown(gw: "Gateway", user: str) -> None:
    """Every way to name a notification answers not_found for such ids and
    changes nothing; the store stays healthy and writes go on."""
    import urllib.parse
    tok = mint_token(user)
    first = gw.publish(user, "kept")
    n = first["notification"]
    ws, _, _ = gw.connect(user)
    with ws:
        for bad in IDS_OF_NO_FORM:
            path = "/notifications/" + urllib.parse.quote(bad, safe="")
            check_error(gw.me("GET", path, tok), 404, "not_found")
            check_error(gw.me("PATCH", path, tok, json={"readState": "read"}), 404, "not_found")
            check_error(gw.me("DELETE", path, tok), 404, "not_found")
            check_error(gw.server("DELETE", f"/users/{user}" + path), 404, "not_found")
            for msg in ({"type": "delete", "ref": "d", "id": bad}, {"type": "update", "ref": "d", "id": bad, "readState": "read"}):
                ws.send(msg)
                f, _ = ws.recv_until(lambda f: f.get("ref") == "d")
                assert f["type"] == "error" and f["code"] == "not_found", f
        ws.assert_silent(ignore=("counts",))
    assert gw.request("GET", "/healthz").json()["store"] == "ok"
    assert gw.get_notification(user, n["id"]) == n
    assert gw.publish(user, "after")["seq"] == first["seq"] + 1


def read_until_eof(s, timeout: float = 10.0) -> bytes:
    """Everything a socket receives until the peer closes it; fails if it
    stays open `timeout` seconds without sending."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError(f"connection still open after {timeout}s of silence; got {data[:500]!r}")
    return data


def raw_http(gw: "Gateway", method: str, path: str, headers: dict | None = None, body: bytes = b"",
             timeout: float = 10.0, version: str = "HTTP/1.1", extra_lines: Iterable[str] = ()) -> RawResponse:
    """Sends one request over a plain socket, tolerating the gateway closing
    while the body is still being sent; answers the response it got. A
    header given as None is left out; `extra_lines` are sent as they are."""
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=timeout)
    try:
        h = {"Host": f"127.0.0.1:{gw.port}", "Connection": "close", "Content-Length": str(len(body))}
        h.update(headers or {})
        lines = [f"{k}: {v}" for k, v in h.items() if v is not None] + list(extra_lines)
        head = f"{method} {path} {version}\r\n" + "".join(f"{line}\r\n" for line in lines) + "\r\n"
        s.sendall(head.encode("latin-1"))
        try:
            view = memoryview(body)
            for i in range(0, len(view), 65536):
                s.sendall(view[i:i + 65536])
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        try:
            while (chunk := s.recv(65536)) and parse_response(data + chunk) is None:
                data += chunk
            data += chunk
        except ConnectionResetError:
            pass
        parsed = parse_response(data)
        if parsed is None:
            raise AssertionError(f"no HTTP response to {method} {path} (got {data[:200]!r})")
        return parsed[0]
    finally:
        s.close()


def check_raw_error(resp: RawResponse, status: int, code: str) -> dict:
    assert resp.status_code == status, f"want {status}, got {resp.status_code}: {resp.text[:300]}"
    body = resp.json()
    assert body["error"]["code"] == code and isinstance(body["error"]["message"], str), body
    return body
