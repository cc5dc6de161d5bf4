"""Visibility (SPEC 1, 5, 8): targetPlatforms and targetTags decide which of a
user's devices see a notification — live, in catch-up, in history and counts —
while every device's cursor still advances past what it may not see."""

import pytest

from herald_helpers import changes_in, mint_token, reset_notifications


def _anids(changes):
    return [c["notification"]["appNotificationId"] if c["op"] == "upsert" else c["appNotificationId"] for c in changes]


def test_target_platforms_live(gateway, user):
    ios, _, _ = gateway.connect(user, "phone", platform="ios", tags=["lang:it"])
    web, _, _ = gateway.connect(user, "laptop", platform="web")
    with ios, web:
        hidden = gateway.publish(user, "web-only", targetPlatforms=["web"])
        changes, _ = web.expect_changes(1)
        assert _anids(changes) == ["web-only"]
        ios.assert_silent()
        both = gateway.publish(user, "both")
        changes, _ = ios.expect_changes(1)
        assert _anids(changes) == ["both"] and changes[0]["seq"] == both["seq"] > hidden["seq"]
        changes, _ = web.expect_changes(1)
        assert _anids(changes) == ["both"]
        multi = gateway.publish(user, "ios-and-web", targetPlatforms=["ios", "web"])
        assert _anids(ios.expect_changes(1)[0]) == ["ios-and-web"]
        assert _anids(web.expect_changes(1)[0]) == ["ios-and-web"]
        assert multi["seq"] > both["seq"]


def test_hidden_changes_left_out_of_catchup_but_cursor_advances(gateway, user):
    ios, frames, welcome = gateway.connect(user, "phone", platform="ios")
    ios.close()
    c0, epoch = welcome["cursor"], welcome["epoch"]
    s1 = gateway.publish(user, "web-1", targetPlatforms=["web"])["seq"]
    ios, frames, welcome = gateway.connect(user, "phone", cursor=c0, epoch=epoch)
    with ios:
        assert frames == [], "nothing visible follows the cursor: no catch-up frames"
        assert welcome["cursor"] >= s1, "the cursor advances past changes the device may not see"
        assert welcome["unread"] == 0
    gateway.publish(user, "web-2", targetPlatforms=["web"])
    s3 = gateway.publish(user, "all-3")["seq"]
    gateway.publish(user, "web-4", targetPlatforms=["web"])
    ios, frames, welcome = gateway.connect(user, "phone", cursor=c0, epoch=epoch)
    with ios:
        changes = changes_in(frames)
        assert _anids(changes) == ["all-3"] and changes[0]["seq"] == s3
        assert welcome["cursor"] > s3
        assert welcome["unread"] == 1
    # without a cursor: the reset holds only what it may see
    ios, frames, welcome = gateway.connect(user, "phone")
    with ios:
        assert {n["appNotificationId"] for n in reset_notifications(frames)} == {"all-3"}
    web, frames, welcome = gateway.connect(user, "laptop", platform="web")
    with web:
        assert {n["appNotificationId"] for n in reset_notifications(frames)} == {"web-1", "web-2", "all-3", "web-4"}
        assert welcome["unread"] == 4


@pytest.mark.parametrize("expr,who", [
    ("lang:it && !muted", {"A"}),
    ("lang:en || muted", {"B", "C"}),
    ("lang:en || lang:it && muted", {"B", "C"}),
    ("(lang:en || lang:it) && muted", {"B"}),
    ("!lang:it && !lang:en", set()),
    ("!(lang:it && muted)", {"A", "C"}),
    ("device:B", {"B"}),
    ("platform:android", {"C"}),
    ("platform:ios && !device:A", {"B"}),
    ("vip", set()),
])
def test_target_tags_live(gateway, user, expr, who):
    devs = {
        "A": gateway.connect(user, "A", platform="ios", tags=["lang:it"])[0],
        "B": gateway.connect(user, "B", platform="ios", tags=["lang:it", "muted"])[0],
        "C": gateway.connect(user, "C", platform="android", tags=["lang:en"])[0],
    }
    try:
        gateway.publish(user, "tagged", targetTags=expr)
        for name, w in devs.items():
            if name in who:
                assert _anids(w.expect_changes(1)[0]) == ["tagged"], name
            else:
                w.assert_silent(0.5)
        # user:<id> matches every device of the user
        gateway.publish(user, "everyone", targetTags=f"user:{user}")
        for name, w in devs.items():
            assert "everyone" in _anids(w.expect_changes(1)[0]), name
    finally:
        for w in devs.values():
            w.close()


def test_history_and_counts_follow_visibility(gateway, user):
    ios, _, _ = gateway.connect(user, "phone", platform="ios", tags=["lang:it"])
    ios.close()
    tok = mint_token(user)
    gateway.publish(user, "web", targetPlatforms=["web"])
    gateway.publish(user, "it", targetTags="lang:it")
    gateway.publish(user, "en", targetTags="lang:en")
    gateway.publish(user, "all")
    seen = lambda **kw: {n["appNotificationId"] for n in gateway.me("GET", "/notifications", tok, **kw).json()["notifications"]}
    assert seen(device="phone") == {"it", "all"}
    assert seen() == {"web", "it", "en", "all"}, "an unnamed client sees everything the user may see"
    assert gateway.me("GET", "/counts", tok, device="phone").json() == {"unread": 2, "unseen": 2, "noInteraction": 2, "total": 2}
    assert gateway.me("GET", "/counts", tok).json() == {"unread": 4, "unseen": 4, "noInteraction": 4, "total": 4}
    bound = mint_token(user, dev="phone")
    assert {n["appNotificationId"] for n in gateway.me("GET", "/notifications", bound).json()["notifications"]} == {"it", "all"}


def test_retarget_away_sends_hidden_delete(gateway, user):
    ios, _, _ = gateway.connect(user, "phone", platform="ios")
    web, _, _ = gateway.connect(user, "laptop", platform="web")
    with ios, web:
        first = gateway.publish(user, "x")
        nid = first["notification"]["id"]
        for w in (ios, web):
            w.expect_counts(1, w.expect_changes(1)[1])
            w.drain(0.2)
        moved = gateway.publish(user, "x", targetPlatforms=["web"], expect=200)
        changes, frames = ios.expect_changes(1)
        assert changes == [{"seq": moved["seq"], "op": "delete", "id": nid, "appNotificationId": "x",
                            "reason": "hidden"}], frames
        rest = ios.expect_counts(0, frames) + ios.drain()
        assert [f["unread"] for f in rest if f["type"] == "counts"][-1:] == [0], rest
        changes, _ = web.expect_changes(1)
        assert changes[0]["op"] == "upsert" and changes[0]["seq"] == moved["seq"]
        assert changes[0]["notification"]["targetPlatforms"] == ["web"]
        # and back: the phone sees it again
        back = gateway.publish(user, "x", expect=200)
        changes, _ = ios.expect_changes(1)
        assert changes[0]["op"] == "upsert" and changes[0]["seq"] == back["seq"]
        assert changes[0]["notification"]["id"] == nid


def test_retarget_away_while_offline_is_a_hidden_delete_in_catchup(gateway, user):
    gateway.publish(user, "x")
    ios, _, welcome = gateway.connect(user, "phone", platform="ios")
    ios.close()
    moved = gateway.publish(user, "x", targetTags="lang:it", expect=200)
    ios, frames, welcome2 = gateway.connect(user, "phone", cursor=welcome["cursor"], epoch=welcome["epoch"])
    with ios:
        changes = changes_in(frames)
        assert changes == [{"seq": moved["seq"], "op": "delete", "id": moved["notification"]["id"],
                            "appNotificationId": "x", "reason": "hidden"}], frames
        assert welcome2["cursor"] == moved["seq"]


def test_tag_change_emits_nothing_and_next_catchup_is_reset(gateway, user):
    # the watcher, another device of the user, sees everything published here
    watcher, _, _ = gateway.connect(user, "watcher", tags=["lang:it", "lang:en"])
    with watcher:
        gateway.publish(user, "it", targetTags="lang:it")
        # Read the change and its counts: a late counts frame would fail the
        # watcher.assert_silent() below.
        watcher.expect_counts(1, watcher.expect_changes(1)[1]); watcher.drain(0.2)
        d, _, w1 = gateway.connect(user, "phone", tags=["lang:it"])
        d.close()
        # same cursor, other tags: a reset (showing what it may see now), and no change in the feed
        d, frames, w2 = gateway.connect(user, "phone", tags=["lang:en"], cursor=w1["cursor"], epoch=w1["epoch"])
        with d:
            assert frames and frames[0]["type"] == "reset", frames
            assert reset_notifications(frames) == []
            assert w2["cursor"] == w1["cursor"], "changing tags emits no change"
            d.assert_silent()
        watcher.assert_silent()
        gateway.publish(user, "en", targetTags="lang:en")
        watcher.expect_counts(2, watcher.expect_changes(1)[1]); watcher.drain(0.2)
        # unchanged tags: plain changes
        d, frames, w3 = gateway.connect(user, "phone", cursor=w2["cursor"], epoch=w2["epoch"])
        with d:
            assert [f["type"] for f in frames] == ["changes"]
            assert _anids(changes_in(frames)) == ["en"]
        # another platform: a reset again
        d, frames, w4 = gateway.connect(user, "phone", platform="web", cursor=w3["cursor"], epoch=w3["epoch"])
        with d:
            assert frames and frames[0]["type"] == "reset", frames
            assert {n["appNotificationId"] for n in reset_notifications(frames)} == {"en"}
            assert w4["cursor"] == w3["cursor"]
        watcher.assert_silent(0.3)
