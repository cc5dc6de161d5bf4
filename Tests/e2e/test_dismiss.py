"""The product's promise: handled once, dismissed everywhere — and nobody else
hears about it (SPEC 1, 5)."""

from herald_helpers import changes_in, check_notification, mint_token, uid


def test_universal_dismiss(gateway, user):
    other_user = uid("other")
    phone, _, _ = gateway.connect(user, "phone", platform="ios")
    laptop, _, _ = gateway.connect(user, "laptop", platform="web")
    stranger, _, _ = gateway.connect(other_user, "phone", platform="ios")
    # the same user id in another app is another user
    other_app, _, _ = gateway.connect(user, "phone", app="app.two", platform="ios")
    with phone, laptop, stranger, other_app:
        out = gateway.publish(user, "task-42", payload={"title": "Review"})
        n = out["notification"]
        for w in (phone, laptop):
            changes, frames = w.expect_changes(1)
            assert changes == [{"seq": out["seq"], "op": "upsert", "notification": n}], frames

        ack, before = phone.request({"type": "update", "id": n["id"], "userActionState": "dismissed"})
        assert ack["type"] == "ack", ack
        dismissed = check_notification(ack["notification"])
        assert dismissed["userActionState"] == "dismissed" and dismissed["version"] == 2
        assert dismissed["id"] == n["id"]
        assert ack["seq"] > out["seq"]
        # The sender's broadcast may come before or after its ack.
        has_it = lambda fs: any(c["seq"] == ack["seq"] for c in changes_in(fs))
        for w, frames in ((phone, before), (laptop, [])):
            frames = w.collect_until(has_it, frames, what="the dismiss") + w.drain()
            changes = changes_in(frames)
            assert changes == [{"seq": ack["seq"], "op": "upsert", "notification": dismissed}], frames

        for w in (stranger, other_app):
            w.assert_silent()
    assert gateway.get_notification(user, n["id"])["userActionState"] == "dismissed"
    assert gateway.list_all(other_user) == []
    assert gateway.list_all(user, app="app.two") == []


def test_dismiss_over_http_reaches_every_device(gateway, user):
    phone, _, _ = gateway.connect(user, "phone")
    laptop, _, _ = gateway.connect(user, "laptop")
    stranger, _, _ = gateway.connect(uid("other"), "phone")
    with phone, laptop, stranger:
        n = gateway.publish(user)["notification"]
        for w in (phone, laptop):
            w.expect_counts(1, w.expect_changes(1)[1])
            w.drain(0.2)
        r = gateway.me("PATCH", f"/notifications/{n['id']}", mint_token(user), device="tablet",
                       json={"userActionState": "dismissed", "readState": "read"})
        assert r.status_code == 200, r.text
        m = r.json()["notification"]
        for w in (phone, laptop):
            changes, frames = w.expect_changes(1)
            assert changes == [{"seq": r.json()["seq"], "op": "upsert", "notification": m}]
            rest = w.expect_counts(0, frames) + w.drain()
            assert [f["unread"] for f in rest if f["type"] == "counts"][-1:] == [0], rest
        stranger.assert_silent()


def test_delete_on_one_device_reaches_the_others(gateway, user):
    a, _, _ = gateway.connect(user, "a")
    b, _, _ = gateway.connect(user, "b")
    with a, b:
        n = gateway.publish(user, "x")["notification"]
        a.expect_changes(1); b.expect_changes(1)
        ack, before = a.request({"type": "delete", "id": n["id"]})
        assert ack["type"] == "ack"
        has_it = lambda fs: any(c["seq"] == ack["seq"] for c in changes_in(fs))
        for w, frames in ((a, before), (b, [])):
            frames = w.collect_until(has_it, frames, what="the delete") + w.drain()
            ch = [c for c in changes_in(frames) if c["op"] == "delete"]
            assert ch == [{"seq": ack["seq"], "op": "delete", "id": n["id"], "appNotificationId": "x",
                           "reason": "deleted"}]
