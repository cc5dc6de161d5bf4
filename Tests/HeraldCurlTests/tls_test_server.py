"""A TLS server for the CurlClient tests: HTTP/2 (h2, by ALPN) and HTTP/1.1.

Prints one JSON line {"port", "ca", "otherCa"} once listening on 127.0.0.1,
then serves until stdin closes. Routes:
  /echo            200, JSON: method, path, headers, body length, protocol, connection number
  /hang            never answers
  /redirect        302 to /echo
  /big             200 with 200 KiB
  /status/NNN      status NNN with Retry-After: 7
  /stats           {"connections": N} accepted so far
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import sys
import tempfile
import threading
from pathlib import Path

import h2.config
import h2.connection
import h2.events
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

connections = 0
lock = threading.Lock()


def make_ca(name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    return key, cert


def make_server_cert(ca_key, ca_cert):
    import ipaddress
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def pem(obj) -> bytes:
    if hasattr(obj, "private_bytes"):
        return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return obj.public_bytes(serialization.Encoding.PEM)


def answer(path: str, method: str, headers: dict, body: bytes, protocol: str, number: int, port: int):
    """(status, headers, body) or None to hang."""
    if path == "/hang":
        return None
    if path == "/redirect":
        return 302, [("location", f"https://127.0.0.1:{port}/echo")], b""
    if path == "/big":
        return 200, [], b"x" * (200 * 1024)
    if path.startswith("/status/"):
        return int(path.rsplit("/", 1)[1]), [("retry-after", "7")], b'{"reason":"Scripted"}'
    if path == "/stats":
        with lock:
            return 200, [], json.dumps({"connections": connections}).encode()
    return 200, [("x-echo", "yes")], json.dumps({"method": method, "path": path, "headers": headers, "bodyLength": len(body),
                                                 "protocol": protocol, "connection": number}).encode()


def serve_h2(sock, number: int, port: int):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    streams: dict[int, dict] = {}
    while True:
        data = sock.recv(65536)
        if not data:
            return
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                streams[event.stream_id] = {"headers": dict(event.headers), "body": b""}
            elif isinstance(event, h2.events.DataReceived):
                streams[event.stream_id]["body"] += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                s = streams.pop(event.stream_id)
                h = s["headers"]
                reply = answer(h[":path"], h[":method"], {k: v for k, v in h.items() if not k.startswith(":")},
                               s["body"], "h2", number, port)
                if reply is None:
                    continue
                status, extra, body = reply
                conn.send_headers(event.stream_id, [(":status", str(status)), ("content-length", str(len(body)))] + extra)
                # Large bodies go out as the peer's flow-control window allows.
                sent = 0
                while sent < len(body):
                    size = min(conn.local_flow_control_window(event.stream_id), conn.max_outbound_frame_size, len(body) - sent)
                    if size <= 0:
                        sock.sendall(conn.data_to_send())
                        more = sock.recv(65536)
                        if not more:
                            return
                        conn.receive_data(more)
                        continue
                    conn.send_data(event.stream_id, body[sent:sent + size])
                    sent += size
                conn.end_stream(event.stream_id)
        sock.sendall(conn.data_to_send())


def serve_http1(sock, number: int, port: int):
    f = sock.makefile("rb")
    while True:
        line = f.readline()
        if not line:
            return
        method, path, _ = line.decode().split(" ", 2)
        headers = {}
        while (h := f.readline().decode()) not in ("\r\n", "\n", ""):
            k, v = h.split(":", 1)
            headers[k.strip().lower()] = v.strip()
        body = f.read(int(headers.get("content-length", "0")))
        reply = answer(path, method, headers, body, "http/1.1", number, port)
        if reply is None:
            threading.Event().wait()
        status, extra, out = reply
        head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(out)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in extra) + "\r\n"
        sock.sendall(head.encode() + out)


def main():
    folder = Path(tempfile.mkdtemp(prefix="herald-curl-test-"))
    ca_key, ca_cert = make_ca("herald test CA")
    key, cert = make_server_cert(ca_key, ca_cert)
    _, other_ca = make_ca("another CA")
    (folder / "ca.pem").write_bytes(pem(ca_cert))
    (folder / "other-ca.pem").write_bytes(pem(other_ca))
    (folder / "server.pem").write_bytes(pem(cert) + pem(key))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(folder / "server.pem")
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]

    def accept():
        global connections
        while True:
            raw, _ = listener.accept()
            with lock:
                connections += 1
                number = connections

            def run(raw=raw, number=number):
                try:
                    sock = ctx.wrap_socket(raw, server_side=True)
                    (serve_h2 if sock.selected_alpn_protocol() == "h2" else serve_http1)(sock, number, port)
                except (OSError, ssl.SSLError, ValueError):
                    pass

            threading.Thread(target=run, daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(json.dumps({"port": port, "ca": str(folder / "ca.pem"), "otherCa": str(folder / "other-ca.pem")}), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
