"""Preferences (SPEC section 12), end to end against the real `herald`
binary: a group kept out of the inbox suppresses its publishes, a group kept
from push sends none while its inbox works (the push stand-ins of
push_standins.py, as test_push.py), critical groups ignore both, a save
reaches the user's other devices live, on resume and in resets, and touches
no other user; If-Match, and bad input on every route: 400, nothing changed."""

from __future__ import annotations

import json

import pytest

from herald_helpers import APPS, changes_in, check_error, check_preferences, refused_start, reload, reset_notifications, uid, wait_until
from test_cluster import REDIS, Cluster
from test_fallback import Sse
from test_postgres import URL as POSTGRES, store_url  # noqa: F401 (the fixture: a schema per test)
from test_push import apns_handle, apns_token, push_config, register, services, vapid_file  # noqa: F401 (fixtures)

APP = "app.one"
CRITICAL = ["security"]


def config_with_critical(base: dict | None = None) -> dict:
    cfg = base or {"apps": [{"id": k, **v} for k, v in APPS.items()]}
    cfg["apps"][0]["criticalGroups"] = CRITICAL
    return cfg


@pytest.fixture(params=["sqlite", "postgres"])
def gw(request):
    """SQLite, and PostgreSQL (whose feed cache answers preferences) when
    scripts/test-servers runs one."""
    if request.param == "postgres" and not POSTGRES:
        pytest.skip("no test PostgreSQL (scripts/test-servers starts one)")
    # The schema first, so that it is dropped only after the gateway on it
    # has stopped (fixtures end in the reverse order of their start).
    store = request.getfixturevalue("store_url") if request.param == "postgres" else "sqlite:herald.db"
    return request.getfixturevalue("gateway_factory")(config=config_with_critical(), store=store)


def prefs_path(user: str) -> str:
    return f"/users/{user}/preferences"


def save(gw, user: str, body, status: int = 200, **kw) -> dict:
    r = gw.server("PUT", prefs_path(user), json=body, **kw)
    assert r.status_code == status, r.text
    return r.json()


def get(gw, user: str) -> dict:
    r = gw.server("GET", prefs_path(user))
    assert r.status_code == 200, r.text
    return check_preferences(r.json()["preferences"])


def head(gw, user: str) -> int:
    """The feed's head, as a sync from 0 reaches it."""
    r = gw.me("GET", "/sync", gw.token(user), params={"cursor": 0})
    assert r.status_code == 200, r.text
    return r.json()["cursor"]


def test_a_group_kept_out_of_the_inbox_suppresses_its_publishes(gw):
    user, other = uid("u"), uid("u")
    assert get(gw, user) == {"default": {"inbox": True, "push": True}, "groups": {}, "critical": CRITICAL,
                             "version": 0, "updatedAt": None}
    kept = gw.publish(user, "kept", groupName="ads")
    saved = save(gw, user, {"groups": {"ads": {"inbox": False}}})
    check_preferences(saved["preferences"])
    assert saved["seq"] == kept["seq"] + 1
    before = head(gw, user)

    for anid in ("new", "kept"):
        r = gw.publish_raw(user, {"appNotificationId": anid, "payload": {"t": 1}, "groupName": "ads"})
        assert (r.status_code, r.json()) == (200, {"notification": None, "seq": None, "suppressed": "preferences"})
    assert head(gw, user) == before, "nothing changed"
    stored = {n["appNotificationId"]: n for n in gw.list_all(user)}
    assert set(stored) == {"kept"} and stored["kept"]["version"] == 1, "the stored one stays as it was"

    assert gw.publish(user, "chat", groupName="chat")["seq"] == before + 1, "other groups go in"
    assert gw.publish(user, "alarm", groupName="security")["seq"] == before + 2, "a critical group ignores preferences"
    sent = gw.server("POST", "/notifications", json={"userIds": [user, other], "appNotificationId": "b",
                                                     "payload": {"t": 1}, "groupName": "ads"})
    assert (sent.status_code, sent.json()) == (202, {"users": 1})
    wait_until(lambda: gw.list_all(other), "the other user's notification")
    assert "b" not in {n["appNotificationId"] for n in gw.list_all(user)}
    assert get(gw, other)["version"] == 0, "one user's save never touches another's"


def test_a_save_reaches_other_devices_live_on_resume_and_in_resets(gw):
    user, stranger = uid("u"), uid("u")
    gw.publish(user, "n1", groupName="chat")
    phone, _, pw = gw.connect(user, "phone")
    tablet, _, tw = gw.connect(user, "tablet", platform="android")
    other, _, _ = gw.connect(stranger, "phone")
    with phone, tablet, other:
        r = gw.me("PUT", "/preferences", gw.token(user), json={"groups": {"chat": {"push": False}}})
        assert r.status_code == 200, r.text
        p, seq = r.json()["preferences"], r.json()["seq"]
        assert p["version"] == 1 and p["groups"] == {"chat": {"push": False}}
        for ws in (phone, tablet):
            [c], _ = ws.expect_changes(1)
            assert c == {"seq": seq, "op": "preferences", "preferences": p}
        # The stranger hears nothing: one more publish to them is the first thing they see.
        gw.publish(stranger, "mark")
        [c], _ = other.expect_changes(1)
        assert c["op"] == "upsert"

    resumed = gw.me("GET", "/sync", gw.token(user), params={"cursor": pw["cursor"], "epoch": pw["epoch"]}).json()
    assert [c["op"] for c in resumed["changes"]] == ["preferences"]
    assert resumed["changes"][0]["preferences"] == p

    reset = gw.me("GET", "/sync", gw.token(user)).json()
    assert reset["reset"] is True and reset["preferences"] == p

    stream = Sse(gw, gw.token(user))
    try:
        ev = stream.next()
        assert ev["event"] == "reset" and json.loads(ev["data"])["preferences"] == p
        again = save(gw, user, {"groups": {}})
        ev = stream.next()
        assert ev["event"] == "change" and int(ev["id"]) == again["seq"]
        assert json.loads(ev["data"]) == {"seq": again["seq"], "op": "preferences", "preferences": again["preferences"]}
        p = again["preferences"]
    finally:
        stream.close()

    ws, frames, welcome = gw.connect(user, "laptop")
    with ws:
        reset_notifications(frames)
        assert frames[-1]["preferences"] == p, "the last frame of a WebSocket reset carries them"
        assert all("preferences" not in f for f in frames[:-1])
    ws, frames, _ = gw.connect(user, "tablet", cursor=tw["cursor"], epoch=tw["epoch"])
    with ws:
        resumed = changes_in(frames)
        assert [c["op"] for c in resumed] == ["preferences", "preferences"], "resume from the tablet's cursor"
        assert resumed[-1]["preferences"] == p


def test_if_match(gw):
    user = uid("u")
    assert save(gw, user, {"default": {"push": False}}, headers={"If-Match": '"0"'})["preferences"]["version"] == 1
    check_error(gw.server("PUT", prefs_path(user), json={"groups": {}}, headers={"If-Match": '"0"'}), 412,
                "precondition_failed")
    for bad in ("*", '"x"', "-1", '"1", "2"'):
        check_error(gw.server("PUT", prefs_path(user), json={"groups": {}}, headers={"If-Match": bad}), 400, "bad_request")
    assert get(gw, user)["version"] == 1, "nothing saved"
    assert save(gw, user, {"groups": {}}, headers={"If-Match": "1"})["preferences"]["version"] == 2


BAD_BODIES = [
    {}, [], "x", {"default": None}, {"groups": None}, {"default": {"inbox": None}}, {"groups": {"a": None}},
    {"groups": {"a": {"push": None}}}, {"groups": {"": {"push": False}}}, {"groups": {"g" * 257: {}}},
    {"groups": {"a": {"push": "no"}}}, {"groups": {"a": {"sms": True}}}, {"groups": {"a": True}},
    {"default": {"inbox": 0}}, {"default": []}, {"groups": []}, {"critical": ["a"]}, {"version": 3},
    {"groups": {f"g{i}": {} for i in range(101)}},
]


@pytest.mark.parametrize("route", ["server", "device"])
def test_bad_input_is_400_and_changes_nothing(gw, route):
    user = uid("u")
    save(gw, user, {"groups": {"a": {"push": False}}})
    before = head(gw, user)
    for body in BAD_BODIES:
        if route == "server":
            r = gw.server("PUT", prefs_path(user), json=body)
        else:
            r = gw.me("PUT", "/preferences", gw.token(user), json=body)
        check_error(r, 400, "bad_request")
    for raw in (b"{", b"", b"\xff"):
        check_error(gw.server("PUT", prefs_path(user), data=raw, headers={"Content-Type": "application/json"}), 400)
    check_error(gw.server("PUT", "/users/bad%20id/preferences", json={"groups": {}}), 400)
    for method in ("POST", "PATCH", "DELETE"):
        r = gw.server(method, prefs_path(user), json={})
        assert r.status_code == 405 and r.headers["Allow"] == "GET, HEAD, PUT", r.text
    assert head(gw, user) == before and get(gw, user)["groups"] == {"a": {"push": False}}
    assert gw.alive()


def test_preferences_are_the_users_not_another_apps(gw):
    user = uid("u")
    save(gw, user, {"default": {"inbox": False}})
    r = gw.server("GET", prefs_path(user), app="app.two")
    assert r.status_code == 200 and r.json()["preferences"]["version"] == 0 and r.json()["preferences"]["critical"] == []
    assert gw.publish(user, "n", app="app.two")["seq"] == 1


@pytest.mark.parametrize("value", [["ok", ""], "security", [1], ["g" * 257]])
def test_a_bad_critical_groups_value_stops_the_start_with_one_line(tmp_path, value):
    cfg = config_with_critical()
    cfg["apps"][0]["criticalGroups"] = value
    assert "criticalGroups must be an array of group names" in refused_start(cfg, tmp_path)


def test_critical_groups_follow_a_reload(gateway_factory):
    """SIGHUP puts new criticalGroups in force for answers and publishes; a
    bad value is refused and changes nothing."""
    gw = gateway_factory(config=config_with_critical(), store="memory")
    user = uid("u")
    save(gw, user, {"groups": {"alerts": {"inbox": False}, "security": {"inbox": False}}})
    assert gw.publish_raw(user, {"appNotificationId": "a1", "payload": {}, "groupName": "alerts"}).json()["suppressed"]
    cfg = config_with_critical()
    cfg["apps"][0]["criticalGroups"] = ["alerts"]
    assert "config reloaded from" in reload(gw, cfg)
    assert get(gw, user)["critical"] == ["alerts"]
    assert gw.publish(user, "a2", groupName="alerts")["seq"] > 0, "critical now"
    r = gw.publish_raw(user, {"appNotificationId": "s1", "payload": {}, "groupName": "security"})
    assert r.json()["suppressed"] == "preferences", "no longer critical: the user's choice holds"
    cfg["apps"][0]["criticalGroups"] = [""]
    assert "config reload refused" in reload(gw, cfg)
    assert get(gw, user)["critical"] == ["alerts"]


def test_a_group_kept_from_push_sends_none_while_its_inbox_works(gateway_factory, services, vapid_file):
    apns = services[0]
    gw = gateway_factory(config=config_with_critical(push_config(*services, vapid_file)), store="sqlite:herald.db")
    user = uid("u")
    register(gw, user, "phone", apns_handle(apns_token(1)))
    save(gw, user, {"groups": {"chat": {"push": False}, "security": {"push": False}}})
    quiet = gw.publish(user, "c1", payload={"title": "t", "body": "b"}, groupName="chat")
    assert quiet["notification"]["groupName"] == "chat", "the inbox still takes it"
    r = gw.server("PATCH", f"/users/{user}/notifications/{quiet['notification']['id']}", json={"readState": "read"})
    assert r.status_code == 200
    # Later pushes mark the point by which any push of the quiet group's changes would have gone.
    loud = gw.publish(user, "s1", payload={"title": "t", "body": "b"}, groupName="security")
    [p] = apns.wait_for(1)
    other = gw.publish(user, "o1", payload={"title": "t", "body": "b"}, groupName="other")
    pushes = apns.wait_for(2)
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="delivered"}') == 2, "both answered")
    assert [q["payload"]["herald"]["cursor"] for q in pushes] == [loud["seq"], other["seq"]], \
        "a critical group pushes; the quiet group's publish and read sent nothing"
    assert p["payload"]["aps"]["alert"] == {"title": "t", "body": "b"}


@pytest.mark.skipif(not (REDIS and POSTGRES), reason="no test PostgreSQL and Redis (scripts/test-servers starts them)")
def test_a_save_on_one_node_holds_for_publishes_on_another(herald_bin, tmp_path, store_url):  # noqa: F811
    """Node A knows the user's feed (its cache holds the preferences at its
    head); a save on node B reaches A's WebSocket over the bus, and A's next
    publishes follow it, muted and unmuted."""
    cluster = Cluster(herald_bin, tmp_path, store_url)
    try:
        a, b = cluster.start(2)
        user = uid("u")
        a.publish(user, "warm", groupName="ads")
        ws, _, _ = a.connect(user, "phone")
        with ws:
            r = b.server("PUT", prefs_path(user), json={"groups": {"ads": {"inbox": False}}})
            assert r.status_code == 200, r.text
            [c], _ = ws.expect_changes(1)
            assert c["op"] == "preferences" and c["preferences"] == r.json()["preferences"]
            muted = a.publish_raw(user, {"appNotificationId": "m", "payload": {}, "groupName": "ads"})
            assert muted.json() == {"notification": None, "seq": None, "suppressed": "preferences"}
            assert b.server("PUT", prefs_path(user), json={"groups": {}}).status_code == 200
            ws.expect_changes(1)
            assert a.publish(user, "m", groupName="ads")["notification"]["groupName"] == "ads"
    finally:
        cluster.stop()
