"""Local stand-ins for the push services (SPEC section 10), written from their
public documentation, each checking what the real service checks with
independent libraries (h2, PyJWT, cryptography, http-ece), never Herald's code:

- APNsStandIn: Apple's HTTP/2 provider API with token-based authentication
  ("Sending notification requests to APNs", "Establishing a token-based
  connection to APNs", "Handling notification responses from APNs").
- FCMStandIn: Firebase Cloud Messaging HTTP v1 (`messages:send`) and the
  OAuth 2.0 JWT-bearer token endpoint of a service account.
- WebPushStandIn: a push service of RFC 8030, with RFC 8291 encryption and
  RFC 8292 VAPID, for subscriptions it made as a browser would.

Each runs in threads of the test process (start()/stop(), or `with`) on
127.0.0.1 over TLS with a CA of its own (`ca_file`). What it took is in
`accepted`, what it refused (with why) in `refused`. `script(Outcome(...))`
queues answers, `default_outcome` answers once the queue is empty, `hold`
keeps answers (those of accepted pushes and scripted ones) back until
`release_held()` or `stop()`.

As a process (for benchmarks):

  push_standins.py apns|fcm|webpush --port 0 --state DIR [--outcome STATUS[:REASON[:RETRY_AFTER]]]...
                   [--hold] [--count-file PATH] [--subscriptions N]
      prints "listening on https://127.0.0.1:PORT" and serves until SIGTERM.
      DIR gets ca.pem, the service's credentials (AuthKey_<keyId>.p8,
      service-account.json, or N Web Push subscriptions in subscriptions.json),
      standin.json (those paths, ids, url) and received.jsonl (one line per
      push taken). The outcomes answer requests in order, the last one every
      request after it.
  push_standins.py count --state DIR      pushes taken so far
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import socket
import ssl
import tempfile
import threading
import time
import traceback
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import http_ece
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def unb64url(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def pem_private(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def public_point(key) -> bytes:
    """A P-256 public key as the 65-byte uncompressed point Web Push uses."""
    return key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


# ---------------------------------------------------------------- TLS

class CertificateAuthority:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost.

    With the key identifiers and usages that strict verifiers (OpenSSL's
    X509_STRICT, Python 3.13's default context) require."""

    def __init__(self, folder: Path, name: str = "push stand-in CA"):
        now = datetime.datetime.now(datetime.timezone.utc)
        valid = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=7))
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(valid[0]).not_valid_after(valid[1])
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                           key_encipherment=False, data_encipherment=False, key_agreement=False,
                                           encipher_only=False, decipher_only=False), critical=True)
              .add_extension(ca_ski, critical=False)
              .sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(valid[0]).not_valid_after(valid[1])
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                            x509.DNSName("localhost")]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.ca_file = folder / "ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.chain_file = folder / "server.pem"
        self.chain_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + pem_private(key))


@dataclass
class Request:
    method: str
    path: str
    headers: dict  # lower-case names
    body: bytes
    connection: int  # 1 for the first connection the server accepted, and so on
    at: float  # when the whole request had arrived (time.time())
    repeated: frozenset = frozenset()  # header names sent more than once


@dataclass
class Response:
    status: int
    headers: list = field(default_factory=list)
    body: bytes = b""


@dataclass(eq=False)
class Held:
    """An answer kept back until release_held() (then sent) or stop() (then never)."""
    response: Response
    released: threading.Event = field(default_factory=threading.Event)
    connection: "_Connection | None" = None


class _Connection:
    def __init__(self, number: int, sock: ssl.SSLSocket):
        self.number = number
        self.sock = sock
        # Wakes an HTTP/2 connection's thread, blocked in poll(), to send released answers:
        # only that thread touches the socket (CPython's ssl sockets are not safe to share).
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.held: list[tuple[int, Held]] = []  # HTTP/2 streams waiting for their answer

    def wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass  # already awake


H2_SETTINGS = {
    # APNs' own limit; h2's default (100) would make a multiplexing client queue.
    h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000,
    h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 2 ** 16,
}


class TLSServer:
    """127.0.0.1 over TLS with ALPN: HTTP/2 (h2) and, where allowed, HTTP/1.1.

    One thread accepts, one thread per connection serves it; stop() ends them
    all, closes every socket and joins every thread."""

    def __init__(self, handler, folder: Path, http1: bool = True):
        self.handler = handler
        self.ca = CertificateAuthority(folder)
        self.ca_file = str(self.ca.ca_file)
        self.http1 = http1
        self.connections = 0
        # (connection number, time.monotonic()) of each HTTP/2 PING received, under `lock`.
        self.pings: list[tuple[int, float]] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.live: dict[int, _Connection] = {}
        self.held: list[Held] = []
        self.threads: set[threading.Thread] = set()
        self.listener: socket.socket | None = None
        self.acceptor: threading.Thread | None = None
        self.port: int | None = None
        self.url: str | None = None

    def start(self, port: int = 0) -> "TLSServer":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.ca.chain_file)
        ctx.set_alpn_protocols(["h2", "http/1.1"] if self.http1 else ["h2"])
        self.ctx = ctx
        self.listener = socket.create_server(("127.0.0.1", port), backlog=512)
        self.port = self.listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.acceptor = self._spawn(self._accept_loop, "accept")
        return self

    def stop(self) -> None:
        if self.stopped.is_set() or self.listener is None:
            return
        self.stopped.set()
        with self.lock:
            for held in self.held:
                held.released.set()
        # shutdown(), unlike close(), wakes a thread blocked on the socket.
        _shutdown(self.listener)
        self.acceptor.join(10)
        with self.lock:
            for c in self.live.values():
                _shutdown(c.sock)
                c.wake()
            threads = list(self.threads)
        for t in threads:
            t.join(10)
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"stand-in threads still running after stop: {alive}")

    def hold(self, response: Response) -> Held:
        held = Held(response)
        with self.lock:
            self.held.append(held)
            if self.stopped.is_set():
                held.released.set()
        return held

    def release_held(self) -> None:
        with self.lock:
            held, self.held = self.held, []
            for h in held:
                h.released.set()
                if h.connection is not None:
                    h.connection.wake()

    def _spawn(self, target, name: str, *args) -> threading.Thread:
        def run():
            try:
                target(*args)
            finally:
                with self.lock:
                    self.threads.discard(t)
        t = threading.Thread(target=run, name=f"standin-{self.port}-{name}", daemon=True)
        with self.lock:
            self.threads.add(t)
        t.start()
        return t

    def _accept_loop(self) -> None:
        try:
            while True:
                try:
                    raw, _ = self.listener.accept()
                except OSError:
                    return  # stop() shut the listener down
                with self.lock:
                    if self.stopped.is_set():
                        raw.close()
                        return
                    self.connections += 1
                    # Wrapped before the handshake so that stop() can shut the socket down during it.
                    c = _Connection(self.connections, self.ctx.wrap_socket(raw, server_side=True, do_handshake_on_connect=False))
                    self.live[c.number] = c
                self._spawn(self._serve, f"conn{c.number}", c)
        finally:
            self.listener.close()

    def _serve(self, c: _Connection) -> None:
        try:
            c.sock.do_handshake()
            if c.sock.selected_alpn_protocol() == "h2":
                self._serve_h2(c)
            else:
                self._serve_http1(c)
        except (OSError, ValueError, h2.exceptions.ProtocolError):
            pass  # the client went away or spoke nonsense: so does the connection
        finally:
            with self.lock:
                del self.live[c.number]
                # Its held answers have nowhere to go (and its wake pipe is closing).
                self.held = [h for h in self.held if h.connection is not c]
                c.sock.close()
                os.close(c.wake_r)
                os.close(c.wake_w)

    # HTTP/2

    def _serve_h2(self, c: _Connection) -> None:
        sock = c.sock
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.local_settings = h2.settings.Settings(client=False, initial_values=H2_SETTINGS)
        conn.initiate_connection()
        sock.setblocking(False)
        _send(sock, conn.data_to_send())
        streams: dict[int, tuple[list, bytearray]] = {}
        poller = select.poll()  # not select(): a benchmark's process may hold descriptors past 1024
        poller.register(sock, select.POLLIN)
        poller.register(c.wake_r, select.POLLIN)
        while True:
            if not sock.pending():
                if any(fd == c.wake_r for fd, _ in poller.poll()):
                    while _drain(c.wake_r):
                        pass
            if self.stopped.is_set():
                return
            try:
                data = sock.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                data = None  # woken for released answers, or only part of a TLS record came
            if data == b"":
                return
            for ev in conn.receive_data(data) if data else []:
                if isinstance(ev, h2.events.PingReceived):  # h2 answers it
                    with self.lock:
                        self.pings.append((c.number, time.monotonic()))
                elif isinstance(ev, h2.events.RequestReceived):
                    streams[ev.stream_id] = (ev.headers, bytearray())
                elif isinstance(ev, h2.events.DataReceived):
                    streams[ev.stream_id][1].extend(ev.data)
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    headers, body = streams.pop(ev.stream_id)
                    answer = self.handler(_h2_request(headers, bytes(body), c.number))
                    if isinstance(answer, Held):
                        with self.lock:
                            answer.connection = c
                        c.held.append((ev.stream_id, answer))
                    else:
                        _h2_respond(conn, ev.stream_id, answer)
                elif isinstance(ev, h2.events.StreamReset):
                    streams.pop(ev.stream_id, None)
                    c.held = [(sid, h) for sid, h in c.held if sid != ev.stream_id]
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    _send(sock, conn.data_to_send())
                    return
            # Answers released since (or before) their stream was held.
            waiting = []
            for sid, held in c.held:
                if not held.released.is_set():
                    waiting.append((sid, held))
                elif not self.stopped.is_set():
                    _h2_respond(conn, sid, held.response)
            c.held = waiting
            _send(sock, conn.data_to_send())

    # HTTP/1.1

    def _serve_http1(self, c: _Connection) -> None:
        with c.sock.makefile("rb") as f:
            while True:
                req = _read_http1(f, c.number)
                if req is None:
                    return
                if not self.http1:
                    # Heard out, then refused, so that the client sees why.
                    c.sock.sendall(_http1_response(Response(505, [("connection", "close")])))
                    return
                answer = self.handler(req)
                if isinstance(answer, Held):
                    answer.released.wait()
                    if self.stopped.is_set():
                        return
                    answer = answer.response
                c.sock.sendall(_http1_response(answer))
                if req.headers.get("connection", "").lower() == "close":
                    return


def _shutdown(sock: socket.socket) -> None:
    try:
        # The base class's shutdown: SSLSocket's own would unwrap TLS under the serving thread.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return False


def _send(sock: ssl.SSLSocket, data: bytes) -> None:
    if data:
        sock.setblocking(True)
        try:
            sock.sendall(data)
        finally:
            sock.setblocking(False)


def _h2_request(headers: list, body: bytes, connection: int) -> Request:
    fields: dict[str, str] = {}
    repeated = set()
    for name, value in headers:
        if name in fields:
            repeated.add(name)
        fields[name] = value
    return Request(fields.get(":method", ""), fields.get(":path", ""),
                   {k: v for k, v in fields.items() if not k.startswith(":")}, body, connection, time.time(),
                   frozenset(repeated))


def _h2_respond(conn: h2.connection.H2Connection, stream_id: int, r: Response) -> None:
    try:
        conn.send_headers(stream_id, [(":status", str(r.status)), ("content-length", str(len(r.body)))] + r.headers,
                          end_stream=not r.body)
        if r.body:
            conn.send_data(stream_id, r.body, end_stream=True)
    except h2.exceptions.StreamClosedError:
        pass  # the client reset the stream while its answer was held


def _read_http1(f, connection: int) -> Request | None:
    line = f.readline(65536)
    if not line.strip():
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    repeated = set()
    while (h := f.readline(65536).decode("latin-1")) not in ("\r\n", "\n", ""):
        k, v = h.split(":", 1)
        k = k.strip().lower()
        if k in headers:
            repeated.add(k)
        headers[k] = v.strip()
    if "transfer-encoding" in headers:
        raise ValueError("chunked bodies are not supported by the stand-in")
    body = f.read(int(headers.get("content-length", "0")))
    return Request(method, path, headers, body, connection, time.time(), frozenset(repeated))


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Status"


def _http1_response(r: Response) -> bytes:
    head = f"HTTP/1.1 {r.status} {_phrase(r.status)}\r\ncontent-length: {len(r.body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in r.headers) + "\r\n"
    return head.encode() + r.body


# ---------------------------------------------------------------- common

@dataclass
class Outcome:
    """A scripted answer: an error status (with its reason: an APNs reason, an
    FCM errorCode, a Web Push body), or 200/201 for the usual success."""
    status: int
    reason: str = ""
    retry_after: int | None = None

    @classmethod
    def parse(cls, text: str) -> "Outcome":
        """STATUS[:REASON[:RETRY_AFTER]], as the command line takes it."""
        status, reason, retry_after = (text.split(":") + ["", ""])[:3]
        return cls(int(status), reason, int(retry_after) if retry_after else None)


class StandIn:
    """What every stand-in shares: scripted outcomes, holding, what it accepted and refused."""

    http1 = True

    def __init__(self, folder: str | Path | None = None):
        self.own_folder = folder is None
        self.folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="herald-push-standin-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.accepted: list[dict] = []
        self.refused: list[dict] = []
        self.outcomes: list[Outcome] = []
        self.outcomes_for: dict[str, list[Outcome]] = {}
        self.default_outcome: Outcome | None = None
        self.hold = False
        self.log_file: Path | None = None
        self.count_file: Path | None = None
        self.server = TLSServer(self._dispatch, self.folder, http1=self.http1)
        self.ca_file = self.server.ca_file

    def start(self, port: int = 0):
        self.server.start(port)
        return self

    def stop(self) -> None:
        self.server.stop()
        if self.own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        return self.server.connections

    def pings(self) -> list[tuple[int, float]]:
        """(connection number, time.monotonic()) of each HTTP/2 PING received so far."""
        with self.server.lock:
            return list(self.server.pings)

    def script(self, *outcomes: Outcome, key: str | None = None) -> None:
        """The next requests (or those for `key`: a device token, FCM token or subscription id)
        that pass every check get these answers, in order."""
        with self.lock:
            (self.outcomes_for.setdefault(key, []) if key else self.outcomes).extend(outcomes)

    def release_held(self) -> None:
        """Stops holding, and sends every answer held so far."""
        with self.lock:  # no push is then recorded as held without being released
            self.hold = False
            self.server.release_held()

    def wait_for(self, n: int, timeout: float = 30.0, refused: bool = False) -> list[dict]:
        """Waits until `n` requests were accepted (or refused); returns them all."""
        records = self.refused if refused else self.accepted
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(records) < n:
                left = deadline - time.monotonic()
                assert left > 0, (f"{len(records)} of {n} {'refusals' if refused else 'pushes'} in {timeout} s; "
                                  f"accepted {len(self.accepted)}, last refused: {self.refused[-3:]}")
                self.changed.wait(left)
            return list(records)

    def counts(self) -> dict:
        return {"accepted": len(self.accepted), "refused": len(self.refused), "connections": self.connections}

    def describe(self) -> dict:
        """What a Herald config needs to point at this stand-in."""
        return {"url": self.url, "caFile": self.ca_file}

    def _handle(self, req: Request) -> Response | Held:
        raise NotImplementedError

    def _dispatch(self, req: Request) -> Response | Held:
        try:
            return self._handle(req)
        except Exception:  # a stand-in bug: answered and recorded, not lost in a thread
            return self._refuse(req, 500, b"stand-in error", "stand-in error: " + traceback.format_exc())

    def _next_outcome(self, key: str) -> Outcome | None:
        with self.lock:
            q = self.outcomes_for.get(key)
            if q:
                return q.pop(0)
            return self.outcomes.pop(0) if self.outcomes else self.default_outcome

    def _scripted(self, response: Response) -> Response | Held:
        """A scripted answer: held, as an accepted push's is, when `hold` is on."""
        with self.lock:
            return self.server.hold(response) if self.hold else response

    def _refuse(self, req: Request, status: int, body: bytes, reason: str, headers=None) -> Response:
        with self.changed:
            self.refused.append({"path": req.path, "status": status, "reason": reason, "at": req.at,
                                 "connection": req.connection, "authorization": req.headers.get("authorization")})
            self._counted()
        return Response(status, headers or [], body)

    def _accept(self, req: Request, record: dict, response: Response) -> Response | Held:
        """Records a push that passed every check; held when `hold` is on."""
        with self.changed:
            record.update(at=req.at, connection=req.connection, held=self.hold)
            answer = self.server.hold(response) if self.hold else response
            self.accepted.append(record)
            if self.log_file:
                with open(self.log_file, "a") as f:
                    f.write(json.dumps(record, default=_loggable) + "\n")
            self._counted()
        return answer

    def _counted(self) -> None:
        """Wakes waiters and rewrites the count file (atomically, for readers in other processes). Holds the lock."""
        self.changed.notify_all()
        if self.count_file:
            tmp = self.count_file.with_name(self.count_file.name + ".tmp")
            tmp.write_text(json.dumps(self.counts()))
            os.replace(tmp, self.count_file)


def _loggable(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------- APNs

HEX = set("0123456789abcdefABCDEF")
# Apple's reason for a scripted status given without one.
APNS_REASONS = {400: "BadDeviceToken", 403: "ExpiredProviderToken", 410: "Unregistered"}
UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


class APNsStandIn(StandIn):
    """POST /3/device/<token> over HTTP/2 only, with an ES256 provider token.

    `key` is the P-256 signing key, written to `key_file` (AuthKey_<key_id>.p8,
    PKCS#8 PEM) as Apple hands it out. Accepted records: token, headers,
    payload, collapseId, keyId (the provider token's), at, connection, held.

    One stand-in is one of Apple's environments (`environment`, production or
    development, the sandbox). `team` makes it the other environment of the
    same team: the same ids, topic and keys. Apple lets a key be limited to one
    environment (`add_key`, `limit_key`): a token it signed is refused in the
    other with 403 BadEnvironmentKeyInToken."""

    http1 = False  # Apple: "APNs requires the use of HTTP/2"

    def __init__(self, folder=None, team_id: str = "TEAM123456", key_id: str = "KEY1234567", topic: str = "com.example.app",
                 environment: str = "production", team: "APNsStandIn | None" = None):
        super().__init__(folder)
        self.environment = environment
        if team is not None:
            self.team_id, self.key_id, self.topic = team.team_id, team.key_id, team.topic
            self.key, self.key_file, self.keys = team.key, team.key_file, team.keys  # shared: one team's keys
        else:
            self.team_id, self.key_id, self.topic = team_id, key_id, topic
            # The team's keys by key id: each signing key and the environment it is limited to, if any.
            self.keys: dict[str, dict] = {}
            self.key_file = self.add_key(key_id)
            self.key = self.keys[key_id]["key"]
        self.tokens_by_connection: dict[int, tuple[str, float]] = {}
        # Signatures checked once per provider token (as APNs does per connection); ages every time.
        self.verified: dict[str, tuple[dict, dict]] = {}

    def add_key(self, key_id: str, environment: str | None = None) -> Path:
        """A new key of the team (limited to `environment` if given), written as Apple hands it out; answers its file."""
        key = ec.generate_private_key(ec.SECP256R1())
        f = self.folder / f"AuthKey_{key_id}.p8"
        f.write_bytes(pem_private(key))
        with self.lock:
            self.keys[key_id] = {"key": key, "environment": environment}
        return f

    def limit_key(self, key_id: str, environment: str | None) -> None:
        """Limits a key to one environment (None: both), as the developer account's key settings do."""
        with self.lock:
            self.keys[key_id]["environment"] = environment

    def describe(self) -> dict:
        return {**super().describe(), "teamId": self.team_id, "keyId": self.key_id, "keyFile": str(self.key_file),
                "topic": self.topic, "environment": self.environment}

    def _error(self, req: Request, status: int, reason: str, retry_after: int | None = None) -> Response:
        body = {"reason": reason}
        if status == 410:
            body["timestamp"] = int(time.time() * 1000)
        headers = [("apns-id", self._apns_id(req)), ("content-type", "application/json")]
        if retry_after is not None:
            headers.append(("retry-after", str(retry_after)))
        return self._refuse(req, status, json.dumps(body).encode(), reason, headers)

    @staticmethod
    def _apns_id(req: Request) -> str:
        given = req.headers.get("apns-id", "")
        return given if UUID.match(given) else str(uuid.uuid4())

    def _provider_token_refusal(self, req: Request) -> Response | None:
        auth = req.headers.get("authorization")
        if not auth:
            return self._error(req, 403, "MissingProviderToken")
        scheme, _, provider = auth.partition(" ")
        if scheme.lower() != "bearer" or not provider:
            return self._error(req, 403, "InvalidProviderToken")
        with self.lock:
            verified = self.verified.get(provider)
        if verified is None:
            try:
                header = jwt.get_unverified_header(provider)
                with self.lock:
                    key = self.keys.get(header.get("kid"), {}).get("key")
                if key is None:  # not a key of this team
                    return self._error(req, 403, "InvalidProviderToken")
                claims = jwt.decode(provider, key.public_key(), algorithms=["ES256"],
                                    options={"require": ["iss", "iat"], "verify_iat": False})
            except jwt.PyJWTError:
                return self._error(req, 403, "InvalidProviderToken")
            verified = (header, claims)
            with self.lock:
                self.verified[provider] = verified
        header, claims = verified
        if claims["iss"] != self.team_id or not isinstance(claims["iat"], int):
            return self._error(req, 403, "InvalidProviderToken")
        with self.lock:
            limited_to = self.keys[header["kid"]]["environment"]
        if limited_to not in (None, self.environment):
            return self._error(req, 403, "BadEnvironmentKeyInToken")
        now = time.time()
        if now - claims["iat"] > 3600:
            return self._error(req, 403, "ExpiredProviderToken")
        if claims["iat"] > now + 1:  # a second for rounding: both sides read this machine's clock
            return self._error(req, 403, "InvalidProviderToken")
        with self.lock:
            last = self.tokens_by_connection.get(req.connection)
            renewed_too_soon = last is not None and last[0] != provider and now - last[1] < 20 * 60
            if last is None or (last[0] != provider and not renewed_too_soon):
                self.tokens_by_connection[req.connection] = (provider, now)
        return self._error(req, 429, "TooManyProviderTokenUpdates") if renewed_too_soon else None

    def _handle(self, req: Request):
        if req.method != "POST":
            return self._error(req, 405, "MethodNotAllowed")
        if not req.path.startswith("/3/device/"):
            return self._error(req, 404, "BadPath")
        if req.repeated:
            return self._error(req, 400, "DuplicateHeaders")
        refusal = self._provider_token_refusal(req)
        if refusal:
            return refusal
        token = req.path[len("/3/device/"):]
        if not token:
            return self._error(req, 400, "MissingDeviceToken")
        if not 64 <= len(token) <= 200 or not set(token) <= HEX:
            return self._error(req, 400, "BadDeviceToken")
        if "apns-id" in req.headers and not UUID.match(req.headers["apns-id"]):
            return self._error(req, 400, "BadMessageId")
        topic = req.headers.get("apns-topic")
        if not topic:
            return self._error(req, 400, "MissingTopic")
        if topic != self.topic:
            # Not an app of this team (a token of another app of the team would be DeviceTokenNotForTopic).
            return self._error(req, 400, "TopicDisallowed")
        push_type = req.headers.get("apns-push-type")
        if push_type not in ("alert", "background"):
            return self._error(req, 400, "InvalidPushType")
        priority = req.headers.get("apns-priority", "10")  # Apple: omitted means 10
        if priority not in ("1", "5", "10") or (push_type == "background" and priority != "5"):
            return self._error(req, 400, "BadPriority")
        expiration = req.headers.get("apns-expiration")
        if expiration is not None and not expiration.isdigit():
            return self._error(req, 400, "BadExpirationDate")
        collapse = req.headers.get("apns-collapse-id")
        if collapse is not None and len(collapse.encode()) > 64:
            return self._error(req, 400, "BadCollapseId")
        if len(req.body) > 4096:
            return self._error(req, 413, "PayloadTooLarge")
        if not req.body:
            return self._error(req, 400, "PayloadEmpty")
        try:
            payload = json.loads(req.body)
        except ValueError:
            payload = None
        # Apple documents no reason for a payload that is not a JSON object with `aps`; refused all the same.
        if not isinstance(payload, dict) or not isinstance(payload.get("aps"), dict):
            return self._error(req, 400, "BadPayload")
        if push_type == "background" and payload["aps"].get("content-available") != 1:
            return self._error(req, 400, "BadPayload")
        outcome = self._next_outcome(token)
        if outcome is not None and outcome.status != 200:
            reason = outcome.reason or APNS_REASONS.get(outcome.status) or _phrase(outcome.status).replace(" ", "")
            return self._scripted(self._error(req, outcome.status, reason, outcome.retry_after))
        key_id = jwt.get_unverified_header(req.headers["authorization"].partition(" ")[2])["kid"]
        return self._accept(req, {"token": token, "headers": req.headers, "payload": payload, "collapseId": collapse,
                                  "keyId": key_id}, Response(200, [("apns-id", self._apns_id(req))]))


# ---------------------------------------------------------------- FCM

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# Google's token endpoint, the `aud` Google's own client library (google-auth) always signs,
# whatever token_uri its key file names.
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
# FCM v1's Message and AndroidConfig fields; Google's JSON parser refuses unknown names.
MESSAGE_FIELDS = {"name", "data", "notification", "android", "webpush", "apns", "fcm_options", "token", "topic", "condition"}
ANDROID_FIELDS = {"collapse_key", "priority", "ttl", "restricted_package_name", "data", "notification", "fcm_options",
                  "direct_boot_ok", "bandwidth_constrained_ok", "restricted_satellite_ok"}
DURATION = re.compile(r"^\d+(\.\d{1,9})?s$")
# Google's canonical status and FCM errorCode for each scripted HTTP status.
FCM_ERRORS = {400: ("INVALID_ARGUMENT", "INVALID_ARGUMENT"), 401: ("UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR"),
              403: ("PERMISSION_DENIED", "SENDER_ID_MISMATCH"), 404: ("NOT_FOUND", "UNREGISTERED"),
              429: ("RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), 500: ("INTERNAL", "INTERNAL"),
              503: ("UNAVAILABLE", "UNAVAILABLE")}

# The messages FCM sends with those errorCodes.
FCM_MESSAGES = {"INVALID_ARGUMENT": "The registration token is not a valid FCM registration token",
                "UNREGISTERED": "Requested entity was not found.", "SENDER_ID_MISMATCH": "SenderId mismatch",
                "QUOTA_EXCEEDED": "Quota exceeded for quota metric 'Send requests'."}


def _snake(name: str) -> str:
    """Google's JSON takes both lowerCamelCase and the proto's snake_case field names."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


class FCMStandIn(StandIn):
    """The service account's token endpoint (POST /token) and messages:send of FCM HTTP v1.

    `service_account_file` (written at start, when the token_uri is known) holds
    the RSA key; access tokens last `expires_in` seconds. Accepted records:
    token, message, at, connection, held."""

    def __init__(self, folder=None, project_id: str = "herald-test", expires_in: int = 3599):
        super().__init__(folder)
        self.project_id = project_id
        self.expires_in = expires_in
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_key_id = uuid.uuid4().hex
        self.client_email = f"herald@{project_id}.iam.gserviceaccount.com"
        self.service_account_file = self.folder / "service-account.json"
        self.access_tokens: dict[str, float] = {}
        self.token_requests = 0

    def start(self, port: int = 0):
        super().start(port)
        self.token_uri = f"{self.url}/token"
        self.service_account_file.write_text(json.dumps({
            "type": "service_account", "project_id": self.project_id, "private_key_id": self.private_key_id,
            "private_key": pem_private(self.key).decode(), "client_email": self.client_email, "client_id": "1",
            "token_uri": self.token_uri}))
        return self

    def expire_access_tokens(self) -> None:
        """Every access token issued so far is refused from now on, as after its expires_in."""
        with self.lock:
            self.access_tokens.clear()

    def counts(self) -> dict:
        return {**super().counts(), "tokenRequests": self.token_requests}

    def describe(self) -> dict:
        return {**super().describe(), "serviceAccountFile": str(self.service_account_file), "projectId": self.project_id}

    def _google_error(self, req: Request, code: int, message: str, error_code: str | None = None,
                      retry_after: int | None = None, status: str | None = None) -> Response:
        status = status or FCM_ERRORS.get(code, ("INTERNAL", None))[0]
        err = {"code": code, "message": message, "status": status}
        if error_code:
            err["details"] = [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": error_code}]
        headers = [("content-type", "application/json")] + ([("retry-after", str(retry_after))] if retry_after else [])
        return self._refuse(req, code, json.dumps({"error": err}).encode(), f"{status} {error_code or ''}: {message}", headers)

    def _invalid(self, req: Request, message: str) -> Response:
        return self._google_error(req, 400, message, "INVALID_ARGUMENT")

    def _handle(self, req: Request):
        if req.path == "/token" and req.method == "POST":
            return self._token(req)
        if req.path != f"/v1/projects/{self.project_id}/messages:send" or req.method != "POST":
            return self._google_error(req, 404, "Requested entity was not found.", status="NOT_FOUND")
        scheme, _, access = req.headers.get("authorization", "").partition(" ")
        with self.lock:
            expires = self.access_tokens.get(access) if scheme.lower() == "bearer" else None
        if expires is None or expires <= time.time():
            return self._google_error(req, 401, "Request had invalid authentication credentials. Expected OAuth 2 access "
                                                "token, login cookie or other valid authentication credential.")
        try:
            request = json.loads(req.body)
            message = request["message"]
        except (ValueError, KeyError, TypeError):
            return self._invalid(req, "Invalid JSON payload received.")
        if not isinstance(message, dict):
            return self._invalid(req, "Invalid value at 'message'")
        unknown = {k for k in request if _snake(k) not in ("message", "validate_only")}
        unknown |= {k for k in message if _snake(k) not in MESSAGE_FIELDS}
        android = message.get("android", {})
        if not isinstance(android, dict):
            return self._invalid(req, "Invalid value at 'message.android'")
        unknown |= {k for k in android if _snake(k) not in ANDROID_FIELDS}
        if unknown:
            return self._invalid(req, f"Invalid JSON payload received. Unknown name {sorted(unknown)}")
        token = message.get("token")
        if not isinstance(token, str) or not token or "topic" in message or "condition" in message:
            return self._invalid(req, "The registration token is not a valid FCM registration token")
        data = message.get("data", {})
        if not isinstance(data, dict) or any(not isinstance(v, str) for v in data.values()):
            return self._invalid(req, "Invalid value at 'message.data': values must be strings")
        # FCM's reference: no key may be a reserved word ("from", "message_type", or any word starting with "google" or "gcm").
        if any(k in ("from", "notification", "message_type") or k.lower().startswith(("google", "gcm")) for k in data):
            return self._invalid(req, "Invalid data payload key")
        if len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()) > 4096:
            return self._invalid(req, "Android message is too big")
        if android.get("priority", "normal") not in ("normal", "high", "NORMAL", "HIGH"):
            return self._invalid(req, "Invalid value at 'message.android.priority'")
        ttl = android.get("ttl")
        if ttl is not None and not (isinstance(ttl, str) and DURATION.match(ttl) and float(ttl[:-1]) <= 28 * 86400):
            return self._invalid(req, "Invalid value at 'message.android.ttl' (a duration of at most 4 weeks)")
        collapse = android.get("collapse_key", android.get("collapseKey"))
        if collapse is not None and not isinstance(collapse, str):
            return self._invalid(req, "Invalid value at 'message.android.collapse_key'")
        outcome = self._next_outcome(token)
        if outcome is not None and outcome.status != 200:
            code = outcome.reason or FCM_ERRORS.get(outcome.status, (None, None))[1]
            return self._scripted(self._google_error(req, outcome.status, FCM_MESSAGES.get(code, "scripted"), code,
                                                     outcome.retry_after))
        name = f"projects/{self.project_id}/messages/{uuid.uuid4().int % 10 ** 19}"
        response = Response(200, [("content-type", "application/json")], json.dumps({"name": name}).encode())
        if request.get("validate_only", request.get("validateOnly")):
            return response  # checked, never delivered
        return self._accept(req, {"token": token, "message": message, "name": name}, response)

    def _token(self, req: Request) -> Response:
        with self.changed:
            self.token_requests += 1
            self._counted()

        def no(error: str, why: str) -> Response:
            return self._refuse(req, 400, json.dumps({"error": error, "error_description": why}).encode(), f"{error}: {why}",
                                [("content-type", "application/json")])
        if not req.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            return no("invalid_request", "Invalid Content-Type")
        form = urllib.parse.parse_qs(req.body.decode())
        if form.get("grant_type") != [JWT_BEARER]:
            return no("unsupported_grant_type", f"Invalid grant_type: {form.get('grant_type')}")
        if len(form.get("assertion", [])) != 1:
            return no("invalid_request", "Missing required parameter: assertion")
        assertion = form["assertion"][0]
        try:
            header = jwt.get_unverified_header(assertion)
            claims = jwt.decode(assertion, self.key.public_key(), algorithms=["RS256"], audience=[self.token_uri, GOOGLE_TOKEN_URI],
                                options={"require": ["iss", "aud", "iat", "exp"]})
        except jwt.PyJWTError as e:
            return no("invalid_grant", f"Invalid JWT: {e}")
        if header.get("kid", self.private_key_id) != self.private_key_id or claims["iss"] != self.client_email:
            return no("invalid_grant", "Invalid JWT Signature.")
        if claims["exp"] - claims["iat"] > 3600:
            return no("invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes)")
        if SCOPE not in str(claims.get("scope", "")).split():
            return no("invalid_scope", f"the assertion's scope lacks {SCOPE}")
        access = "ya29." + b64url(os.urandom(32))
        with self.lock:
            self.access_tokens[access] = time.time() + self.expires_in
        return Response(200, [("content-type", "application/json")],
                        json.dumps({"access_token": access, "expires_in": self.expires_in, "token_type": "Bearer"}).encode())


# ---------------------------------------------------------------- Web Push

# Mozilla's autopush docs: a push to a bridged (FCM-reached) browser "may be limited to only 2744 bytes".
BRIDGED_MAX_BODY = 2744
TOPIC_ALPHABET = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class WebPushStandIn(StandIn):
    """POST /push/<id> for subscriptions it made (`new_subscription`), as a browser's push service.

    Accepted records: subscription (id), headers, plaintext (bytes), json
    (parsed, or None), size (of the encrypted body), at, connection, held. `redirect_to` is where a
    scripted 3xx points."""

    def __init__(self, folder=None):
        super().__init__(folder)
        self.subscriptions: dict[str, dict] = {}
        self.redirect_to = "https://127.0.0.1:1/"

    def new_subscription(self, application_server_key: str | None = None, bridged: bool = False) -> dict:
        """A subscription as `PushSubscription.toJSON()` gives it. The stand-in keeps the key pair
        and auth secret, as the browser would. With `application_server_key` (b64url public key,
        as given to `pushManager.subscribe`), only VAPID signed by that key is taken. `bridged`:
        a browser that Mozilla's autopush reaches through FCM (Firefox for Android), whose bodies
        "may be limited to only 2744 bytes": larger ones get autopush's 413."""
        key = ec.generate_private_key(ec.SECP256R1())
        auth = os.urandom(16)
        sid = b64url(os.urandom(12))
        with self.lock:
            self.subscriptions[sid] = {"key": key, "auth": auth, "applicationServerKey": application_server_key,
                                       "maxBody": BRIDGED_MAX_BODY if bridged else 4096}
        return {"endpoint": f"{self.url}/push/{sid}", "keys": {"p256dh": b64url(public_point(key)), "auth": b64url(auth)}}

    def _handle(self, req: Request):
        def no(status: int, why: str, retry_after: int | None = None) -> Response:
            headers = [("content-type", "text/plain")] + ([("retry-after", str(retry_after))] if retry_after else [])
            if 300 <= status < 400:
                headers.append(("location", self.redirect_to))
            return self._refuse(req, status, why.encode(), why, headers)
        sid = req.path[len("/push/"):] if req.path.startswith("/push/") else None
        with self.lock:
            sub = self.subscriptions.get(sid)
        if sub is None:
            return no(404, "no such subscription")
        if req.method != "POST":
            return no(405, "POST only")
        ttl = req.headers.get("ttl")
        if ttl is None or not ttl.isdigit():  # RFC 8030 5.2: TTL is required
            return no(400, "TTL header missing or not a number")
        if req.headers.get("content-encoding") != "aes128gcm":  # RFC 8291 4
            return no(415, "Content-Encoding must be aes128gcm")
        urgency = req.headers.get("urgency")
        if urgency is not None and urgency not in ("very-low", "low", "normal", "high"):  # RFC 8030 5.3
            return no(400, "bad Urgency")
        topic = req.headers.get("topic")
        if topic is not None and not (0 < len(topic) <= 32 and set(topic) <= TOPIC_ALPHABET):  # RFC 8030 5.4
            return no(400, "bad Topic")
        scheme, _, params_text = req.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "vapid":
            return no(401, "VAPID authorization required")
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in params_text.split(","))}
        try:
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(params["k"]))
            claims = jwt.decode(params["t"], public, algorithms=["ES256"], audience=self.url,
                                options={"require": ["aud", "exp", "sub"]})
        except (KeyError, ValueError, jwt.PyJWTError) as e:
            return no(401, f"VAPID: {e!r}")
        if claims["exp"] > time.time() + 24 * 3600:  # RFC 8292 2
            return no(401, "VAPID exp more than 24 hours ahead")
        if not str(claims["sub"]).startswith(("mailto:", "https:")):
            return no(401, "VAPID sub must be a mailto: or https: URI")
        if sub["applicationServerKey"] and unb64url(params["k"]) != unb64url(sub["applicationServerKey"]):
            return no(403, "VAPID key is not the one the subscription was made with")  # RFC 8292 4.2
        if len(req.body) > 4096:  # RFC 8030 7.2
            return no(413, "payload too large")
        if len(req.body) > sub["maxBody"]:
            # autopush's error form (autoendpoint's ApiError), errno 104 for a body its bridge cannot carry.
            return self._refuse(req, 413, json.dumps({
                "code": 413, "errno": 104, "error": "Payload Too Large",
                "message": "This message is intended for a constrained device and is limited in size. "
                           f"Converted buffer is too long by {len(req.body) - sub['maxBody']} bytes",
                "more_info": "http://autopush.readthedocs.io/en/latest/http.html#error-codes"}).encode(),
                "bridged body over 2744 bytes", [("content-type", "application/json")])
        # RFC 8291 4: one record, whose keyid is the sender's 65-byte public key.
        if len(req.body) < 21 or req.body[20] != 65 or len(req.body) - 86 >= int.from_bytes(req.body[16:20], "big"):
            return no(400, "not a single aes128gcm record keyed by a P-256 public key")
        try:
            plaintext = http_ece.decrypt(req.body, private_key=sub["key"], auth_secret=sub["auth"], version="aes128gcm")
        except Exception as e:  # http_ece raises its own and cryptography's errors
            return no(400, f"cannot decrypt: {e!r}")
        outcome = self._next_outcome(sid)
        if outcome is not None and outcome.status not in (200, 201):
            return self._scripted(no(outcome.status, outcome.reason or _phrase(outcome.status), outcome.retry_after))
        try:
            parsed = json.loads(plaintext)
        except ValueError:
            parsed = None
        response = Response(201, [("location", f"{self.url}/message/{uuid.uuid4().hex}"), ("ttl", ttl)])
        return self._accept(req, {"subscription": sid, "headers": req.headers, "plaintext": plaintext, "json": parsed,
                                  "size": len(req.body)}, response)


# ---------------------------------------------------------------- as a process

def main() -> None:
    p = argparse.ArgumentParser(description="A push service stand-in on 127.0.0.1 (see the module's doc).")
    p.add_argument("service", choices=["apns", "fcm", "webpush", "count"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--state", required=True, help="folder for the CA, credentials, standin.json and received.jsonl")
    p.add_argument("--outcome", action="append", default=[], type=Outcome.parse,
                   help="STATUS[:REASON[:RETRY_AFTER]], in order; the last one answers every request after it")
    p.add_argument("--hold", action="store_true", help="take requests and never answer them")
    p.add_argument("--count-file", type=Path, help="kept up to date with the counters, as JSON")
    p.add_argument("--subscriptions", type=int, default=1, help="webpush: subscriptions written to subscriptions.json")
    a = p.parse_args()
    state = Path(a.state)
    if a.service == "count":
        f = state / "received.jsonl"
        print(sum(1 for _ in open(f)) if f.exists() else 0)
        return
    s = {"apns": APNsStandIn, "fcm": FCMStandIn, "webpush": WebPushStandIn}[a.service](state)
    s.log_file = state / "received.jsonl"
    s.count_file = a.count_file
    s.hold = a.hold
    if a.outcome:
        *s.outcomes, s.default_outcome = a.outcome
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # A parent's thread may have had them blocked (Foundation's Process
    # starts children from such threads): a blocked SIGTERM would never stop us.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    s.start(a.port)
    info = s.describe()
    if isinstance(s, WebPushStandIn):
        info["subscriptionsFile"] = str(state / "subscriptions.json")
        Path(info["subscriptionsFile"]).write_text(json.dumps([s.new_subscription() for _ in range(a.subscriptions)]))
    (state / "standin.json").write_text(json.dumps(info))
    print(f"listening on {s.url}", flush=True)
    stop.wait()
    s.stop()


if __name__ == "__main__":
    main()
