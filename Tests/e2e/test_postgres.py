"""The PostgreSQL store end to end (issue 11, SPEC 9): the real gateway on
`--store postgres://...`, publishing to a connected WebSocket, and a restart
after which a device resumes by cursor under the same epoch. The server is
the throwaway one scripts/test starts (scripts/test-servers), named by
HERALD_TEST_POSTGRES_URL; without it these tests skip. Each test gets a
schema of its own in that database."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from herald_helpers import CONFIG, Gateway, uid

URL = os.environ.get("HERALD_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="no test PostgreSQL: set HERALD_TEST_POSTGRES_URL "
                                                "(scripts/test-servers starts one; scripts/test always does)")


def psql(sql: str) -> None:
    subprocess.run(["psql", URL, "-q", "-v", "ON_ERROR_STOP=1", "-c", sql], check=True, capture_output=True)


@pytest.fixture
def store_url():
    schema = "e2e_" + uuid.uuid4().hex
    psql(f"CREATE SCHEMA {schema}")
    yield f"{URL}{'&' if '?' in URL else '?'}options=-csearch_path%3D{schema}"
    psql(f"DROP SCHEMA {schema} CASCADE")


def test_publish_reaches_a_websocket_and_a_restart_keeps_epoch_and_cursor(herald_bin, tmp_path, store_url):
    user = uid("user")
    gw = Gateway(herald_bin, tmp_path / "a", CONFIG, store=store_url).start()
    try:
        ws, _, welcome = gw.connect(user, "phone", cursor=0)
        with ws:
            epoch = welcome["epoch"]
            seq = gw.publish(user, "live")["seq"]
            changes, _ = ws.expect_changes(1)
            assert [c["seq"] for c in changes] == [seq]
            assert changes[0]["notification"]["appNotificationId"] == "live"
        cursor = seq
        missed = [gw.publish(user, f"m{i}")["seq"] for i in range(5)]
    finally:
        assert gw.terminate(10) == 0, gw.stderr_tail()

    gw = Gateway(herald_bin, tmp_path / "b", CONFIG, store=store_url).start()
    try:
        ws, frames, welcome = gw.connect(user, "phone", cursor=cursor, epoch=epoch)
        with ws:
            assert welcome["epoch"] == epoch, "the epoch lives in the database, not in the process"
            got = [c["seq"] for f in frames if f["type"] == "changes" for c in f["changes"]]
            assert got == missed
            assert welcome["cursor"] == missed[-1]
        assert gw.publish(user, "after")["seq"] > missed[-1], "seq continues after a restart"
    finally:
        assert gw.terminate(10) == 0, gw.stderr_tail()


def test_unreachable_server_at_start_exits_1_with_one_line(herald_bin):
    # Port 1 on loopback: nothing listens there.
    r = subprocess.run([str(herald_bin), "serve", "--port", "0", "--store", "postgres://herald:secret@127.0.0.1:1/herald",
                        "--app", "x.y", "--server-key", "k", "--token-secret", "s"],
                       capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0], lines
    assert "secret" not in lines[0], "the password is never printed"
