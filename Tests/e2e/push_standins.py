"""Local stand-ins for the push services (SPEC section 10), written from their
public documentation, each checking what the real service checks with
independent libraries (PyJWT, cryptography, http-ece), never Herald's code:

- APNsStandIn: Apple's HTTP/2 provider API with token-based authentication
  ("Sending notification requests to APNs", "Establishing a token-based
  connection to APNs", "Handling notification responses from APNs").
- FCMStandIn: Firebase Cloud Messaging HTTP v1 (`messages:send`) and the
  OAuth 2.0 JWT-bearer token endpoint of a service account.
- WebPushStandIn: a push service of RFC 8030, with RFC 8291 encryption and
  RFC 8292 VAPID, for subscriptions it made as a browser would.

Each runs in a thread of the test process (start()/stop(), or `with`) on
127.0.0.1 over TLS with a CA of its own (`ca_file`), or as a process:

  push_standins.py apns|fcm|webpush --port 0 --state DIR [--outcome STATUS[:REASON[:RETRY_AFTER]]] [--hold]
      prints "listening on https://127.0.0.1:PORT"; DIR gets standin.json
      (its CA, key files, ids) and received.jsonl (one line per push it took)
  push_standins.py count --state DIR      pushes taken so far
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import json
import os
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import http_ece
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def unb64url(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def pem_private(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


# ---------------------------------------------------------------- TLS

class CertificateAuthority:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost."""

    def __init__(self, folder: Path, name: str = "push stand-in CA"):
        now = datetime.datetime.now(datetime.timezone.utc)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
              .not_valid_after(now + datetime.timedelta(days=7))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
                .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=7))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                            x509.DNSName("localhost")]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        self.ca_file = folder / "ca.pem"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.chain_file = folder / "server.pem"
        self.chain_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + pem_private(key))


@dataclass
class Request:
    method: str
    path: str
    headers: dict
    body: bytes
    protocol: str
    connection: int


@dataclass
class Response:
    status: int
    headers: list = field(default_factory=list)
    body: bytes = b""


class HOLD:
    """A handler's answer for a request never answered (until release or stop)."""


class TLSServer:
    """Threads on 127.0.0.1: TLS with ALPN, HTTP/2 (h2) and, where allowed, HTTP/1.1."""

    def __init__(self, handler, folder: Path, http1: bool = True):
        self.handler = handler
        self.ca = CertificateAuthority(folder)
        self.ca_file = str(self.ca.ca_file)
        self.http1 = http1
        self.connections = 0
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def start(self, port: int = 0) -> "TLSServer":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.ca.chain_file)
        ctx.set_alpn_protocols(["h2", "http/1.1"] if self.http1 else ["h2"])
        self.ctx = ctx
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(256)
        self.port = self.listener.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.released.set()
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def release_held(self) -> None:
        self.released.set()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
                self.sockets.append(raw)
            threading.Thread(target=self._serve, args=(raw, number), daemon=True).start()

    def _serve(self, raw: socket.socket, number: int) -> None:
        try:
            sock = self.ctx.wrap_socket(raw, server_side=True)
            if sock.selected_alpn_protocol() == "h2":
                self._serve_h2(sock, number)
            elif self.http1:
                self._serve_http1(sock, number)
            else:
                # Read the request's head before refusing it, so the client hears the answer.
                f = sock.makefile("rb")
                length = 0
                while (line := f.readline()) not in (b"\r\n", b"\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                f.read(length)
                sock.sendall(b"HTTP/1.1 505 HTTP Version Not Supported\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        except (OSError, ssl.SSLError, ValueError, h2.exceptions.ProtocolError):
            pass
        finally:
            raw.close()

    def _released(self) -> Response | None:
        """A held request's answer: 200 once released, none if the server stopped."""
        self.released.wait()
        return None if self.stopped.is_set() else Response(200)

    def _answer(self, req: Request):
        answer = self.handler(req)
        return self._released() if answer is HOLD else answer

    def _serve_h2(self, sock, number: int) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        send_lock = threading.Lock()
        streams: dict[int, dict] = {}

        def respond(stream_id: int, r: Response | None) -> None:
            if r is None:
                return
            with send_lock:
                conn.send_headers(stream_id, [(":status", str(r.status)), ("content-length", str(len(r.body)))] + r.headers,
                                  end_stream=not r.body)
                if r.body:
                    conn.send_data(stream_id, r.body, end_stream=True)
                try:
                    sock.sendall(conn.data_to_send())
                except (OSError, ssl.SSLError):
                    pass  # the client went away while this stream was held

        while not self.stopped.is_set():
            data = sock.recv(65536)
            if not data:
                return
            with send_lock:
                events = conn.receive_data(data)
                for ev in events:
                    if isinstance(ev, h2.events.RequestReceived):
                        streams[ev.stream_id] = {"headers": dict(ev.headers), "body": b""}
                    elif isinstance(ev, h2.events.DataReceived):
                        streams[ev.stream_id]["body"] += ev.data
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                sock.sendall(conn.data_to_send())
            for ev in events:
                if isinstance(ev, h2.events.StreamEnded):
                    s = streams.pop(ev.stream_id)
                    h = s["headers"]
                    req = Request(h[":method"], h[":path"], {k: v for k, v in h.items() if not k.startswith(":")},
                                  s["body"], "h2", number)
                    answer = self.handler(req)
                    if answer is HOLD:
                        # Held on its own thread, so it holds no other stream.
                        threading.Thread(target=lambda sid=ev.stream_id: respond(sid, self._released()), daemon=True).start()
                    else:
                        respond(ev.stream_id, answer)

    def _serve_http1(self, sock, number: int) -> None:
        f = sock.makefile("rb")
        while not self.stopped.is_set():
            line = f.readline()
            if not line:
                return
            method, path, _ = line.decode("latin-1").split(" ", 2)
            headers = {}
            while (h := f.readline().decode("latin-1")) not in ("\r\n", "\n", ""):
                k, v = h.split(":", 1)
                headers[k.strip().lower()] = v.strip()
            body = f.read(int(headers.get("content-length", "0")))
            r = self._answer(Request(method, path, headers, body, "http/1.1", number))
            if r is None:
                return
            head = f"HTTP/1.1 {r.status} X\r\ncontent-length: {len(r.body)}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in r.headers) + "\r\n"
            sock.sendall(head.encode() + r.body)


# ---------------------------------------------------------------- common

@dataclass
class Outcome:
    status: int
    reason: str = ""
    retry_after: int | None = None


class StandIn:
    """What every stand-in shares: scripted outcomes, what it accepted and refused."""

    http1 = True

    def __init__(self, folder: str | Path | None = None):
        self.folder = Path(folder or tempfile.mkdtemp(prefix="herald-push-standin-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.accepted: list[dict] = []
        self.refused: list[dict] = []
        self.outcomes: list[Outcome] = []
        self.outcomes_for: dict[str, list[Outcome]] = {}
        self.hold = False
        self.changed = threading.Condition(self.lock)
        self.log_file: Path | None = None
        # Where a scripted 3xx answer points.
        self.redirect_to = "https://127.0.0.1:1/"
        self.server = TLSServer(self._handle, self.folder, http1=self.http1)
        self.ca_file = self.server.ca_file

    def start(self, port: int = 0):
        self.server.start(port)
        self.url = self.server.url
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def connections(self) -> int:
        return self.server.connections

    def script(self, *outcomes: Outcome, key: str | None = None) -> None:
        """The next requests (or those for `key`, a device token or subscription id) get these answers, in order."""
        with self.lock:
            (self.outcomes_for.setdefault(key, []) if key else self.outcomes).extend(outcomes)

    def release_held(self) -> None:
        self.hold = False
        self.server.release_held()

    def wait_for(self, n: int, timeout: float = 30.0) -> list[dict]:
        """Waits until `n` pushes were accepted; returns them."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.accepted) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.accepted)} of {n} pushes arrived in {timeout} s; refused: {self.refused[-3:]}"
                self.changed.wait(left)
            return list(self.accepted)

    def _next_outcome(self, key: str) -> Outcome | None:
        with self.lock:
            q = self.outcomes_for.get(key)
            if q:
                return q.pop(0)
            return self.outcomes.pop(0) if self.outcomes else None

    def _refuse(self, req: Request, status: int, body: bytes, why: str, headers=None) -> Response:
        with self.changed:
            self.refused.append({"path": req.path, "status": status, "why": why, "at": time.time()})
            self.changed.notify_all()
        return Response(status, headers or [], body)

    def _accept(self, record: dict) -> None:
        record["at"] = time.time()
        with self.changed:
            self.accepted.append(record)
            self.changed.notify_all()
            if self.log_file:
                with open(self.log_file, "a") as f:
                    f.write(json.dumps(record, default=str) + "\n")

    def _handle(self, req: Request):
        raise NotImplementedError


# ---------------------------------------------------------------- APNs

class APNsStandIn(StandIn):
    """POST /3/device/<token> over HTTP/2 only, with an ES256 provider token."""

    http1 = False  # Apple: "APNs requires the use of HTTP/2"

    def __init__(self, folder=None, team_id: str = "TEAM123456", key_id: str = "KEY1234567", topic: str = "com.example.app"):
        super().__init__(folder)
        self.team_id, self.key_id, self.topic = team_id, key_id, topic
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.key_file = self.folder / f"AuthKey_{key_id}.p8"
        self.key_file.write_bytes(pem_private(self.key))
        self.tokens_by_connection: dict[int, tuple[str, float]] = {}
        self.verified: dict[str, tuple[dict, dict]] = {}

    def _error(self, req: Request, status: int, reason: str, retry_after: int | None = None) -> Response:
        body = {"reason": reason}
        if status == 410:
            body["timestamp"] = int(time.time() * 1000)
        headers = [("apns-id", "00000000-0000-0000-0000-000000000000")]
        if retry_after is not None:
            headers.append(("retry-after", str(retry_after)))
        return self._refuse(req, status, json.dumps(body).encode(), reason, headers)

    def _handle(self, req: Request):
        if req.method != "POST":
            return self._error(req, 405, "MethodNotAllowed")
        if not req.path.startswith("/3/device/"):
            return self._error(req, 404, "BadPath")
        token = req.path[len("/3/device/"):]
        auth = req.headers.get("authorization", "")
        if not auth.startswith("bearer "):
            return self._error(req, 403, "MissingProviderToken")
        provider = auth[len("bearer "):]
        # Verified once per token, as APNs does per connection; its age is checked every time.
        verified = self.verified.get(provider)
        if verified is None:
            try:
                header = jwt.get_unverified_header(provider)
                claims = jwt.decode(provider, self.key.public_key(), algorithms=["ES256"],
                                    options={"require": ["iat", "iss"], "verify_iat": False})
            except jwt.PyJWTError:
                return self._error(req, 403, "InvalidProviderToken")
            verified = self.verified[provider] = (header, claims)
        header, claims = verified
        if header.get("alg") != "ES256" or header.get("kid") != self.key_id or claims.get("iss") != self.team_id:
            return self._error(req, 403, "InvalidProviderToken")
        age = time.time() - claims["iat"]
        if age > 3600:
            return self._error(req, 403, "ExpiredProviderToken")
        if age < -60:
            return self._error(req, 403, "InvalidProviderToken")
        with self.lock:
            last = self.tokens_by_connection.get(req.connection)
            if last and last[0] != provider and time.time() - last[1] < 20 * 60:
                refresh = True
            else:
                refresh = False
                if not last or last[0] != provider:
                    self.tokens_by_connection[req.connection] = (provider, time.time())
        if refresh:
            return self._error(req, 429, "TooManyProviderTokenUpdates")
        if not (64 <= len(token) <= 200) or any(c not in "0123456789abcdefABCDEF" for c in token):
            return self._error(req, 400, "BadDeviceToken")
        if req.headers.get("apns-topic") != self.topic:
            return self._error(req, 400, "DeviceTokenNotForTopic" if req.headers.get("apns-topic") else "MissingTopic")
        push_type = req.headers.get("apns-push-type")
        if push_type not in ("alert", "background"):
            return self._error(req, 400, "InvalidPushType")
        priority = req.headers.get("apns-priority", "10")
        if priority not in ("5", "10") or (push_type == "background" and priority != "5"):
            return self._error(req, 400, "BadPriority")
        expiration = req.headers.get("apns-expiration")
        if expiration is not None and not expiration.isdigit():
            return self._error(req, 400, "BadExpirationDate")
        collapse = req.headers.get("apns-collapse-id")
        if collapse is not None and len(collapse.encode()) > 64:
            return self._error(req, 400, "BadCollapseId")
        if len(req.body) > 4096:
            return self._error(req, 413, "PayloadTooLarge")
        try:
            payload = json.loads(req.body)
        except ValueError:
            return self._error(req, 400, "BadPayload")
        if not isinstance(payload, dict) or not isinstance(payload.get("aps"), dict):
            return self._error(req, 400, "PayloadEmpty")
        if push_type == "background" and payload["aps"].get("content-available") != 1:
            return self._error(req, 400, "BadPayload")
        outcome = self._next_outcome(token)
        if outcome is not None and outcome.status != 200:
            return self._error(req, outcome.status, outcome.reason or "Scripted", outcome.retry_after)
        if self.hold:
            self._accept({"token": token, "headers": req.headers, "payload": payload, "held": True,
                          "collapseId": collapse, "connection": req.connection})
            return HOLD
        self._accept({"token": token, "headers": req.headers, "payload": payload, "collapseId": collapse,
                      "connection": req.connection})
        return Response(200, [("apns-id", "00000000-0000-0000-0000-000000000001")])

    def describe(self) -> dict:
        return {"teamId": self.team_id, "keyId": self.key_id, "keyFile": str(self.key_file), "topic": self.topic,
                "caFile": self.ca_file, "url": self.url}


# ---------------------------------------------------------------- FCM

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
RESERVED = {"from", "notification", "message_type"}


class FCMStandIn(StandIn):
    """The service account's token endpoint and messages:send of FCM HTTP v1."""

    def __init__(self, folder=None, project_id: str = "herald-test", expires_in: int = 3599):
        super().__init__(folder)
        self.project_id = project_id
        self.expires_in = expires_in
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.client_email = f"herald@{project_id}.iam.gserviceaccount.com"
        self.access_tokens: dict[str, float] = {}
        self.token_requests = 0

    def start(self, port: int = 0):
        super().start(port)
        self.token_uri = f"{self.url}/token"
        self.service_account_file = self.folder / "service-account.json"
        self.service_account_file.write_text(json.dumps({
            "type": "service_account", "project_id": self.project_id, "private_key_id": "k1",
            "private_key": pem_private(self.key).decode(), "client_email": self.client_email,
            "token_uri": self.token_uri}))
        return self

    def _google_error(self, req: Request, code: int, status: str, message: str, error_code: str | None = None,
                      retry_after: int | None = None) -> Response:
        err = {"code": code, "message": message, "status": status}
        if error_code:
            err["details"] = [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": error_code}]
        headers = [("content-type", "application/json")] + ([("retry-after", str(retry_after))] if retry_after else [])
        return self._refuse(req, code, json.dumps({"error": err}).encode(), f"{status} {error_code or ''}", headers)

    def _handle(self, req: Request):
        if req.path == "/token" and req.method == "POST":
            return self._token(req)
        prefix = f"/v1/projects/{self.project_id}/messages:send"
        if req.path != prefix or req.method != "POST":
            return self._google_error(req, 404, "NOT_FOUND", "no such method")
        auth = req.headers.get("authorization", "")
        with self.lock:
            expires = self.access_tokens.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
        if expires is None or expires < time.time():
            return self._google_error(req, 401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        try:
            message = json.loads(req.body)["message"]
        except (ValueError, KeyError, TypeError):
            return self._google_error(req, 400, "INVALID_ARGUMENT", "Invalid JSON payload received.", "INVALID_ARGUMENT")
        token = message.get("token")
        data = message.get("data", {})
        if not isinstance(token, str) or not token:
            return self._google_error(req, 400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token",
                                      "INVALID_ARGUMENT")
        if not isinstance(data, dict) or any(not isinstance(v, str) for v in data.values()):
            return self._google_error(req, 400, "INVALID_ARGUMENT", "data values must be strings", "INVALID_ARGUMENT")
        if any(k in RESERVED or k.startswith(("google.", "gcm.")) for k in data):
            return self._google_error(req, 400, "INVALID_ARGUMENT", "data uses a reserved key", "INVALID_ARGUMENT")
        if len(json.dumps(data).encode()) > 4096:
            return self._google_error(req, 400, "INVALID_ARGUMENT", "message is too big", "INVALID_ARGUMENT")
        android = message.get("android", {})
        if android.get("priority", "normal") not in ("normal", "high"):
            return self._google_error(req, 400, "INVALID_ARGUMENT", "bad android.priority", "INVALID_ARGUMENT")
        ttl = android.get("ttl")
        if ttl is not None and not (isinstance(ttl, str) and ttl.endswith("s") and ttl[:-1].replace(".", "", 1).isdigit()):
            return self._google_error(req, 400, "INVALID_ARGUMENT", "bad android.ttl", "INVALID_ARGUMENT")
        outcome = self._next_outcome(token)
        if outcome is not None and outcome.status != 200:
            status = {404: "NOT_FOUND", 400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE",
                      401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}.get(outcome.status, "INTERNAL")
            message_text = ("The registration token is not a valid FCM registration token" if outcome.status == 400 else "scripted")
            return self._google_error(req, outcome.status, status, message_text, outcome.reason or None, outcome.retry_after)
        if self.hold:
            self._accept({"token": token, "message": message, "held": True})
            return HOLD
        self._accept({"token": token, "message": message})
        return Response(200, [("content-type", "application/json")],
                        json.dumps({"name": f"projects/{self.project_id}/messages/{len(self.accepted)}"}).encode())

    def _token(self, req: Request) -> Response:
        form = urllib.parse.parse_qs(req.body.decode())
        with self.lock:
            self.token_requests += 1

        def bad(why: str) -> Response:
            return self._refuse(req, 400, json.dumps({"error": "invalid_grant", "error_description": why}).encode(), why,
                                [("content-type", "application/json")])
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"] or "assertion" not in form:
            return bad("bad grant_type or no assertion")
        try:
            claims = jwt.decode(form["assertion"][0], self.key.public_key(), algorithms=["RS256"], audience=self.token_uri,
                                options={"require": ["iss", "aud", "iat", "exp"]})
        except jwt.PyJWTError as e:
            return bad(f"Invalid JWT: {e}")
        if claims["iss"] != self.client_email or SCOPE not in claims.get("scope", "").split() or claims["exp"] - claims["iat"] > 3600:
            return bad("Invalid JWT claims")
        access = b64url(os.urandom(24))
        with self.lock:
            self.access_tokens[access] = time.time() + self.expires_in
        return Response(200, [("content-type", "application/json")],
                        json.dumps({"access_token": access, "expires_in": self.expires_in, "token_type": "Bearer"}).encode())

    def describe(self) -> dict:
        return {"serviceAccountFile": str(self.service_account_file), "caFile": self.ca_file, "url": self.url}


# ---------------------------------------------------------------- Web Push

class WebPushStandIn(StandIn):
    """POST /push/<id> for subscriptions it made (`new_subscription`), as a browser's push service."""

    def __init__(self, folder=None):
        super().__init__(folder)
        self.subscriptions: dict[str, dict] = {}

    def new_subscription(self, application_server_key: str | None = None) -> dict:
        """A subscription as `PushSubscription.toJSON()` gives it, with the key pair and auth secret a browser keeps."""
        key = ec.generate_private_key(ec.SECP256R1())
        auth = os.urandom(16)
        sid = b64url(os.urandom(12))
        public = key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        with self.lock:
            self.subscriptions[sid] = {"key": key, "auth": auth, "applicationServerKey": application_server_key}
        return {"endpoint": f"{self.url}/push/{sid}", "keys": {"p256dh": b64url(public), "auth": b64url(auth)}}

    def _handle(self, req: Request):
        def no(status: int, why: str, retry_after: int | None = None) -> Response:
            headers = [("retry-after", str(retry_after))] if retry_after else []
            if 300 <= status < 400:
                headers.append(("location", self.redirect_to))
            return self._refuse(req, status, why.encode(), why, headers)
        if req.method != "POST" or not req.path.startswith("/push/"):
            return no(404, "no such subscription")
        sid = req.path[len("/push/"):]
        with self.lock:
            sub = self.subscriptions.get(sid)
        if sub is None:
            return no(404, "no such subscription")
        ttl = req.headers.get("ttl")
        if ttl is None or not ttl.isdigit():
            return no(400, "TTL header missing or not a number")
        if req.headers.get("content-encoding") != "aes128gcm":
            return no(415, "Content-Encoding must be aes128gcm")
        urgency = req.headers.get("urgency")
        if urgency is not None and urgency not in ("very-low", "low", "normal", "high"):
            return no(400, "bad Urgency")
        topic = req.headers.get("topic")
        if topic is not None and (len(topic) > 32 or any(c not in
                                                        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in topic)):
            return no(400, "bad Topic")
        auth = req.headers.get("authorization", "")
        if not auth.startswith("vapid "):
            return no(401, "VAPID authorization required")
        params = dict(p.strip().split("=", 1) for p in auth[len("vapid "):].split(",") if "=" in p)
        try:
            k = unb64url(params["k"])
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), k)
            claims = jwt.decode(params["t"], public, algorithms=["ES256"], audience=self.url, options={"require": ["aud", "exp", "sub"]})
        except (KeyError, ValueError, jwt.PyJWTError) as e:
            return no(401, f"VAPID: {e}")
        if claims["exp"] > time.time() + 24 * 3600:
            return no(401, "VAPID exp more than 24 hours ahead")
        if not str(claims["sub"]).startswith(("mailto:", "https:")):
            return no(401, "VAPID sub must be mailto: or https:")
        if sub["applicationServerKey"] and params["k"] != sub["applicationServerKey"]:
            return no(403, "VAPID key is not the subscription's")
        if len(req.body) > 4096:
            return no(413, "payload too large")
        try:
            plaintext = http_ece.decrypt(req.body, private_key=sub["key"], auth_secret=sub["auth"], version="aes128gcm")
        except Exception as e:  # http_ece raises its own and cryptography's errors
            return no(400, f"cannot decrypt: {e}")
        outcome = self._next_outcome(sid)
        if outcome is not None and outcome.status not in (200, 201):
            return no(outcome.status, outcome.reason or "scripted", outcome.retry_after)
        try:
            parsed = json.loads(plaintext)
        except ValueError:
            parsed = None
        record = {"subscription": sid, "headers": req.headers, "plaintext": plaintext, "json": parsed}
        if self.hold:
            self._accept({**record, "held": True})
            return HOLD
        self._accept(record)
        return Response(201, [("location", f"{self.url}/message/{len(self.accepted)}")])

    def describe(self) -> dict:
        return {"caFile": self.ca_file, "url": self.url}


# ---------------------------------------------------------------- as a process

def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("service", choices=["apns", "fcm", "webpush", "count"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--state", required=True)
    p.add_argument("--outcome", help="STATUS[:REASON[:RETRY_AFTER]], answered to every request")
    p.add_argument("--hold", action="store_true")
    a = p.parse_args()
    state = Path(a.state)
    if a.service == "count":
        f = state / "received.jsonl"
        print(sum(1 for _ in open(f)) if f.exists() else 0)
        return
    s = {"apns": APNsStandIn, "fcm": FCMStandIn, "webpush": WebPushStandIn}[a.service](state)
    s.log_file = state / "received.jsonl"
    s.start(a.port)
    s.hold = a.hold
    if a.outcome:
        parts = a.outcome.split(":")
        s.outcomes = _Forever(Outcome(int(parts[0]), parts[1] if len(parts) > 1 else "", int(parts[2]) if len(parts) > 2 else None))
    (state / "standin.json").write_text(json.dumps(s.describe()))
    print(f"listening on {s.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    s.stop()


class _Forever(list):
    """An outcome queue that never runs out: every request gets the same answer."""

    def __init__(self, outcome: Outcome):
        super().__init__([outcome])

    def pop(self, *_):
        return self[0]


if __name__ == "__main__":
    main()
