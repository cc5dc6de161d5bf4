"""SPEC 4 (device API over HTTP): history, get, patch (If-Match), delete,
counts, read-all. Sync, events and device PUT are in test_fallback.py."""

import pytest

from herald_helpers import assert_ids_of_no_form_are_unknown, check_error, check_notification, mint_token, uid


def _history(gateway, tok, **params):
    r = gateway.me("GET", "/notifications", tok, params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"notifications", "next"}, body
    for n in body["notifications"]:
        check_notification(n)
    return body


def _assert_history_order(ns):
    keys = [(n["createdAt"], n["id"].encode()) for n in ns]
    for a, b in zip(keys, keys[1:]):
        assert a > b, f"history not newest first (ties: higher id first): {a} then {b}"


def test_history_newest_first_and_paging(gateway, user):
    tok = mint_token(user)
    ids = [gateway.publish(user, f"h{i}")["notification"]["id"] for i in range(7)]
    body = _history(gateway, tok)
    _assert_history_order(body["notifications"])
    assert {n["id"] for n in body["notifications"]} == set(ids)
    assert body["next"] is None
    # pages of 3: 3, 3, 1
    seen, pages, before = [], [], None
    while True:
        q = {"limit": 3}
        if before:
            q["before"] = before
        b = _history(gateway, tok, **q)
        pages.append(len(b["notifications"]))
        seen.extend(b["notifications"])
        before = b["next"]
        if len(b["notifications"]) < 3:
            assert before is None, "a partial page is the last"
        if not before:
            break
        assert len(pages) < 10
    assert pages[:2] == [3, 3] and sum(pages) == 7
    assert [n["id"] for n in seen] == [n["id"] for n in body["notifications"]]


def test_history_default_limit_50_and_bounds(gateway, user):
    tok = mint_token(user)
    for i in range(55):
        gateway.publish(user, f"d{i}")
    b = _history(gateway, tok)
    assert len(b["notifications"]) == 50 and b["next"]
    rest = _history(gateway, tok, before=b["next"])
    assert len(rest["notifications"]) == 5 and rest["next"] is None
    assert len(_history(gateway, tok, limit=500)["notifications"]) == 55
    assert len(_history(gateway, tok, limit=1)["notifications"]) == 1
    for bad in ("0", "501", "-1", "abc", "1.5"):
        check_error(gateway.me("GET", "/notifications", tok, params={"limit": bad}), 400)


def test_history_next_token_survives_deletes(gateway, user):
    tok = mint_token(user)
    ns = [gateway.publish(user, f"p{i}")["notification"] for i in range(6)]
    page1 = _history(gateway, tok, limit=3)
    order = page1["notifications"]
    full = _history(gateway, tok, limit=6)["notifications"]
    assert [n["id"] for n in order] == [n["id"] for n in full[:3]]
    # delete the last of page 1 and the first of page 2
    for n in (full[2], full[3]):
        assert gateway.me("DELETE", f"/notifications/{n['id']}", tok).status_code == 204
    page2 = _history(gateway, tok, limit=3, before=page1["next"])
    assert [n["id"] for n in page2["notifications"]] == [n["id"] for n in full[4:6]]
    assert page2["next"] is None
    assert len(ns) == 6


@pytest.mark.parametrize("bad", ["garbage", "!!!", "", "x" * 300])
def test_history_malformed_before_is_400(gateway, user, bad):
    tok = mint_token(user)
    gateway.publish(user)
    if bad == "":
        # an empty token is either the first page or refused; it must not crash
        r = gateway.me("GET", "/notifications", tok, params={"before": bad})
        assert r.status_code in (200, 400), r.text
        return
    check_error(gateway.me("GET", "/notifications", tok, params={"before": bad}), 400)


def test_history_filters(gateway, user):
    tok = mint_token(user)
    a = gateway.publish(user, "a")["notification"]
    b = gateway.publish(user, "b")["notification"]
    c = gateway.publish(user, "c")["notification"]
    assert gateway.me("PATCH", f"/notifications/{a['id']}", tok, json={"readState": "read"}).status_code == 200
    assert gateway.me("PATCH", f"/notifications/{b['id']}", tok, json={"userActionState": "activated"}).status_code == 200
    ids = lambda **q: {n["id"] for n in _history(gateway, tok, **q)["notifications"]}
    assert ids(readState="unread") == {b["id"], c["id"]}
    assert ids(readState="read") == {a["id"]}
    assert ids(userActionState="noInteraction") == {a["id"], c["id"]}
    assert ids(userActionState="activated") == {b["id"]}
    assert ids(readState="unread", userActionState="noInteraction") == {c["id"]}
    check_error(gateway.me("GET", "/notifications", tok, params={"readState": "bogus"}), 400)
    check_error(gateway.me("GET", "/notifications", tok, params={"userActionState": "bogus"}), 400)


def test_get_one(gateway, user):
    tok = mint_token(user)
    n = gateway.publish(user, "one", payload={"k": "v"})["notification"]
    r = gateway.me("GET", f"/notifications/{n['id']}", tok)
    assert r.status_code == 200, r.text
    assert r.json() == {"notification": n}
    check_error(gateway.me("GET", "/notifications/n_doesnotexist", tok), 404)


def test_patch_states_and_versions(gateway, user):
    tok = mint_token(user)
    out = gateway.publish(user, "p")
    n = out["notification"]
    r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"notification", "seq"}
    m = check_notification(body["notification"])
    assert m["readState"] == "read" and m["userActionState"] == "noInteraction" and m["version"] == 2
    assert m["id"] == n["id"] and m["createdAt"] == n["createdAt"] and m["payload"] == n["payload"]
    assert body["seq"] > out["seq"]
    for state in ("activated", "snoozed", "dismissed", "noInteraction"):
        r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"userActionState": state})
        assert r.status_code == 200, r.text
        assert r.json()["notification"]["userActionState"] == state
    r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "unread", "userActionState": "dismissed"})
    assert r.status_code == 200
    final = r.json()["notification"]
    assert final["readState"] == "unread" and final["userActionState"] == "dismissed" and final["version"] == 7
    assert gateway.get_notification(user, n["id"]) == final


def test_patch_if_match(gateway, user):
    tok = mint_token(user)
    n = gateway.publish(user)["notification"]
    r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"}, headers={"If-Match": '"1"'})
    assert r.status_code == 200, r.text
    v2 = r.json()["notification"]
    # stale version: 412, nothing changed
    r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"userActionState": "dismissed"},
                   headers={"If-Match": '"1"'})
    check_error(r, 412, "precondition_failed")
    assert gateway.get_notification(user, n["id"]) == v2
    check_error(gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"userActionState": "dismissed"},
                           headers={"If-Match": "3"}), 412)
    assert gateway.get_notification(user, n["id"]) == v2
    # quotes optional
    r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"userActionState": "dismissed"}, headers={"If-Match": "2"})
    assert r.status_code == 200, r.text
    assert r.json()["notification"]["version"] == 3


@pytest.mark.parametrize("value", ["abc", '"abc"', "1.5", '"1', "-1x", "W/x"])
def test_patch_malformed_if_match_is_400(gateway, user, value):
    tok = mint_token(user)
    n = gateway.publish(user)["notification"]
    check_error(gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"},
                           headers={"If-Match": value}), 400)
    assert gateway.get_notification(user, n["id"]) == n


def test_patch_if_match_mismatch_emits_nothing(gateway, user):
    tok = mint_token(user)
    n = gateway.publish(user)["notification"]
    ws, _, _ = gateway.connect(user)
    with ws:
        check_error(gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"},
                               headers={"If-Match": '"7"'}), 412)
        ws.assert_silent()


@pytest.mark.parametrize("body", [
    {}, {"readState": "bogus"}, {"userActionState": "closed"}, {"readState": 1}, {"readState": None},
    {"userActionState": ["read"]}, [], "read", {"version": 5},
], ids=lambda b: str(b)[:30])
def test_patch_bad_body_is_400(gateway, user, body):
    tok = mint_token(user)
    n = gateway.publish(user)["notification"]
    check_error(gateway.me("PATCH", f"/notifications/{n['id']}", tok, json=body), 400)
    assert gateway.get_notification(user, n["id"]) == n


def test_patch_noop_answers_current_seq_and_creates_no_change(gateway, user):
    tok = mint_token(user)
    n = gateway.publish(user)["notification"]
    r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"})
    seq = r.json()["seq"]
    other = gateway.publish(user)
    seq = other["seq"]
    ws, _, welcome = gateway.connect(user)
    with ws:
        assert welcome["cursor"] == seq
        r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"})
        assert r.status_code == 200, r.text
        assert r.json()["seq"] == seq, "a no-op answers the current feed seq"
        assert r.json()["notification"]["version"] == 2
        r = gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read", "userActionState": "noInteraction"})
        assert r.status_code == 200 and r.json()["seq"] == seq
        ws.assert_silent()
    assert gateway.get_notification(user, n["id"])["version"] == 2


def test_delete(gateway, user):
    tok = mint_token(user)
    n = gateway.publish(user, "del")["notification"]
    ws, _, _ = gateway.connect(user)
    with ws:
        r = gateway.me("DELETE", f"/notifications/{n['id']}", tok)
        assert r.status_code == 204, r.text
        changes, _ = ws.expect_changes(1)
        c = changes[0]
        assert c == {"seq": c["seq"], "op": "delete", "id": n["id"], "appNotificationId": "del", "reason": "deleted"}
        check_error(gateway.me("DELETE", f"/notifications/{n['id']}", tok), 404)
        check_error(gateway.me("GET", f"/notifications/{n['id']}", tok), 404)
        check_error(gateway.me("PATCH", f"/notifications/{n['id']}", tok, json={"readState": "read"}), 404)
        ws.assert_silent(ignore=("counts",))
    assert _history(gateway, tok)["notifications"] == []


def test_ids_of_no_form_the_gateway_gives_are_unknown(gateway, user):
    assert_ids_of_no_form_are_unknown(gateway, user)


def test_counts(gateway, user):
    tok = mint_token(user)
    r = gateway.me("GET", "/counts", tok)
    assert r.status_code == 200
    assert r.json() == {"unread": 0, "unseen": 0, "noInteraction": 0, "total": 0}
    ns = [gateway.publish(user)["notification"] for _ in range(4)]
    gateway.me("PATCH", f"/notifications/{ns[0]['id']}", tok, json={"readState": "read"})
    gateway.me("PATCH", f"/notifications/{ns[1]['id']}", tok, json={"userActionState": "activated"})
    gateway.me("PATCH", f"/notifications/{ns[2]['id']}", tok, json={"readState": "read", "userActionState": "dismissed"})
    assert gateway.me("GET", "/counts", tok).json() == {"unread": 2, "unseen": 2, "noInteraction": 2, "total": 4}
    gateway.me("DELETE", f"/notifications/{ns[3]['id']}", tok)
    assert gateway.me("GET", "/counts", tok).json() == {"unread": 1, "unseen": 1, "noInteraction": 1, "total": 3}
    # other users' notifications do not count
    gateway.publish(uid("other"))
    assert gateway.me("GET", "/counts", tok).json()["total"] == 3


def test_read_all(gateway, user):
    tok = mint_token(user)
    ns = [gateway.publish(user, f"r{i}")["notification"] for i in range(3)]
    gateway.me("PATCH", f"/notifications/{ns[0]['id']}", tok, json={"readState": "read"})
    ws, _, _ = gateway.connect(user)
    with ws:
        r = gateway.me("POST", "/notifications/read-all", tok)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["updated"] == 2
        changes, frames = ws.expect_changes(2)
        # Its counts too: a counts frame later than the first assert_silent
        # below would fail the last one.
        ws.expect_counts(0, frames)
        assert {c["notification"]["id"] for c in changes} == {ns[1]["id"], ns[2]["id"]}
        assert all(c["op"] == "upsert" and c["notification"]["readState"] == "read" for c in changes)
        assert body["seq"] == max(c["seq"] for c in changes)
        ws.assert_silent(ignore=("counts",))
        assert gateway.me("GET", "/counts", tok).json()["unread"] == 0
        r = gateway.me("POST", "/notifications/read-all", tok)
        assert r.status_code == 200
        assert r.json() == {"updated": 0, "seq": body["seq"]}
        ws.assert_silent()


def test_read_all_respects_visibility(gateway, user):
    # phone-1 registers as ios by hello; a web-only notification is not its to read
    ws, _, _ = gateway.connect(user, "phone-1", platform="ios")
    ws.close()
    tok = mint_token(user)
    web_only = gateway.publish(user, "w", targetPlatforms=["web"])["notification"]
    for_all = gateway.publish(user, "a")["notification"]
    r = gateway.me("POST", "/notifications/read-all", tok, device="phone-1")
    assert r.status_code == 200, r.text
    assert r.json()["updated"] == 1
    assert gateway.get_notification(user, web_only["id"])["readState"] == "unread"
    assert gateway.get_notification(user, for_all["id"])["readState"] == "read"
    assert gateway.me("GET", "/counts", tok, device="phone-1").json() == {"unread": 0, "unseen": 0, "noInteraction": 1, "total": 1}
    assert gateway.me("GET", "/counts", tok).json() == {"unread": 1, "unseen": 1, "noInteraction": 2, "total": 2}


def test_read_all_is_not_a_notification_id(gateway, user):
    tok = mint_token(user)
    gateway.publish(user, "read-all")
    check_error(gateway.me("GET", "/notifications/read-all", tok), 405)
    check_error(gateway.me("DELETE", "/notifications/read-all", tok), 405)
    check_error(gateway.me("PATCH", "/notifications/read-all", tok, json={"readState": "read"}), 405)


def test_seen_all_and_unseen_counts_over_a_websocket(gateway, user):
    """SPEC 11: seen-all marks every unseen notification this device may see
    seen, one change each; read makes seen, unread leaves it seen; counts,
    welcome and counts frames carry unseen, a counts frame also when only
    unseen moved; other methods on seen-all are 405."""
    ws0, _, _ = gateway.connect(user, "phone-1", platform="ios")
    ws0.close()
    tok = mint_token(user)
    ns = [gateway.publish(user, f"s{i}")["notification"] for i in range(3)]
    web_only = gateway.publish(user, "w", targetPlatforms=["web"])["notification"]
    assert all(n["seenState"] == "unseen" for n in ns + [web_only])
    r = gateway.me("PATCH", f"/notifications/{ns[0]['id']}", tok, json={"readState": "read"})
    assert r.status_code == 200, r.text
    assert r.json()["notification"]["seenState"] == "seen" and r.json()["notification"]["version"] == 2
    r = gateway.me("PATCH", f"/notifications/{ns[0]['id']}", tok, json={"readState": "unread"})
    assert r.json()["notification"]["seenState"] == "seen", "unread again leaves it seen"
    check_error(gateway.me("PATCH", f"/notifications/{ns[1]['id']}", tok, json={"seenState": "maybe"}), 400, "bad_request")
    ws, _, welcome = gateway.connect(user, "phone-1", platform="ios")
    with ws:
        assert welcome["unread"] == 3 and welcome["unseen"] == 2, welcome
        r = gateway.me("POST", "/notifications/seen-all", tok, device="phone-1")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["updated"] == 2
        changes, frames = ws.expect_changes(2)
        frames = ws.collect_until(lambda fs: any(f["type"] == "counts" and f.get("unseen") == 0 for f in fs), frames)
        counts = [f for f in frames if f["type"] == "counts"]
        assert counts[-1] == {"type": "counts", "unread": 3, "unseen": 0}, counts
        assert {c["notification"]["id"] for c in changes} == {ns[1]["id"], ns[2]["id"]}
        assert all(c["notification"]["seenState"] == "seen" and c["notification"]["readState"] == "unread" for c in changes)
        assert body["seq"] == max(c["seq"] for c in changes)
        ws.assert_silent(ignore=("counts",))
        assert gateway.me("GET", "/counts", tok, device="phone-1").json() == {"unread": 3, "unseen": 0, "noInteraction": 3, "total": 3}
        assert gateway.get_notification(user, web_only["id"])["seenState"] == "unseen", "not this device's to see"
        unseen = gateway.me("GET", "/notifications", tok, params={"seenState": "unseen"}).json()["notifications"]
        assert [n["id"] for n in unseen] == [web_only["id"]]
        check_error(gateway.me("GET", "/notifications", tok, params={"seenState": "read"}), 400, "bad_request")
        assert gateway.me("POST", "/notifications/seen-all", tok, device="phone-1").json() == {"updated": 0, "seq": body["seq"]}
        ws.assert_silent()
    for method in ("GET", "PUT", "DELETE"):
        check_error(gateway.me(method, "/notifications/seen-all", tok), 405)
