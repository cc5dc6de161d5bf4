"""A TLS server for the CurlClient and HTTP2Client tests: HTTP/2 (h2, by ALPN) and HTTP/1.1.

Makes a throwaway CA and a certificate for 127.0.0.1 (and one more CA that
vouches for nothing here), prints one JSON line {"port", "http1Port", "ca",
"otherCa"} once listening on 127.0.0.1 (http1Port offers only HTTP/1.1 by
ALPN), then serves until stdin closes or SIGTERM. After it, one JSON line
per event on an HTTP/2 connection:
{"event": "ping", "connection": N, "at": seconds} for each PING received,
{"event": "closed", "connection": N} once the connection ended.
Routes:
  /echo         200, JSON: method, path, headers, bodyLength, protocol, connection (its number)
  /hang         never answers
  /redirect     302 to /echo
  /big          200 with 200 KiB, its Content-Length told
  /big-stream   200 with 200 KiB, no Content-Length
  /big-headers  200 with 12 headers of 1 KiB (one HTTP/2 frame: curl 7.88 stalls
                on a header block larger than its 16 KiB buffer)
  /status/NNN   status NNN with Retry-After: 7
  /stats        {"connections": N} accepted so far
  /deaf         200, then the HTTP/2 connection sends nothing more (PINGs go unanswered)
  /bye          200, then the server closes the HTTP/2 connection (and then reports it closed)
  /held         answered (as /echo) only after a /goaway's GOAWAY, on the same connection
  /goaway       200, then GOAWAY naming this stream the last processed, then the
                answers to the /held streams before it; the streams after it go unanswered
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

BIG = b"x" * (200 * 1024)
connections = 0
lock = threading.Lock()


def report(**fields) -> None:
    with lock:
        print(json.dumps(fields), flush=True)


def make_cert(subject: str, issuer=None, san=None):
    """(key, cert): self-signed CA when no issuer (key, cert) is given."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer[1].subject if issuer else name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, builder.sign(issuer[0] if issuer else key, hashes.SHA256())


def pem(key, cert) -> bytes:
    out = cert.public_bytes(serialization.Encoding.PEM)
    if key:
        out += key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return out


def answer(path: str, method: str, headers: dict, body: bytes, protocol: str, number: int, port: int):
    """(status, headers, body, tell the length) or None to hang."""
    if path in ("/hang", "/held"):
        return None
    if path == "/redirect":
        return 302, [("location", f"https://127.0.0.1:{port}/echo")], b"", True
    if path == "/big":
        return 200, [], BIG, True
    if path == "/big-stream":
        return 200, [], BIG, False
    if path == "/big-headers":
        return 200, [(f"x-filler-{i}", "y" * 1024) for i in range(12)], b"", True
    if path.startswith("/status/"):
        return int(path.rsplit("/", 1)[1]), [("retry-after", "7")], b'{"reason":"Scripted"}', True
    if path == "/stats":
        with lock:
            return 200, [], json.dumps({"connections": connections}).encode(), True
    return 200, [("x-echo", "yes")], json.dumps({"method": method, "path": path, "headers": headers, "bodyLength": len(body),
                                                 "protocol": protocol, "connection": number}).encode(), True


def serve_h2(sock, number: int, port: int):
    # The h2 package's defaults apply: at most 100 concurrent streams.
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    requests: dict[int, dict] = {}
    unsent: dict[int, bytes] = {}  # bodies waiting for the peer's flow-control window
    deaf = deafening = gone = bye = False
    held: list[int] = []  # /held streams, answered after the GOAWAY
    try:
        while data := sock.recv(65536):
            if gone:
                continue  # after GOAWAY: read until the client closes, so that it reads the GOAWAY rather than a reset
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.PingReceived):
                    report(event="ping", connection=number, at=time.monotonic())
                elif isinstance(event, h2.events.RequestReceived):
                    requests[event.stream_id] = {"headers": dict(event.headers), "body": b""}
                elif isinstance(event, h2.events.DataReceived):
                    if event.stream_id in requests:
                        requests[event.stream_id]["body"] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    requests.pop(event.stream_id, None)
                    unsent.pop(event.stream_id, None)
                elif isinstance(event, h2.events.StreamEnded):
                    r = requests.pop(event.stream_id)
                    h = r["headers"]
                    reply = answer(h[":path"], h[":method"], {k: v for k, v in h.items() if not k.startswith(":")},
                                   r["body"], "h2", number, port)
                    if reply is None:
                        if h[":path"] == "/held":
                            held.append(event.stream_id)
                        continue
                    status, extra, body, tell = reply
                    length = [("content-length", str(len(body)))] if tell else []
                    conn.send_headers(event.stream_id, [(":status", str(status))] + length + extra)
                    unsent[event.stream_id] = body
                    if h[":path"] == "/deaf":
                        deafening = True
                    elif h[":path"] == "/bye":
                        bye = True
                    elif h[":path"] == "/goaway":
                        conn.send_data(event.stream_id, body, end_stream=True)
                        del unsent[event.stream_id]
                        # The GOAWAY by hand (RFC 9113 6.8: last stream id, NO_ERROR), so that
                        # answers to streams it names processed can follow it, as servers do;
                        # h2 sends nothing after its own.
                        goaway = (8).to_bytes(3, "big") + bytes([7, 0]) + (0).to_bytes(4, "big") \
                            + event.stream_id.to_bytes(4, "big") + (0).to_bytes(4, "big")
                        sock.sendall(conn.data_to_send() + goaway)
                        for stream in held:
                            reply_body = json.dumps({"path": "/held", "protocol": "h2", "connection": number}).encode()
                            conn.send_headers(stream, [(":status", "200"), ("content-length", str(len(reply_body)))])
                            conn.send_data(stream, reply_body, end_stream=True)
                        gone = True
                        break
            for stream, body in [] if gone else list(unsent.items()):
                try:
                    while body and (size := min(conn.local_flow_control_window(stream), conn.max_outbound_frame_size, len(body))) > 0:
                        conn.send_data(stream, body[:size])
                        body = body[size:]
                    if body:
                        unsent[stream] = body
                    else:
                        conn.end_stream(stream)
                        del unsent[stream]
                except h2.exceptions.StreamClosedError:
                    del unsent[stream]
            out = conn.data_to_send()
            if not deaf:
                sock.sendall(out)
            deaf = deaf or deafening  # what answered /deaf went out; nothing after it does
            if bye:
                sock.close()
                return
    finally:
        report(event="closed", connection=number)


def serve_http1(sock, number: int, port: int):
    f = sock.makefile("rb")
    while line := f.readline():
        method, path, _ = line.decode().split(" ", 2)
        headers = {}
        while (h := f.readline().decode()) not in ("\r\n", "\n", ""):
            k, v = h.split(":", 1)
            headers[k.strip().lower()] = v.strip()
        body = f.read(int(headers.get("content-length", "0")))
        reply = answer(path, method, headers, body, "http/1.1", number, port)
        if reply is None:
            threading.Event().wait()
        status, extra, out, tell = reply
        framing = f"content-length: {len(out)}\r\n" if tell else "transfer-encoding: chunked\r\n"
        head = f"HTTP/1.1 {status} X\r\n{framing}" + "".join(f"{k}: {v}\r\n" for k, v in extra) + "\r\n"
        sock.sendall(head.encode() + (out if tell else f"{len(out):x}\r\n".encode() + out + b"\r\n0\r\n\r\n"))


def main():
    folder = Path(tempfile.mkdtemp(prefix="herald-curl-test-"))
    try:
        ca = make_cert("herald test CA")
        server = make_cert("127.0.0.1", issuer=ca, san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        other_ca = make_cert("another CA")
        (folder / "ca.pem").write_bytes(pem(None, ca[1]))
        (folder / "other-ca.pem").write_bytes(pem(None, other_ca[1]))
        (folder / "server.pem").write_bytes(pem(*server))
        def serve(protocols: list[str]) -> int:
            """Listens on a port of its own offering `protocols` by ALPN; returns the port."""
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(folder / "server.pem")
            ctx.set_alpn_protocols(protocols)
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(512)
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
                        except (OSError, ssl.SSLError, ValueError, h2.exceptions.ProtocolError):
                            pass

                    threading.Thread(target=run, daemon=True).start()

            threading.Thread(target=accept, daemon=True).start()
            return port

        port = serve(["h2", "http/1.1"])
        http1_port = serve(["http/1.1"])
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print(json.dumps({"port": port, "http1Port": http1_port, "ca": str(folder / "ca.pem"), "otherCa": str(folder / "other-ca.pem")}), flush=True)
        sys.stdin.read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
