"""TLS in the gateway (--tls-cert/--tls-key): https and wss with a
certificate the test makes, verified by the clients; every transport through
it, with large payloads (writes the socket takes in part); certificates
re-read on SIGHUP without dropping connections."""
from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from herald_helpers import APPS, changes_in, mint_token, read_until_eof, wait_until

SERVER_KEY = APPS["app.one"]["serverKey"]


def make_cert(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_gateway(gateway_factory, tmp_path):
    cert, key = make_cert(tmp_path, "first")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(cert.read_bytes())
    gw = gateway_factory(extra_args=["--tls-cert", str(cert), "--tls-key", str(key)], ca=ca)
    gw.tls_files = (cert, key)
    return gw


def served_certificate(gw) -> bytes:
    ctx = ssl.create_default_context(cafile=str(gw.ca))
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return s.getpeercert(binary_form=True)


def pem_der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def publish(gw, user: str, anid: str, size: int = 10) -> dict:
    r = gw.request("POST", f"/v1/apps/app.one/users/{user}/notifications", key=SERVER_KEY,
                   json={"appNotificationId": anid, "payload": {"body": "x" * size}})
    assert r.status_code == 201, r.text
    return r.json()


def test_every_transport_over_tls(tls_gateway, user):
    gw = tls_gateway
    assert gw.listen_line.startswith("listening on https://")
    # A catch-up of 64 KiB payloads: frames far larger than a TLS record
    # and than what the socket takes at once.
    for i in range(40):
        publish(gw, user, f"big-{i}", 60_000)
    ws, frames, welcome = gw.connect(user, "phone")
    assert len([n for f in frames for n in f.get("notifications", [])]) == 40
    # Long-poll held over TLS, and an event stream.
    r = gw.request("GET", "/v1/me/sync", token=mint_token(user), params={"wait": 0})
    cursor, epoch = r.json()["cursor"], r.json()["epoch"]
    held: dict = {}
    poll = threading.Thread(target=lambda: held.update(r=gw.request(
        "GET", "/v1/me/sync", token=mint_token(user), params={"cursor": cursor, "epoch": epoch, "wait": 30}, timeout=40)))
    poll.start()
    wait_until(lambda: gw.metric('herald_connections{transport="poll"}') == 1, "the poll is held")
    stream = gw.request("GET", "/v1/me/events", token=mint_token(user), params={"cursor": cursor, "epoch": epoch},
                        stream=True, timeout=30)
    assert stream.status_code == 200
    wait_until(lambda: gw.metric('herald_connections{transport="sse"}') == 1, "the stream is open")
    n = publish(gw, user, "live", 65_000)["notification"]
    poll.join(40)
    assert [c["notification"]["id"] for c in held["r"].json()["changes"]] == [n["id"]]
    lines = stream.iter_lines()
    data = next(l for l in lines if l.startswith(b"data: "))
    assert json.loads(data[6:])["notification"]["id"] == n["id"]
    stream.close()
    f = ws.recv()
    assert [c["notification"]["id"] for c in changes_in([f])] == [n["id"]]
    # A dismiss over HTTPS reaches the WebSocket.
    r = gw.request("PATCH", f"/v1/me/notifications/{n['id']}", token=mint_token(user), json={"userActionState": "dismissed"})
    assert r.status_code == 200, r.text
    f, _ = ws.recv_until(lambda f: f["type"] in ("change", "changes"))
    assert changes_in([f])[0]["notification"]["userActionState"] == "dismissed"


def test_plain_http_on_a_tls_port_gets_no_answer(tls_gateway):
    with socket.create_connection(("127.0.0.1", tls_gateway.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = read_until_eof(s)
    assert not data.startswith(b"HTTP/"), data[:100]
    assert tls_gateway.request("GET", "/healthz").status_code == 200


def test_sighup_reloads_the_certificate_and_keeps_connections(tls_gateway, tmp_path, user):
    gw = tls_gateway
    cert, key = gw.tls_files
    assert served_certificate(gw) == pem_der(cert)
    ws, _, _ = gw.connect(user, "phone")
    new_cert, new_key = make_cert(tmp_path, "second")
    gw.ca.write_bytes(cert.read_bytes() + new_cert.read_bytes())
    cert.write_bytes(new_cert.read_bytes())
    key.write_bytes(new_key.read_bytes())
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reloaded the TLS certificate" in gw.stderr_tail(), "the reload is logged")
    assert served_certificate(gw) == pem_der(new_cert)
    # The WebSocket opened before the reload still works.
    n = publish(gw, user, "after-reload")["notification"]
    f = ws.recv()
    assert changes_in([f])[0]["notification"]["id"] == n["id"]

    # Files that do not load change nothing.
    key.write_text("not a key")
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in gw.stderr_tail(), "the refusal is logged")
    assert served_certificate(gw) == pem_der(new_cert)
    assert gw.alive()


@pytest.mark.parametrize("files", [("missing.crt", "missing.key"), ("garbage", "garbage")])
def test_unusable_certificate_is_refused_at_start(herald_bin, tmp_path, files):
    for f in files:
        if f == "garbage":
            (tmp_path / f).write_text("junk")
    r = subprocess.run([str(herald_bin), "serve", "--port", "0", "--store", "memory", "--app", "a", "--server-key", "k",
                        "--token-secret", "s", "--tls-cert", str(tmp_path / files[0]), "--tls-key", str(tmp_path / files[1])],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and "TLS" in r.stderr, r.stderr
