"""SPEC 3: the app server API — publish, upsert, expiry, history/get/patch/delete
through the server path, device listing, app-wide sends."""

import time

import pytest

from herald_helpers import changes_in, check_error, check_notification, epoch_seconds, iso, mint_token, uid, wait_until


def test_publish_creates_with_defaults(gateway, user):
    t0 = time.time()
    r = gateway.publish_raw(user, {"appNotificationId": "task-42", "payload": {"title": "T", "body": "B"}})
    t1 = time.time()
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) >= {"notification", "seq"}
    assert isinstance(body["seq"], int)
    n = check_notification(body["notification"])
    assert n["appNotificationId"] == "task-42"
    assert n["userId"] == user
    assert n["payload"] == {"title": "T", "body": "B"}
    assert n["priority"] == "normal"
    assert n["groupName"] is None
    assert n["displayTimeToLive"] is None
    assert n["targetPlatforms"] is None
    assert n["targetTags"] is None
    assert n["readState"] == "unread"
    assert n["userActionState"] == "noInteraction"
    assert n["version"] == 1
    created = epoch_seconds(n["createdAt"])
    # Between the request and its answer (milliseconds are truncated).
    assert t0 - 0.001 <= created <= t1, (t0, n["createdAt"], t1)
    assert n["updatedAt"] == n["createdAt"] or epoch_seconds(n["updatedAt"]) >= created
    # default expiry: 30 days after the publish
    assert abs(epoch_seconds(n["expiresAt"]) - (created + 30 * 86400)) < 5
    # what GET answers is what POST answered
    assert gateway.get_notification(user, n["id"]) == n


def test_publish_with_every_field(gateway, user):
    exp = iso(time.time() + 3600)
    body = {"appNotificationId": "full", "payload": {"a": [1, 2, {"b": None}], "t": "ünï"},
            "priority": "high", "groupName": "tasks", "displayTimeToLive": 600,
            "targetPlatforms": ["web", "ios"], "targetTags": "lang:it && !muted", "expiresAt": exp}
    r = gateway.publish_raw(user, body)
    assert r.status_code == 201, r.text
    n = check_notification(r.json()["notification"])
    for k in ("appNotificationId", "payload", "priority", "groupName", "displayTimeToLive"):
        assert n[k] == body[k], k
    assert sorted(n["targetPlatforms"]) == ["ios", "web"]
    assert n["targetTags"] == "lang:it && !muted"
    assert abs(epoch_seconds(n["expiresAt"]) - epoch_seconds(exp)) < 0.002


def test_publish_ttl_seconds(gateway, user):
    n = gateway.publish(user, ttlSeconds=120)["notification"]
    assert abs(epoch_seconds(n["expiresAt"]) - epoch_seconds(n["createdAt"]) - 120) < 2


@pytest.mark.parametrize("ttl", [1, 365 * 86400])
def test_publish_ttl_bounds_accepted(gateway, user, ttl):
    r = gateway.publish_raw(user, {"appNotificationId": uid("n"), "payload": {}, "ttlSeconds": ttl})
    assert r.status_code == 201, r.text


def test_seq_strictly_increases_and_ids_unique(gateway, user):
    other = uid("other")
    seqs, ids = [], set()
    for i in range(10):
        out = gateway.publish(user, f"n{i}")
        seqs.append(out["seq"])
        ids.add(out["notification"]["id"])
        # same appNotificationId for another user: another notification
        ids.add(gateway.publish(other, f"n{i}")["notification"]["id"])
    assert all(b > a for a, b in zip(seqs, seqs[1:])), seqs
    assert len(ids) == 20


def test_upsert_replaces(gateway, user):
    first = gateway.publish_raw(user, {
        "appNotificationId": "task-1", "payload": {"v": 1}, "priority": "high", "groupName": "g",
        "displayTimeToLive": 60, "targetPlatforms": ["web"], "targetTags": "a", "ttlSeconds": 3600})
    assert first.status_code == 201, first.text
    n1, seq1 = first.json()["notification"], first.json()["seq"]
    # a device reads and dismisses it: version 2, 3
    tok = mint_token(user)
    r = gateway.me("PATCH", f"/notifications/{n1['id']}", tok, json={"readState": "read", "userActionState": "dismissed"})
    assert r.status_code == 200, r.text
    n2 = r.json()["notification"]
    assert n2["version"] == 2 and n2["readState"] == "read" and n2["userActionState"] == "dismissed"
    seq2 = r.json()["seq"]
    assert seq2 > seq1
    time.sleep(0.01)
    r = gateway.publish_raw(user, {"appNotificationId": "task-1", "payload": {"v": 2}})
    assert r.status_code == 200, r.text
    body = r.json()
    n3 = check_notification(body["notification"])
    assert body["seq"] > seq2
    assert n3["id"] == n1["id"]
    assert n3["createdAt"] == n1["createdAt"]
    assert n3["version"] == n2["version"] + 1 == 3
    assert n3["payload"] == {"v": 2}
    assert n3["readState"] == "unread"
    assert n3["userActionState"] == "noInteraction"
    assert n3["priority"] == "normal"
    assert n3["groupName"] is None
    assert n3["displayTimeToLive"] is None
    assert n3["targetPlatforms"] is None
    assert n3["targetTags"] is None
    # expiresAt recomputed: the default 30 days from now, not the earlier hour
    assert epoch_seconds(n3["expiresAt"]) > time.time() + 29 * 86400
    assert epoch_seconds(n3["updatedAt"]) >= epoch_seconds(n1["updatedAt"])
    assert gateway.get_notification(user, n1["id"]) == n3
    assert len(gateway.list_all(user)) == 1


def test_upsert_is_per_user(gateway):
    a, b = uid("a"), uid("b")
    na = gateway.publish(a, "same", expect=201)["notification"]
    nb = gateway.publish(b, "same", expect=201)["notification"]
    assert na["id"] != nb["id"]
    assert gateway.publish(a, "same", expect=200)["notification"]["id"] == na["id"]


def test_server_get_list_patch_delete(gateway, user):
    n = gateway.publish(user, "x")["notification"]
    r = gateway.server("GET", f"/users/{user}/notifications")
    assert r.status_code == 200, r.text
    assert [m["id"] for m in r.json()["notifications"]] == [n["id"]]
    assert "next" in r.json()
    r = gateway.server("GET", f"/users/{user}/notifications/{n['id']}")
    assert r.status_code == 200 and r.json()["notification"] == n
    r = gateway.server("PATCH", f"/users/{user}/notifications/{n['id']}", json={"readState": "read"},
                       headers={"If-Match": '"1"'})
    assert r.status_code == 200, r.text
    assert r.json()["notification"]["readState"] == "read" and r.json()["notification"]["version"] == 2
    assert isinstance(r.json()["seq"], int)
    check_error(gateway.server("PATCH", f"/users/{user}/notifications/{n['id']}", json={"readState": "unread"},
                               headers={"If-Match": '"1"'}), 412)
    assert gateway.get_notification(user, n["id"])["readState"] == "read"
    r = gateway.server("DELETE", f"/users/{user}/notifications/{n['id']}")
    assert r.status_code == 204, r.text
    assert r.content == b""
    check_error(gateway.server("DELETE", f"/users/{user}/notifications/{n['id']}"), 404)
    check_error(gateway.server("GET", f"/users/{user}/notifications/{n['id']}"), 404)
    assert gateway.list_all(user) == []


def test_unknown_notification_id_is_404(gateway, user):
    check_error(gateway.server("GET", f"/users/{user}/notifications/n_NOPE"), 404)
    check_error(gateway.server("PATCH", f"/users/{user}/notifications/n_NOPE", json={"readState": "read"}), 404)
    check_error(gateway.server("DELETE", f"/users/{user}/notifications/n_NOPE"), 404)


def test_publish_after_delete_creates_anew(gateway, user):
    n = gateway.publish(user, "re")["notification"]
    assert gateway.server("DELETE", f"/users/{user}/notifications/{n['id']}").status_code == 204
    r = gateway.publish_raw(user, {"appNotificationId": "re", "payload": {}})
    assert r.status_code == 201, r.text
    assert r.json()["notification"]["version"] == 1


def test_expiry_announced_as_delete_within_2s(gateway, user):
    ws, _, _ = gateway.connect(user)
    with ws:
        out = gateway.publish(user, "short", ttlSeconds=1)
        n = out["notification"]
        expires = epoch_seconds(n["expiresAt"])
        changes, _ = ws.expect_changes(1)
        assert changes[0]["op"] == "upsert"
        changes, _ = ws.expect_changes(1, timeout=max(0.5, expires + 2.5 - time.time()))
        c = changes[0]
        assert c == {"seq": c["seq"], "op": "delete", "id": n["id"], "appNotificationId": "short", "reason": "expired"}
        assert c["seq"] > out["seq"]
        assert time.time() <= expires + 2.5
    check_error(gateway.server("GET", f"/users/{user}/notifications/{n['id']}"), 404)
    assert gateway.list_all(user) == []
    assert gateway.me("GET", "/counts", mint_token(user)).json() == {"unread": 0, "unseen": 0, "noInteraction": 0, "total": 0}


def test_devices_listing(gateway, user):
    t0 = time.time()
    ws, _, _ = gateway.connect(user, "phone-1", platform="ios", tags=["lang:it", "vip"])
    devs = gateway.devices(user)
    assert set(devs) == {"phone-1"}
    d = devs["phone-1"]
    assert d["platform"] == "ios"
    assert set(d["tags"]) == {"lang:it", "vip", f"user:{user}", "platform:ios", "device:phone-1"}
    assert d["connected"] is True
    assert d["transport"] == "websocket"
    seen1 = epoch_seconds(d["lastSeenAt"])
    # The connection, between connecting and now (milliseconds are truncated).
    assert t0 - 0.001 <= seen1 <= time.time(), (t0, d["lastSeenAt"])
    ws.close()
    # The gateway sees the close a little after the client sends it.
    d = wait_until(lambda: (x := gateway.devices(user)["phone-1"])["connected"] is False and x,
                   "phone-1 listed as disconnected")
    assert d["connected"] is False
    assert d["transport"] is None
    # platform and tags absent from hello: kept
    ws, _, _ = gateway.connect(user, "phone-1")
    d = gateway.devices(user)["phone-1"]
    assert d["platform"] == "ios" and {"lang:it", "vip"} <= set(d["tags"])
    ws.close()
    # given: replaced
    ws, _, _ = gateway.connect(user, "phone-1", platform="android", tags=["lang:en"])
    d = gateway.devices(user)["phone-1"]
    assert d["platform"] == "android"
    assert set(d["tags"]) == {"lang:en", f"user:{user}", "platform:android", "device:phone-1"}
    ws.close()
    # devices of another app are not listed
    assert gateway.devices(user, app="app.two") == {}


# ---------------------------------------------------------------- app-wide sends

def _wait_for(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(0.1)


def test_fanout_by_user_ids(gateway):
    users = [uid("f") for _ in range(5)]
    r = gateway.server("POST", "/notifications", json={
        "userIds": users + users[:2], "appNotificationId": "broadcast-1", "payload": {"hello": "all"},
        "priority": "high"})
    assert r.status_code == 202, r.text
    assert r.json() == {"users": 5}
    for u in users:
        got = _wait_for(lambda: gateway.list_all(u))
        assert len(got) == 1, (u, got)
        n = got[0]
        assert n["appNotificationId"] == "broadcast-1" and n["payload"] == {"hello": "all"}
        assert n["priority"] == "high" and n["userId"] == u


def test_fanout_by_tag_expression(gateway):
    it_user, en_user, nodev_user = uid("it"), uid("en"), uid("nodev")
    w1, _, _ = gateway.connect(it_user, "d1", tags=["lang:it"])
    w2, _, _ = gateway.connect(en_user, "d1", tags=["lang:en"])
    expr = f"lang:it && (user:{it_user} || user:{en_user} || user:{nodev_user})"
    r = gateway.server("POST", "/notifications", json={
        "tagExpression": expr, "appNotificationId": "by-tag", "payload": {}})
    assert r.status_code == 202, r.text
    assert r.json() == {"users": 1}
    got = _wait_for(lambda: gateway.list_all(it_user))
    assert len(got) == 1 and got[0]["targetTags"] == expr
    changes, _ = w1.expect_changes(1, timeout=30)
    assert changes[0]["notification"]["appNotificationId"] == "by-tag"
    w2.assert_silent()
    assert gateway.list_all(en_user) == [] and gateway.list_all(nodev_user) == []
    w1.close(); w2.close()


@pytest.mark.parametrize("body", [
    {"appNotificationId": "x", "payload": {}},
    {"userIds": [], "appNotificationId": "x", "payload": {}},
    {"userIds": ["a"], "tagExpression": "a", "appNotificationId": "x", "payload": {}},
    {"userIds": [f"u{i}" for i in range(1001)], "appNotificationId": "x", "payload": {}},
    {"userIds": ["bad user"], "appNotificationId": "x", "payload": {}},
    {"userIds": "alice", "appNotificationId": "x", "payload": {}},
    {"userIds": ["alice"], "payload": {}},
    {"userIds": ["alice"], "appNotificationId": "x", "payload": []},
    {"tagExpression": "a &&", "appNotificationId": "x", "payload": {}},
], ids=["neither", "empty", "both", "1001", "bad-id", "not-list", "no-anid", "payload-list", "bad-expr"])
def test_fanout_bad_request(gateway, body):
    check_error(gateway.server("POST", "/notifications", json=body), 400)
    if isinstance(body.get("userIds"), list) and body["userIds"] and body["userIds"][0] != "bad user":
        time.sleep(0.2)
        assert gateway.list_all(body["userIds"][0]) == []


def test_fanout_1000_users_within_5s(gateway):
    tag = uid("big")
    users = [f"{tag}-{i}" for i in range(1000)]
    t0 = time.time()
    r = gateway.server("POST", "/notifications", json={"userIds": users, "appNotificationId": "big", "payload": {}})
    assert r.status_code == 202, r.text
    assert r.json() == {"users": 1000}
    last = users[-1]
    deadline = t0 + 5.5
    pending = set(users)
    while pending and time.time() < deadline:
        for u in list(pending)[:50]:
            if gateway.list_all(u):
                pending.discard(u)
        if pending:
            time.sleep(0.05)
    # everything is created within 5 s of the request
    still = [u for u in pending if not gateway.list_all(u)]
    assert not still, f"{len(still)} of 1000 users have no notification 5 s after the send (e.g. {still[:3]}); last={last}"


def test_expiry_while_offline_is_in_catchup(gateway, user):
    ws, _, welcome = gateway.connect(user, "phone")
    ws.close()
    # Another device of the user watches for the expiry (when it happens is
    # test_expiry_announced_as_delete_within_2s's business): sleeping 2.2 s
    # past expiresAt raced the sweep on a slow machine.
    watcher, _, _ = gateway.connect(user, "watcher")
    with watcher:
        out = gateway.publish(user, "brief", ttlSeconds=1)
        nid = out["notification"]["id"]
        watcher.collect_until(lambda fs: any(c["op"] == "delete" and c["id"] == nid for c in changes_in(fs)),
                              timeout=30, what="the expiry")
    ws, frames, welcome2 = gateway.connect(user, "phone", cursor=welcome["cursor"], epoch=welcome["epoch"])
    with ws:
        changes = [c for f in frames for c in f.get("changes", [])]
        assert [f["type"] for f in frames] == ["changes"], frames
        assert [c["op"] for c in changes] == ["upsert", "delete"], changes
        d = changes[1]
        assert d == {"seq": d["seq"], "op": "delete", "id": out["notification"]["id"], "appNotificationId": "brief",
                     "reason": "expired"}
        assert welcome2["cursor"] == d["seq"] and welcome2["unread"] == 0
