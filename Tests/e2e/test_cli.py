"""SPEC 7: the command line — `herald token`, bad flags (`herald watch`'s too), ports and configs
(exit 2 with one stderr line), `--port 0`, config values and flag overrides."""

import json
import re
import socket
import subprocess
import time

import pytest

from herald_helpers import CONFIG, Gateway, decode_jwt, mint_token, parse_time, uid, verify_jwt


def run(herald_bin, *args, timeout=30):
    try:
        return subprocess.run([str(herald_bin), *args], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"`herald {' '.join(args)}` still running after {timeout}s "
                             f"(stdout {e.stdout!r}, stderr {e.stderr!r})")


@pytest.fixture
def config_path(tmp_path):
    p = tmp_path / "herald.json"
    p.write_text(json.dumps(CONFIG))
    return p


def _one_line(b: bytes) -> str:
    text = b.decode()
    assert text.endswith("\n"), f"output should be one line ending in a newline: {text!r}"
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"want exactly one line, got {lines!r}"
    return lines[0]


# ---------------------------------------------------------------- herald token

def test_token_with_secret(herald_bin):
    t0 = int(time.time())
    r = run(herald_bin, "token", "--app", "app.one", "--user", "alice", "--token-secret", "ts-one")
    t1 = time.time()
    assert r.returncode == 0, r.stderr
    tok = _one_line(r.stdout)
    claims = verify_jwt(tok, "ts-one")
    assert claims["app"] == "app.one" and claims["sub"] == "alice"
    assert claims["exp"] - claims["iat"] == 3600
    assert t0 <= claims["iat"] <= t1, (t0, claims["iat"], t1)   # issued while it ran
    assert "dev" not in claims or claims["dev"] is None


def test_token_with_config_ttl_and_device(herald_bin, config_path):
    r = run(herald_bin, "token", "--app", "app.two", "--user", "bob", "--ttl", "120", "--device", "phone-1",
            "--config", str(config_path))
    assert r.returncode == 0, r.stderr
    claims = verify_jwt(_one_line(r.stdout), "ts-two")
    assert claims["app"] == "app.two" and claims["sub"] == "bob" and claims["dev"] == "phone-1"
    assert claims["exp"] - claims["iat"] == 120


def test_token_with_rotating_config_signs_with_the_newest_secret_and_names_it(herald_bin, tmp_path):
    p = tmp_path / "herald.json"
    p.write_text(json.dumps({"apps": [{"id": "rot.app", "serverKeys": ["k"], "tokenSecrets": [
        {"kid": "2026-11", "secret": "ts-new"}, {"kid": "2026-05", "secret": "ts-old"}]}]}))
    r = run(herald_bin, "token", "--app", "rot.app", "--user", "alice", "--config", str(p))
    assert r.returncode == 0, r.stderr
    tok = _one_line(r.stdout)
    assert decode_jwt(tok)[0] == {"alg": "HS256", "typ": "JWT", "kid": "2026-11"}
    assert verify_jwt(tok, "ts-new")["app"] == "rot.app"


@pytest.mark.parametrize("ttl", ["60", "2592000"])
def test_token_ttl_bounds(herald_bin, ttl):
    r = run(herald_bin, "token", "--app", "app.one", "--user", "alice", "--ttl", ttl, "--token-secret", "s")
    assert r.returncode == 0, r.stderr
    claims = verify_jwt(_one_line(r.stdout), "s")
    assert claims["exp"] - claims["iat"] == int(ttl)


def test_cli_token_is_accepted_by_the_gateway(herald_bin, gateway, config_path):
    user = uid("cli")
    n = gateway.publish(user)["notification"]
    r = run(herald_bin, "token", "--app", "app.one", "--user", user, "--config", str(config_path))
    assert r.returncode == 0, r.stderr
    tok = _one_line(r.stdout)
    got = gateway.me("GET", f"/notifications/{n['id']}", tok)
    assert got.status_code == 200, got.text
    w, _, welcome = gateway.connect(user, "cli-device", token=tok)
    w.close()
    assert welcome["unread"] == 1


# ---------------------------------------------------------------- bad invocations: exit 2, one stderr line

def _app(**fields):
    return json.dumps({"apps": [{"id": "a.b", **fields}]})


_KEY, _SECRET = {"serverKey": "k"}, {"tokenSecret": "s"}
BAD_CONFIGS = {
    "not-json": "{apps: nope",
    "apps-not-list": json.dumps({"apps": {"id": "a"}}),
    "bad-app-id": json.dumps({"apps": [{"id": "bad app!", "serverKey": "k", "tokenSecret": "s"}]}),
    "missing-secret": _app(**_KEY),
    "unknown-app-key": _app(**_KEY, **_SECRET, secret="s"),
    "both-key-forms": _app(**_KEY, serverKeys=["k2"], **_SECRET),
    "empty-key-list": _app(serverKeys=[], **_SECRET),
    "key-list-not-strings": _app(serverKeys=["k", 5], **_SECRET),
    "duplicate-key": _app(serverKeys=["k", "k"], **_SECRET),
    "both-secret-forms": _app(**_KEY, **_SECRET, tokenSecrets=[{"kid": "a", "secret": "s2"}]),
    "secret-without-kid": _app(**_KEY, tokenSecrets=[{"secret": "s"}]),
    "secret-extra-field": _app(**_KEY, tokenSecrets=[{"kid": "a", "secret": "s", "alg": "HS256"}]),
    "bad-kid": _app(**_KEY, tokenSecrets=[{"kid": "bad kid!", "secret": "s"}]),
    "duplicate-kid": _app(**_KEY, tokenSecrets=[{"kid": "a", "secret": "s"}, {"kid": "a", "secret": "s2"}]),
    "duplicate-secret": _app(**_KEY, tokenSecrets=[{"kid": "a", "secret": "s"}, {"kid": "b", "secret": "s"}]),
    "empty-secret": _app(**_KEY, tokenSecrets=[{"kid": "a", "secret": ""}]),
    "port-out-of-range": json.dumps({"apps": CONFIG["apps"], "port": 99999}),
    "port-string": json.dumps({"apps": CONFIG["apps"], "port": "eighty"}),
    "duplicate-app": json.dumps({"apps": CONFIG["apps"] + CONFIG["apps"][:1]}),
    "origins-not-list": json.dumps({"apps": [{**CONFIG["apps"][0], "allowedOrigins": "*"}]}),
    "origin-with-path": json.dumps({"apps": [{**CONFIG["apps"][0], "allowedOrigins": ["https://a.example/app"]}]}),
    "origin-upper-case": json.dumps({"apps": [{**CONFIG["apps"][0], "allowedOrigins": ["https://A.example"]}]}),
    "origin-default-port": json.dumps({"apps": [{**CONFIG["apps"][0], "allowedOrigins": ["https://a.example:443"]}]}),
    "app-unknown-key": json.dumps({"apps": [{**CONFIG["apps"][0], "allowedOrigin": ["*"]}]}),
}


def _bad_configs(tmp_path):
    files = {}
    for name, content in BAD_CONFIGS.items():
        p = tmp_path / f"{name}.json"
        p.write_text(content)
        files[name] = str(p)
    return files


BAD_INVOCATIONS = {
    "unknown-command": ["frobnicate"],
    "serve-unknown-flag": ["serve", "--bogus"],
    "serve-bad-log-format": ["serve", "--store", "memory", "--port", "0", "--log-format", "xml"],
    "serve-port-missing-value": ["serve", "--store", "memory", "--port"],
    "serve-port-70000": ["serve", "--store", "memory", "--port", "70000"],
    "serve-port-65536": ["serve", "--store", "memory", "--port", "65536"],
    "serve-port-negative": ["serve", "--store", "memory", "--port", "-1"],
    "serve-port-word": ["serve", "--store", "memory", "--port", "abc"],
    "serve-bad-store": ["serve", "--port", "0", "--store", "floppy:disk"],
    "serve-partitions-zero": ["serve", "--port", "0", "--store", "memory", "--partitions", "0"],
    "serve-partitions-sqlite-65": ["serve", "--port", "0", "--store", "sqlite:/tmp/never-opened.db", "--partitions", "65"],
    "serve-bad-postgres-url": ["serve", "--port", "0", "--store", "postgres://db.example/herald?nosuchoption=1"],
    "serve-postgres-durability": ["serve", "--port", "0", "--store", "postgres://db.example/herald", "--durability", "off"],
    "serve-missing-config": ["serve", "--port", "0", "--store", "memory", "--config", "/nonexistent/herald.json"],
    "serve-app-without-keys": ["serve", "--port", "0", "--store", "memory", "--app", "x.y"],
    "serve-bad-app-flag": ["serve", "--port", "0", "--store", "memory", "--app", "bad app!",
                           "--server-key", "k", "--token-secret", "s"],
    "serve-origins-without-app": ["serve", "--port", "0", "--store", "memory", "--demo", "--allowed-origins", "*"],
    "serve-bad-origin-flag": ["serve", "--port", "0", "--store", "memory", "--app", "x.y", "--server-key", "k",
                              "--token-secret", "s", "--allowed-origins", "https://a.example,"],
    "token-neither-secret": ["token", "--app", "app.one", "--user", "alice"],
    "token-both-secrets": ["token", "--app", "app.one", "--user", "alice", "--token-secret", "s", "--config", "@CONFIG"],
    "token-no-app": ["token", "--user", "alice", "--token-secret", "s"],
    "token-no-user": ["token", "--app", "app.one", "--token-secret", "s"],
    "token-ttl-59": ["token", "--app", "app.one", "--user", "alice", "--ttl", "59", "--token-secret", "s"],
    "token-ttl-too-big": ["token", "--app", "app.one", "--user", "alice", "--ttl", "2592001", "--token-secret", "s"],
    "token-ttl-word": ["token", "--app", "app.one", "--user", "alice", "--ttl", "soon", "--token-secret", "s"],
    "token-ttl-missing-value": ["token", "--app", "app.one", "--user", "alice", "--token-secret", "s", "--ttl"],
    "token-bad-user": ["token", "--app", "app.one", "--user", "bad user!", "--token-secret", "s"],
    "token-unknown-flag": ["token", "--app", "app.one", "--user", "alice", "--token-secret", "s", "--colour"],
    "token-app-not-in-config": ["token", "--app", "no.such.app", "--user", "alice", "--config", "@CONFIG"],
    "watch-no-url": ["watch", "--token", "t", "--device", "d"],
    "watch-no-token": ["watch", "--url", "http://127.0.0.1:9", "--device", "d"],
    "watch-no-device": ["watch", "--url", "http://127.0.0.1:9", "--token", "t"],
    "watch-bad-url": ["watch", "--url", "ftp://127.0.0.1:9", "--token", "t", "--device", "d"],
    "watch-bad-device": ["watch", "--url", "http://127.0.0.1:9", "--token", "t", "--device", "bad device!"],
    "watch-bad-platform": ["watch", "--url", "http://127.0.0.1:9", "--token", "t", "--device", "d", "--platform", "amiga"],
    "watch-bad-tags": ["watch", "--url", "http://127.0.0.1:9", "--token", "t", "--device", "d", "--tags", "a,,b"],
    "watch-missing-ca-file": ["watch", "--url", "https://127.0.0.1:9", "--token", "t", "--device", "d",
                              "--ca-file", "/nonexistent/ca.pem"],
    "watch-unknown-flag": ["watch", "--url", "http://127.0.0.1:9", "--token", "t", "--device", "d", "--follow"],
    "watch-token-and-token-file": ["watch", "--url", "http://127.0.0.1:9", "--token", "t", "--token-file", "/etc/hostname",
                                   "--device", "d"],
    "watch-missing-token-file": ["watch", "--url", "http://127.0.0.1:9", "--token-file", "/nonexistent/token", "--device", "d"],
    "watch-empty-token-file": ["watch", "--url", "http://127.0.0.1:9", "--token-file", "/dev/null", "--device", "d"],
}


@pytest.mark.parametrize("name", list(BAD_INVOCATIONS) + [f"serve-config-{c}" for c in BAD_CONFIGS])
def test_bad_invocation_exits_2_with_one_stderr_line(herald_bin, tmp_path, config_path, name):
    if name.startswith("serve-config-"):
        cfg = _bad_configs(tmp_path)[name[len("serve-config-"):]]
        args = ["serve", "--store", "memory", "--config", cfg]
        if "port" not in name:
            args += ["--port", "0"]
    else:
        args = [str(config_path) if a == "@CONFIG" else a for a in BAD_INVOCATIONS[name]]
    r = run(herald_bin, *args)
    assert r.returncode == 2, f"exit {r.returncode}; stderr {r.stderr!r}"
    _one_line(r.stderr)
    assert r.stdout == b"", f"nothing on stdout: {r.stdout!r}"


# ---------------------------------------------------------------- serve

def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_port_zero_picks_a_free_port(gateway):
    assert gateway.port > 0
    assert gateway.listen_line == f"listening on http://{gateway.host}:{gateway.port}"
    assert gateway.request("GET", "/healthz").status_code == 200


def _start_with_config_port(herald_bin, workdir) -> tuple[Gateway, int, dict]:
    """A gateway on the port its config file names, a free one. Free when
    picked, the port is not reserved: another process may take it before the
    gateway binds it (then 'Address already in use'), and another is tried."""
    for attempt in range(5):
        port = _free_port()
        cfg = {**CONFIG, "port": port, "host": "127.0.0.1", "store": "memory"}
        gw = Gateway(herald_bin, workdir / f"try{attempt}", cfg)
        gw.args = [str(herald_bin), "serve", "--config", str(gw.config_path)]
        try:
            return gw.start(), port, cfg
        except AssertionError:
            if "Address already in use" not in gw.stderr_tail():
                raise
    raise AssertionError("5 free ports in a row were taken before the gateway could bind them")


def test_config_port_and_flag_override(herald_bin, tmp_path):
    # port, host and store from the config file
    gw, port, cfg = _start_with_config_port(herald_bin, tmp_path / "a")
    try:
        assert gw.port == port, gw.listen_line
        assert gw.request("GET", "/healthz").status_code == 200
    finally:
        rc = gw.terminate()
    assert rc == 0
    # --port overrides it. The config's port is kept busy meanwhile, so the
    # gateway cannot land on it by chance (nor start there, if the flag lost).
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        busy.bind(("127.0.0.1", port))
        busy.listen()
    except OSError:
        pass   # taken by someone else: busy all the same
    try:
        gw = Gateway(herald_bin, tmp_path / "b", cfg)
        gw.args = [str(herald_bin), "serve", "--config", str(gw.config_path), "--port", "0"]
        gw.start()
        try:
            assert gw.port != port, gw.listen_line
            assert gw.request("GET", "/healthz").status_code == 200
        finally:
            rc = gw.terminate()
        assert rc == 0
    finally:
        busy.close()


def test_serve_with_app_flags(gateway_factory):
    gw = gateway_factory(config=CONFIG, extra_args=["--app", "flag.app", "--server-key", "sk-flag",
                                                    "--token-secret", "ts-flag"])
    user = uid("f")
    r = gw.request("POST", f"/v1/apps/flag.app/users/{user}/notifications", key="sk-flag",
                   json={"appNotificationId": "x", "payload": {}})
    assert r.status_code == 201, r.text
    tok = mint_token(user, "flag.app", secret="ts-flag")
    assert gw.me("GET", "/counts", tok).json()["total"] == 1
    # the config's apps are still there
    assert gw.server("GET", f"/users/{user}/notifications").status_code == 200


def test_serve_with_only_app_flags(gateway_factory):
    gw = gateway_factory(config=None, extra_args=["--app", "solo", "--server-key", "k", "--token-secret", "s"])
    r = gw.request("GET", "/v1/apps/solo/users/x/notifications", key="k")
    assert r.status_code == 200, r.text
    assert gw.request("GET", "/v1/apps/app.one/users/x/notifications", key="sk-one").status_code == 401


# ---------------------------------------------------------------- version and log format

def test_version(herald_bin):
    r = run(herald_bin, "--version")
    assert r.returncode == 0, r.stderr
    line = r.stdout.decode()
    assert re.fullmatch(r"herald \d+\.\d+\.\d+ \(libwebsockets \d+\.\d+[^)]*\)\n", line), line
    assert r.stderr == b""


def test_log_format_json_is_one_object_per_line(gateway_factory):
    gw = gateway_factory(extra_args=["--log-format", "json", "--demo"])
    gw.stopped_by_test = True
    assert gw.terminate(10.0) == 0
    lines = [l for l in gw.stderr_path.read_text().splitlines() if l]
    records = [json.loads(l) for l in lines]
    assert records and all(set(r) == {"time", "level", "message"} for r in records), lines
    for r in records:
        parse_time(r["time"])
        assert r["level"] in ("info", "warning", "error")
    assert any(r["level"] == "warning" and "demo" in r["message"] for r in records)
    assert any(r["message"] == "shutting down" for r in records)
