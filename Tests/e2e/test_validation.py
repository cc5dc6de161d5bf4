"""Bad input (SPEC 3, 6, 8): every refused publish gets a clear error and
changes nothing — no notification created or replaced, no change emitted."""

import json
import time

import pytest

from herald_helpers import APPS, check_error, check_raw_error, iso, raw_http, uid

GUARD = "guard"


@pytest.fixture
def guard(gateway):
    """A user with one notification (appNotificationId `guard`) and a connected
    device; refused requests aim at the same appNotificationId, so a wrongly
    accepted one would show as a replaced notification or a change."""
    user = uid("val")
    n = gateway.publish(user, GUARD, payload={"keep": True}, priority="high", groupName="g",
                        displayTimeToLive=60, targetTags="a || b")["notification"]
    ws, _, welcome = gateway.connect(user, "watcher", tags=["a"])

    class G:
        pass
    g = G()
    g.user, g.n, g.ws, g.cursor = user, n, ws, welcome["cursor"]

    def unchanged():
        assert gateway.get_notification(user, n["id"]) == n, "a refused request changed the notification"
        assert [m["id"] for m in gateway.list_all(user)] == [n["id"]], "a refused request created a notification"
    g.unchanged = unchanged
    yield g
    try:
        g.ws.assert_silent(0.3)   # no change was emitted
    finally:
        g.ws.close()


def body(**kw):
    b = {"appNotificationId": GUARD, "payload": {"t": "new"}}
    for k, v in kw.items():
        if v is DROP:
            b.pop(k, None)
        else:
            b[k] = v
    return b


DROP = object()
NOW = time.time()

BAD_BODIES = {
    "no-anid": body(appNotificationId=DROP),
    "no-payload": body(payload=DROP),
    "anid-empty": body(appNotificationId=""),
    "anid-space": body(appNotificationId="has space"),
    "anid-129": body(appNotificationId="x" * 129),
    "anid-int": body(appNotificationId=5),
    "anid-null": body(appNotificationId=None),
    "anid-unicode": body(appNotificationId="tâche"),
    "payload-list": body(payload=[1, 2]),
    "payload-string": body(payload="hi"),
    "payload-null": body(payload=None),
    "payload-number": body(payload=5),
    "payload-bool": body(payload=True),
    "priority-unknown": body(priority="urgent"),
    "priority-case": body(priority="HIGH"),
    "priority-int": body(priority=1),
    "groupName-int": body(groupName=5),
    "groupName-list": body(groupName=["g"]),
    "dttl-string": body(displayTimeToLive="600"),
    "dttl-negative": body(displayTimeToLive=-1),
    "dttl-float": body(displayTimeToLive=1.5),
    "platforms-string": body(targetPlatforms="web"),
    "platforms-unknown": body(targetPlatforms=["toaster"]),
    "platforms-int": body(targetPlatforms=[5]),
    "platforms-object": body(targetPlatforms={"web": True}),
    "tags-int": body(targetTags=5),
    "tags-list": body(targetTags=["a"]),
    "tags-empty": body(targetTags=""),
    "tags-dangling-and": body(targetTags="a &&"),
    "tags-open-paren": body(targetTags="(a || b"),
    "tags-close-paren": body(targetTags="a || b)"),
    "tags-juxtaposed": body(targetTags="a b"),
    "tags-leading-op": body(targetTags="&& a"),
    "tags-lone-not": body(targetTags="!"),
    "tags-double-or": body(targetTags="a || || b"),
    "tags-bad-char": body(targetTags="bad$tag"),
    "tags-161": body(targetTags="x" * 161),
    "tags-21": body(targetTags=" || ".join(f"t{i}" for i in range(21))),
    "tags-21-mixed": body(targetTags="!t0 && (" + " || ".join(f"t{i}" for i in range(1, 20)) + ") && !t20"),
    "tags-21-repeated": body(targetTags=" && ".join(["a"] * 21)),
    "ttl-0": body(ttlSeconds=0),
    "ttl-negative": body(ttlSeconds=-5),
    "ttl-over-365d": body(ttlSeconds=365 * 86400 + 1),
    "ttl-string": body(ttlSeconds="60"),
    "ttl-float": body(ttlSeconds=1.5),
    "expires-past": body(expiresAt=iso(NOW - 3600)),
    "expires-over-365d": body(expiresAt=iso(NOW + 366 * 86400)),
    "expires-words": body(expiresAt="tomorrow"),
    "expires-number": body(expiresAt=int(NOW + 3600)),
    "expires-bad-month": body(expiresAt="2026-13-01T00:00:00.000Z"),
    "ttl-and-expires": body(ttlSeconds=60, expiresAt=iso(NOW + 3600)),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_publish_bad_body_is_400_and_changes_nothing(gateway, guard, name):
    b = BAD_BODIES[name]
    if name in ("expires-past", "expires-over-365d", "ttl-and-expires"):
        # times relative to now, computed at run time
        b = dict(b)
        if name == "expires-past":
            b["expiresAt"] = iso(time.time() - 3600)
        elif name == "expires-over-365d":
            b["expiresAt"] = iso(time.time() + 366 * 86400)
        else:
            b["expiresAt"] = iso(time.time() + 3600)
    check_error(gateway.publish_raw(guard.user, b), 400)
    guard.unchanged()


@pytest.mark.parametrize("raw", [
    b"{not json", b"", b"[]", b'"just a string"', b"null", b"42",
    b'{"appNotificationId":"guard","payload":{}',
    b'{"appNotificationId":"guard","payload":{},}',
    b'{"appNotificationId":"guard","payload":{"t":"\xff\xfe"}}',
    b'{"appNotificationId":"guard","payload":{"t":"x"}} trailing',
    b"{'appNotificationId':'guard','payload':{}}",
], ids=["garbage", "empty", "array", "string", "null", "number", "truncated", "trailing-comma", "invalid-utf8",
        "trailing-junk", "single-quotes"])
def test_publish_malformed_json_is_400(gateway, guard, raw):
    r = gateway.server("POST", f"/users/{guard.user}/notifications", data=raw,
                       headers={"Content-Type": "application/json"})
    check_error(r, 400)
    guard.unchanged()


@pytest.mark.parametrize("bad_user", ["bad%20user", "bad!user", "x" * 129, "t%C3%A2che"])
def test_publish_bad_user_id_is_400(gateway, guard, bad_user):
    r = gateway.server("POST", f"/users/{bad_user}/notifications", json=body())
    check_error(r, 400)
    guard.unchanged()


def test_twenty_tags_are_fine(gateway, guard):
    expr = "!t0 && (" + " || ".join(f"t{i}" for i in range(1, 19)) + ") && !t19"
    r = gateway.publish_raw(uid("ok"), {"appNotificationId": "t20", "payload": {}, "targetTags": expr})
    assert r.status_code == 201, r.text
    assert r.json()["notification"]["targetTags"] == expr


def _payload_of_encoded_size(n):
    p = {"d": ""}
    p["d"] = "a" * (n - len(json.dumps(p, separators=(",", ":"))))
    assert len(json.dumps(p, separators=(",", ":")).encode()) == n
    return p


def test_payload_of_64k_is_accepted(gateway):
    user = uid("big")
    p = _payload_of_encoded_size(64 * 1024)
    data = json.dumps({"appNotificationId": "b", "payload": p}, separators=(",", ":")).encode()
    r = gateway.server("POST", f"/users/{user}/notifications", data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text[:300]
    assert r.json()["notification"]["payload"] == p


def test_payload_over_64k_is_refused(gateway, guard):
    p = _payload_of_encoded_size(64 * 1024 + 1)
    data = json.dumps(body(payload=p), separators=(",", ":")).encode()
    r = gateway.server("POST", f"/users/{guard.user}/notifications", data=data, headers={"Content-Type": "application/json"})
    assert r.status_code in (400, 413), r.text[:300]
    check_error(r, r.status_code)
    guard.unchanged()


def test_oversized_body_is_413(gateway, guard):
    data = json.dumps(body(payload=_payload_of_encoded_size(1024 * 1024)), separators=(",", ":")).encode()
    r = raw_http(gateway, "POST", f"/v1/apps/app.one/users/{guard.user}/notifications",
                 {"Authorization": f"Bearer {APPS['app.one']['serverKey']}", "Content-Type": "application/json"}, data)
    check_raw_error(r, 413, "too_large")
    guard.unchanged()
    assert gateway.request("GET", "/healthz").status_code == 200


def test_deeply_nested_payload_is_refused_without_crash(gateway, guard):
    depth = 100000
    data = b'{"appNotificationId":"guard","payload":{"a":' + b"[" * depth + b"]" * depth + b"}}"
    r = raw_http(gateway, "POST", f"/v1/apps/app.one/users/{guard.user}/notifications",
                 {"Authorization": f"Bearer {APPS['app.one']['serverKey']}", "Content-Type": "application/json"}, data)
    assert r.status_code in (400, 413), r.text[:300]
    guard.unchanged()
    assert gateway.request("GET", "/healthz").status_code == 200


def test_refused_upsert_over_http_patch_changes_nothing(gateway, guard):
    from herald_helpers import mint_token
    tok = mint_token(guard.user)
    for b in ({}, {"readState": "maybe"}, {"userActionState": 3}, {"readState": "read", "userActionState": "gone"}):
        check_error(gateway.me("PATCH", f"/notifications/{guard.n['id']}", tok, json=b), 400)
    check_error(gateway.me("PATCH", f"/notifications/{guard.n['id']}", tok, data=b"{oops",
                           headers={"Content-Type": "application/json"}), 400)
    guard.unchanged()
