"""The inspector (docs/PROTOCOL.md section 18), end to end: the real `herald`
binary pushing through the APNs stand-in, whose scripted answers must show in
the user's inspection; and the `/admin` page's policy."""

from __future__ import annotations

import socket

import pytest

from herald_helpers import APPS, uid, wait_until
from push_standins import Outcome
from test_push import apns_handle, apns_token, push_config, register, services, vapid_file  # noqa: F401 (fixtures)
from test_webhooks import hooked, secret

APP = "app.one"


@pytest.fixture
def pushing(gateway_factory, services, vapid_file):  # noqa: F811 (the fixtures imported above)
    apns, fcm, web = services
    return gateway_factory(config=push_config(apns, fcm, web, vapid_file)), apns


def inspect(gw, user: str) -> dict:
    r = gw.server("GET", f"/users/{user}/inspect", app=APP)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_dead_handle_shows_in_the_users_inspection_without_the_handle(pushing):
    gw, apns = pushing
    user, dead = uid("u"), apns_token(7)
    register(gw, user, "phone", apns_handle(dead))
    apns.script(Outcome(410, "Unregistered"), key=dead)
    gw.publish(user, payload={"title": "t", "body": "b"})

    def outcomes():
        phone = next(d for d in inspect(gw, user)["devices"] if d["deviceId"] == "phone")
        return phone["pushOutcomes"]
    [outcome] = wait_until(outcomes, "the APNs answer in the inspection")
    assert (outcome["outcome"], outcome["reason"]) == ("handleRemoved", "Unregistered")
    r = gw.server("GET", f"/users/{user}/inspect", app=APP)
    body = r.json()
    assert [d["push"] for d in body["devices"]] == [None]
    assert len(body["notifications"]) == 1 and [c["seq"] for c in body["changes"]] == [1]
    for secret in (dead, APPS[APP]["serverKey"], APPS[APP]["tokenSecret"]):
        assert secret not in r.text


def test_the_apps_inspection_takes_only_its_own_key(fresh_gateway):
    gw = fresh_gateway
    for path in ("/inspect", "/users/someone/inspect"):
        assert gw.server("GET", path, app=APP, key="wrong").status_code == 401
        assert gw.server("GET", path, app=APP, key=APPS["app.two"]["serverKey"]).status_code == 401
    r = gw.server("GET", "/inspect", app=APP)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["app"] == APP and body["health"]["store"] == "ok"
    assert set(body["connections"]) == {"websocket", "sse", "poll"}
    assert body["nodes"] is None, "no cluster, no presence records (test_cluster reads them)"


def test_a_failing_webhook_endpoint_shows_by_url_with_its_backlog_and_no_secret(gateway_factory):
    with socket.socket() as s:  # a port nothing listens on once closed: every delivery is refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/hooks"
    key = secret()
    gw = gateway_factory(config=hooked({"url": url, "secret": key}))
    gw.publish(uid("u"))

    def failed():
        r = gw.server("GET", "/inspect", app=APP)
        [hook] = r.json()["webhooks"]
        return hook["lastFailures"] and (hook, r.text)
    hook, text = wait_until(failed, "the refused delivery in the app's inspection")
    assert hook["url"] == url and hook["pending"] == 1 and hook["lastFailures"][0]["outcome"] == "failed"
    assert key.removeprefix("whsec_") not in text and "whsec_" not in text


def test_the_admin_page_is_served_under_a_strict_policy_without_demo_mode(fresh_gateway):
    gw = fresh_gateway
    for path, kind in (("/admin", "text/html"), ("/admin/admin.js", "text/javascript"), ("/admin/admin.css", "text/css")):
        r = gw.request("GET", path)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith(kind), (path, r.status_code)
        policy = r.headers["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert "<script>" not in gw.request("GET", "/admin").text, "no inline script"
    for bad in ("/admin/..%2Fherald.json", "/admin/.hidden", "/admin/missing.js"):
        assert gw.request("GET", bad).status_code == 404, bad
