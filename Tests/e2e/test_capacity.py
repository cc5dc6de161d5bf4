"""A process's connections: one gateway per port (a second one on a port in
use fails instead of sharing it), a connection cap below the descriptor
limit (503 with Retry-After past it), and no spinning when descriptors run
out (each connection past them is accepted and closed)."""
from __future__ import annotations

import resource
import socket
import subprocess
import time

import pytest
import requests

from herald_helpers import CONFIG, wait_until


def test_a_second_gateway_on_a_port_in_use_fails(gateway, herald_bin, tmp_path):
    r = subprocess.run([str(herald_bin), "serve", "--port", str(gateway.port), "--store", "memory",
                        "--app", "a", "--server-key", "k", "--token-secret", "s"],
                       capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert r.returncode == 2, r
    assert "Address already in use" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert gateway.request("GET", "/healthz").status_code == 200


def open_connection(gw) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200"), "an admitted connection is served"
    return s


def test_past_the_connection_cap_requests_are_answered_503(gateway_factory):
    gw = gateway_factory(config={**CONFIG, "limits": {"maxConnections": 4}})
    held = [open_connection(gw) for _ in range(4)]
    try:
        r = gw.request("GET", "/healthz", headers={"Connection": "close"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable", r.text
        assert int(r.headers["Retry-After"]) >= 1
        # A WebSocket upgrade past the cap is answered 503 too.
        from websockets.exceptions import InvalidStatus
        with pytest.raises(InvalidStatus) as e:
            gw.ws()
        assert e.value.response.status_code == 503
        assert "connection limit" in gw.stderr_tail()
    finally:
        for s in held:
            s.close()
    # Room again once connections close.
    wait_until(lambda: gw.request("GET", "/healthz", headers={"Connection": "close"}).status_code == 200, "room again")
    assert gw.metric('herald_refused_connections_total{reason="capacity"}') >= 2


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100   # utime + stime, in clock ticks of 1/100 s


def test_out_of_descriptors_connections_are_closed_without_spinning(gateway_factory):
    """With a descriptor limit of 128 and a cap above it, connections past
    the descriptors are accepted and closed (not left in the backlog, which
    kept the listener readable and a core busy), and the gateway serves
    again as soon as descriptors are free."""
    limit = 128

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    gw = gateway_factory(config={**CONFIG, "limits": {"maxConnections": 10 * limit}}, preexec_fn=lower_limit)
    flood = []
    try:
        for _ in range(limit + 40):
            flood.append(socket.create_connection(("127.0.0.1", gw.port), timeout=10))
        wait_until(lambda: gw_refusals(gw, flood) > 0, "connections past the descriptors are closed")
        before = cpu_seconds(gw.proc.pid)
        time.sleep(1.0)   # an observation window, not a wait for an event: a spinning loop burns all of it
        assert cpu_seconds(gw.proc.pid) - before < 0.5, "the gateway spins while out of descriptors"
    finally:
        for s in flood:
            s.close()

    def serving() -> bool:
        try:
            return gw.request("GET", "/healthz", headers={"Connection": "close"}).status_code == 200
        except requests.ConnectionError:
            # Its side of the flood is still closing: this connection came
            # in past the descriptors and was accepted and closed.
            return False

    wait_until(serving, "serving again")
    assert gw.metric('herald_refused_connections_total{reason="descriptors"}') > 0
    assert "out of file descriptors" in gw.stderr_tail()


def gw_refusals(gw, flood: list[socket.socket]) -> int:
    """How many flood sockets the gateway closed (EOF or reset)."""
    closed = 0
    for s in flood:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except ConnectionResetError:
            closed += 1
    return closed
