"""Key rotation and SIGHUP reload (docs/OPERATIONS.md, "Rotating keys"):
several server keys and token secrets per app (`kid`), and a config reload
that adds, rotates and removes apps without dropping a connection whose
token still verifies, closing those whose token no longer does.

A reload is awaited through its log line, which the gateway writes once
every loop has closed the connections the reload revoked."""

import json
import threading

import pytest
from herald_helpers import Gateway, check_error, complete_lines, decode_jwt, mint_token, reload, uid, verify_jwt, wait_until

OLD = {"kid": "2026-05", "secret": "ts-old"}
NEW = {"kid": "2026-11", "secret": "ts-new"}
ROTATING = {"id": "rot.app", "serverKeys": ["sk-new", "sk-old"], "tokenSecrets": [NEW, OLD]}


def rot_token(user, secret, kid=None, **kw):
    """A token of rot.app signed with `secret`, its header naming `kid` (or none)."""
    header = {"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}
    return mint_token(user, "rot.app", secret=secret, header=header, **kw)


def publish(gw, app, key, user, anid="n"):
    return gw.request("POST", f"/v1/apps/{app}/users/{user}/notifications", key=key,
                      json={"appNotificationId": anid, "payload": {}})


def expect_revoked(ws):
    code, frames = ws.expect_close()
    assert code == 4001, (code, frames)
    assert frames and frames[-1]["type"] == "error" and frames[-1]["code"] == "unauthorized", frames


# ---------------------------------------------------------------- several keys and secrets

def test_every_server_key_and_secret_of_an_app_is_accepted(gateway_factory):
    gw = gateway_factory(config={"apps": [ROTATING]})
    user = uid("rot")
    for key in ("sk-new", "sk-old"):
        assert publish(gw, "rot.app", key, user, key).status_code == 201
    check_error(publish(gw, "rot.app", "sk-other", user), 401)
    # Herald signs with the newest secret and names it.
    r = gw.request("POST", "/v1/apps/rot.app/tokens", key="sk-old", json={"userId": user})
    assert r.status_code == 200, r.text
    issued = r.json()["token"]
    assert decode_jwt(issued)[0] == {"alg": "HS256", "typ": "JWT", "kid": "2026-11"}
    verify_jwt(issued, "ts-new")
    for tok in (issued, rot_token(user, "ts-old", "2026-05"), rot_token(user, "ts-old"), rot_token(user, "ts-new")):
        assert gw.me("GET", "/counts", tok).json()["total"] == 2
    for tok in (rot_token(user, "ts-old", "2026-11"), rot_token(user, "ts-new", "2025-01"), rot_token(user, "ts-other")):
        check_error(gw.me("GET", "/counts", tok), 401)
    ws = gw.ws()
    ws.send({"type": "hello", "token": rot_token(user, "ts-new", "2025-01"), "deviceId": "d"})
    code, _ = ws.expect_close()
    assert code == 4001


def test_an_app_with_one_secret_ignores_kid(gateway):
    # Tokens minted before rotation existed may carry any kid.
    user = uid("plain")
    tok = mint_token(user, header={"alg": "HS256", "typ": "JWT", "kid": "whatever"})
    assert gateway.me("GET", "/counts", tok).status_code == 200


# ---------------------------------------------------------------- SIGHUP

def test_sighup_rotates_keys_and_apps_without_dropping_valid_connections(gateway_factory):
    start = {"apps": [{"id": "rot.app", "serverKey": "sk-old", "tokenSecret": "ts-old"},
                      {"id": "gone.app", "serverKey": "sk-gone", "tokenSecret": "ts-gone"}]}
    gw = gateway_factory(config=start)
    user = uid("rot")
    ws_old, _, _ = gw.connect(user, "old", app="rot.app", token=rot_token(user, "ts-old"))
    ws_gone, _, _ = gw.connect(user, "gone", app="gone.app", token=mint_token(user, "gone.app", secret="ts-gone"))

    # 1. A new key and secret beside the old ones, and a new app: nothing closes.
    added = {"id": "added.app", "serverKey": "sk-added", "tokenSecret": "ts-added"}
    line = reload(gw, {"apps": [ROTATING, start["apps"][1], added]})
    assert line.endswith("apps rot.app, gone.app, added.app (added added.app; changed rot.app); "
                         "closed 0 connection(s) whose token no longer verifies"), line
    ws_old.ping()
    ws_gone.ping()
    assert publish(gw, "added.app", "sk-added", user).status_code == 201
    issued = gw.request("POST", "/v1/apps/rot.app/tokens", key="sk-new", json={"userId": user}).json()["token"]
    assert decode_jwt(issued)[0]["kid"] == "2026-11"
    ws_new, _, _ = gw.connect(user, "new", app="rot.app", token=issued)
    # A device that refreshes onto the new secret before the old one goes.
    ws_moved, _, _ = gw.connect(user, "moved", app="rot.app", token=rot_token(user, "ts-old", "2026-05"))
    ack, _ = ws_moved.request({"type": "refresh", "token": issued})
    assert ack["type"] == "ack", ack

    # 2. The old key and secret retired, gone.app removed.
    line = reload(gw, {"apps": [{**ROTATING, "serverKeys": ["sk-new"], "tokenSecrets": [NEW]}, added]})
    assert line.endswith("(removed gone.app; changed rot.app); closed 2 connection(s) whose token no longer verifies"), line
    expect_revoked(ws_old)
    expect_revoked(ws_gone)
    for ws in (ws_new, ws_moved):
        ws.ping()
    n = publish(gw, "rot.app", "sk-new", user, "after")
    assert n.status_code == 201, n.text
    for ws in (ws_new, ws_moved):
        changes, _ = ws.expect_changes(1)
        assert changes[0]["notification"]["appNotificationId"] == "after"
        ws.close()
    check_error(publish(gw, "rot.app", "sk-old", user), 401)
    check_error(publish(gw, "gone.app", "sk-gone", user), 401)
    check_error(gw.me("GET", "/counts", rot_token(user, "ts-old")), 401)
    assert 'herald_dropped_connections_total{reason="auth_revoked"} 2' in gw.request("GET", "/metrics").text


@pytest.mark.fallback
def test_sighup_ends_event_streams_and_held_polls_of_retired_tokens(gateway_factory):
    from test_fallback import HELD, Sse
    gw = gateway_factory(config={"apps": [ROTATING]})
    user = uid("rot")
    old, new = rot_token(user, "ts-old", "2026-05"), rot_token(user, "ts-new", "2026-11")
    kept, ended = Sse(gw, new), Sse(gw, old)
    out = {}

    def poll():
        r = gw.me("GET", "/sync", old, params={"cursor": 0, "wait": 60})
        out["status"], out["body"] = r.status_code, r.json()

    try:
        for s in (kept, ended):
            assert s.next()["event"] == "reset"
        t = threading.Thread(target=poll)
        t.start()
        wait_until(lambda: gw.metric(HELD) == 1 or out, "the poll to be held")
        assert not out, out

        line = reload(gw, {"apps": [{**ROTATING, "tokenSecrets": [NEW]}]})
        assert "closed 2 connection(s)" in line, line
        t.join(30)
        assert out["status"] == 401 and out["body"]["error"]["code"] == "unauthorized", out
        assert ended.q.get(timeout=30) is None, "the stream of a retired token ends"
        n = publish(gw, "rot.app", "sk-new", user)
        assert int(kept.next()["id"]) == n.json()["seq"]
    finally:
        kept.close()
        ended.close()


def test_a_config_that_does_not_parse_is_refused_and_the_old_one_stays(gateway_factory):
    gw = gateway_factory(config={"apps": [ROTATING]})
    user = uid("rot")
    ws, _, _ = gw.connect(user, "d", app="rot.app", token=rot_token(user, "ts-old"))
    for bad in ("{apps: nope",
                json.dumps({"apps": [{**ROTATING, "tokenSecrets": [NEW, {**OLD, "kid": NEW["kid"]}]}]}),
                json.dumps({"apps": [{**ROTATING, "serverKey": "k"}]}),
                json.dumps({"apps": []})):
        line = reload(gw, bad)
        assert " error config reload refused, nothing changed: " in line, line
        for secret in ("sk-new", "sk-old", "ts-old", "ts-new"):
            assert secret not in line, line
    ws.ping()
    assert publish(gw, "rot.app", "sk-old", user).status_code == 201
    ws.expect_changes(1)
    line = reload(gw, {"apps": [ROTATING]})
    assert line.endswith("apps rot.app; closed 0 connection(s) whose token no longer verifies"), line
    ws.close()


def test_settings_that_need_a_restart_are_logged_and_flags_still_win(herald_bin, tmp_path):
    # host and store from the file, port and an app from flags.
    gw = Gateway(herald_bin, tmp_path, {"apps": [ROTATING], "host": "127.0.0.1", "store": "memory"})
    gw.args = [str(herald_bin), "serve", "--config", str(gw.config_path), "--port", "0",
               "--app", "flag.app", "--server-key", "sk-flag", "--token-secret", "ts-flag"]
    gw.start()
    try:
        seen = len(complete_lines(gw))
        line = reload(gw, {"apps": [ROTATING, {"id": "flag.app", "serverKey": "sk-file", "tokenSecret": "ts-file"}],
                           "host": "127.0.0.2", "port": 1, "store": "sqlite:elsewhere.db",
                           "limits": {"maxConnectionsPerUser": 3}})
        assert line.endswith("apps rot.app, flag.app; closed 0 connection(s) whose token no longer verifies"), line
        warnings = [l.split(" warning ", 1)[1] for l in complete_lines(gw)[seen:] if " warning " in l]
        assert warnings == [f"config reload: the new {s} takes effect at the next restart" for s in ("host", "store", "limits")]
        # Still where it was, and the app given by flags still has the flags' key.
        assert gw.request("GET", "/healthz").status_code == 200
        user = uid("f")
        assert publish(gw, "flag.app", "sk-flag", user).status_code == 201
        check_error(publish(gw, "flag.app", "sk-file", user), 401)
    finally:
        assert gw.terminate() == 0
