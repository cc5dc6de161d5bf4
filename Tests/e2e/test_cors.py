"""Browser pages on other origins (CORS, docs/PROTOCOL.md 7.1) over the wire:
origins from the config file and from `--allowed-origins`, preflights, the
headers of answers by the app the credentials prove, event streams and
polls with `?token=`, no CORS headers for an origin no app allows, and
requests refused from origins an app that lists some does not list.
The browser's side of it is Tests/browser/test_cross_origin_page.py."""

import pytest
from herald_helpers import CONFIG, mint_token, uid

PAGE = "https://app.example.com"
DEV = "http://localhost:5173"
EVIL = "https://evil.example"
CORS_CONFIG = {"apps": [{**CONFIG["apps"][0], "allowedOrigins": [PAGE]}, CONFIG["apps"][1]]}


@pytest.fixture
def gw(gateway_factory):
    return gateway_factory(config=CORS_CONFIG, extra_args=["--app", "flag.app", "--server-key", "sk-flag",
                                                           "--token-secret", "ts-flag", "--allowed-origins", f"{DEV}, *"])


def preflight(gw, path, origin, method="PATCH"):
    return gw.request("OPTIONS", path, headers={"Origin": origin, "Access-Control-Request-Method": method,
                                                "Access-Control-Request-Headers": "authorization,herald-device,if-match"})


def test_preflight_from_an_allowed_origin(gw):
    r = preflight(gw, "/v1/me/notifications/n_x", PAGE)
    assert r.status_code == 204, r.text
    assert r.headers["Access-Control-Allow-Origin"] == PAGE
    assert r.headers["Access-Control-Allow-Methods"] == "DELETE, GET, HEAD, PATCH"
    allowed = {h.strip().lower() for h in r.headers["Access-Control-Allow-Headers"].split(",")}
    assert allowed == {"authorization", "content-type", "if-match", "herald-device", "last-event-id"}
    assert int(r.headers["Access-Control-Max-Age"]) > 0
    assert r.headers["Vary"] == "Origin"
    assert "Access-Control-Allow-Credentials" not in r.headers
    assert r.content == b""


def test_an_origin_no_app_allows_gets_no_cors_headers(gateway_factory):
    g = gateway_factory(config=CORS_CONFIG)   # no `*` among its apps
    r = preflight(g, "/v1/me/notifications/n_x", EVIL)
    assert r.status_code == 405 and r.headers["Allow"] == "DELETE, GET, HEAD, PATCH", r.headers
    assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers
    assert r.headers["Vary"] == "Origin"
    # app.one lists origins: it refuses others before doing anything
    user = uid("u")
    n = g.publish(user)["notification"]
    r = g.me("PATCH", f"/notifications/{n['id']}", mint_token(user, "app.one"), json={"readState": "read"},
             headers={"Origin": EVIL})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    assert "Access-Control-Allow-Origin" not in r.headers
    assert g.get_notification(user, n["id"])["version"] == 1
    # app.two lists none: it acts (a page of the gateway's own origin sends Origin too), unread by the page
    r = g.me("GET", "/counts", mint_token(user, "app.two"), headers={"Origin": EVIL})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers, r.headers


def test_answers_carry_the_headers_of_the_app_the_credentials_prove(gw):
    user = uid("u")
    one, two, flag = mint_token(user, "app.one"), mint_token(user, "app.two"), mint_token(user, "flag.app", secret="ts-flag")
    r = gw.me("GET", "/counts", one, headers={"Origin": PAGE})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == PAGE, r.headers
    assert r.headers["Access-Control-Expose-Headers"] == "Retry-After" and r.headers["Vary"] == "Origin"
    r = gw.me("GET", "/counts", two, headers={"Origin": PAGE})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers, r.headers
    # --allowed-origins: comma-separated, spaces around commas ignored, `*` echoes the origin
    for origin in (DEV, EVIL):
        r = gw.me("GET", "/counts", flag, headers={"Origin": origin})
        assert r.headers.get("Access-Control-Allow-Origin") == origin, r.headers
    r = gw.server("GET", f"/users/{user}/devices", headers={"Origin": PAGE})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == PAGE
    r = gw.server("GET", f"/users/{user}/devices", app="app.two", headers={"Origin": PAGE})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    # no Origin: no Access-Control-* (Vary still says the answer depends on it)
    r = gw.me("GET", "/counts", one)
    assert "Access-Control-Allow-Origin" not in r.headers and r.headers["Vary"] == "Origin"


def test_event_stream_and_poll_with_the_token_in_the_query(gw):
    user = uid("u")
    tok = mint_token(user, "app.one")
    with gw.http.get(gw.base + "/v1/me/events", params={"token": tok}, headers={"Origin": PAGE},
                     stream=True, timeout=30) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["Access-Control-Allow-Origin"] == PAGE, r.headers
    r = gw.request("GET", "/v1/me/sync", params={"token": tok}, headers={"Origin": PAGE})
    assert r.status_code == 200 and r.json()["reset"] is True
    assert r.headers["Access-Control-Allow-Origin"] == PAGE, r.headers


def test_websocket_origin_is_checked_against_the_tokens_app(gw):
    """The upgrade's Origin reaches the session: an app that lists origins
    takes WebSockets from those (and from clients that send none) and closes
    others with 4003 at hello."""
    from herald_helpers import Closed
    user = uid("u")
    for origin in (PAGE, None):
        c = gw.ws(**({"origin": origin} if origin else {}))
        c.hello(mint_token(user, "app.one"), "d1")
        c.conn.close()
    c = gw.ws(origin=EVIL)
    c.send({"type": "hello", "token": mint_token(user, "app.one"), "deviceId": "d2"})
    err = c.recv()
    assert err["type"] == "error" and err["code"] == "forbidden", err
    with pytest.raises(Closed) as closed:
        c.recv()
    assert closed.value.code == 4003
    # app.two lists none: any origin
    c = gw.ws(origin=EVIL)
    c.hello(mint_token(user, "app.two"), "d3")


def test_the_servers_device_routes_refuse_an_origin_the_app_does_not_list(gateway_factory):
    """Issue 39: with `--allowed-origins https://good.example`, a publish
    from another origin was 403 while the server's device PUT and DELETE
    answered 200 and 204. Every server route is refused alike, and nothing
    changes (the whole route table is walked in CORSTests)."""
    g = gateway_factory(extra_args=["--app", "good.app", "--server-key", "sk-good", "--token-secret", "ts-good",
                                    "--allowed-origins", "https://good.example"])
    user, evil = uid("u"), {"Origin": EVIL}
    registered = g.server("PUT", f"/users/{user}/devices/d1", app="good.app", key="sk-good", json={"tags": ["a"]})
    assert registered.status_code == 200, registered.text
    for method, path, body in [("POST", f"/users/{user}/notifications", {"appNotificationId": "a", "payload": {}}),
                               ("PUT", f"/users/{user}/devices/d1", {"tags": ["b"]}),
                               ("PUT", f"/users/{user}/devices/d2", {}),
                               ("DELETE", f"/users/{user}/devices/d1", None)]:
        r = g.server(method, path, app="good.app", key="sk-good", json=body, headers=evil)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (method, path, r.text)
        assert "Access-Control-Allow-Origin" not in r.headers, r.headers
    devices = g.server("GET", f"/users/{user}/devices", app="good.app", key="sk-good").json()["devices"]
    assert [(d["deviceId"], "a" in d["tags"], "b" in d["tags"]) for d in devices] == [("d1", True, False)], devices
    r = g.server("DELETE", f"/users/{user}/devices/d1", app="good.app", key="sk-good", headers={"Origin": "https://good.example"})
    assert r.status_code == 204, r.text
