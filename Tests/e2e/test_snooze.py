"""Snoozes that end (SPEC section 11), end to end against the real binary:
a notification snoozed until a time wakes within 2 s of it, live to a
connected device, on resume to one that was away, after a restart of the
gateway (the time is kept in the store), and with an alert to an iOS
device that is not connected (the APNs stand-in)."""

from __future__ import annotations

import time

from herald_helpers import Gateway, check_error, epoch_seconds, herald_binary, iso, uid, wait_until
from test_push import apns_handle, apns_token, push_config, register, services, vapid_file  # noqa: F401 (fixtures)


def snooze(gw, user: str, nid: str, until: float, device: str = "phone"):
    r = gw.me("PATCH", f"/notifications/{nid}", gw.token(user), headers={"Herald-Device": device},
              json={"userActionState": "snoozed", "snoozedUntil": iso(until)})
    assert r.status_code == 200, r.text
    n = r.json()["notification"]
    assert n["userActionState"] == "snoozed" and n["snoozedUntil"] == iso(until)
    return n


def woken(change: dict, nid: str) -> bool:
    n = change.get("notification") or {}
    return change["op"] == "upsert" and n.get("id") == nid and n["userActionState"] == "noInteraction"


def test_a_snooze_wakes_on_time_live_and_on_resume(gateway_factory):
    gw = gateway_factory(store="sqlite:herald.db")
    user = uid("u")
    out = gw.publish(user, payload={"title": "t"})
    nid = out["notification"]["id"]
    gw.me("PATCH", f"/notifications/{nid}", gw.token(user), json={"readState": "read"})
    ws, _, welcome = gw.connect(user, "tablet")
    cursor, epoch = welcome["cursor"], welcome["epoch"]
    with ws:
        until = time.time() + 3
        snoozed = snooze(gw, user, nid, until)
        ws.recv_until(lambda f: f["type"] == "change" and f["change"]["notification"]["snoozedUntil"] == iso(until))
        frame, _ = ws.recv_until(lambda f: f["type"] == "change" and woken(f["change"], nid), timeout=10)
        n = frame["change"]["notification"]
        # Waking stamps updatedAt with the sweep's time: SPEC's 2 s, by the gateway's clock.
        late = epoch_seconds(n["updatedAt"]) - epoch_seconds(iso(until))
        assert 0 <= late <= 2, f"woke {late:.3f}s after its time"
        assert (n["readState"], n["seenState"], n["snoozedUntil"], n["version"]) == ("unread", "unseen", None, snoozed["version"] + 1)
        ws.recv_until(lambda f: f["type"] == "counts" and f["unread"] == 1)
    # A device away meanwhile resumes from its cursor to the woken state.
    r = gw.me("GET", "/sync", gw.token(user), params={"cursor": cursor, "epoch": epoch})
    assert r.status_code == 200, r.text
    last = r.json()["changes"][-1]
    assert woken(last, nid) and last["seq"] == frame["change"]["seq"]


def test_a_snooze_wakes_after_a_restart(tmp_path):
    """The time is in the store: a gateway stopped while it waits wakes it
    once started again."""
    workdir = tmp_path / "gw"
    gw = Gateway(herald_binary(), workdir, store="sqlite:herald.db").start()
    user = uid("u")
    try:
        nid = gw.publish(user, payload={"title": "t"})["notification"]["id"]
        snooze(gw, user, nid, time.time() + 3)
    finally:
        gw.terminate()
    again = Gateway(herald_binary(), workdir, store="sqlite:herald.db").start()
    try:
        ws, _, _ = again.connect(user, "tablet")
        with ws:
            ws.recv_until(lambda f: f["type"] == "change" and woken(f["change"], nid), timeout=15)
        assert again.get_notification(user, nid)["userActionState"] == "noInteraction"
    finally:
        again.terminate()


def test_a_woken_notification_alerts_a_disconnected_iphone(gateway_factory, services, vapid_file):  # noqa: F811
    apns = services[0]
    gw = gateway_factory(config=push_config(*services, vapid_file), store="sqlite:herald.db")
    user, token = uid("u"), apns_token(30)
    register(gw, user, "phone", apns_handle(token))
    nid = gw.publish(user, payload={"title": "Call back", "body": "Ada"})["notification"]["id"]
    apns.wait_for(1)
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="delivered"}') == 1, "the first alert answered")
    until = time.time() + 3
    snooze(gw, user, nid, until)
    pushes = apns.wait_for(3, timeout=15)  # the snooze's tap, then the wake's alert
    alert = pushes[-1]
    assert alert["headers"]["apns-push-type"] == "alert", pushes
    assert alert["payload"]["aps"]["alert"] == {"title": "Call back", "body": "Ada"}
    assert alert["payload"]["herald"]["id"] == nid and alert["payload"]["herald"]["op"] == "upsert"
    assert alert["at"] >= until - 0.05


def test_bad_snoozes_are_400_and_change_nothing(fresh_gateway):
    gw = fresh_gateway
    user = uid("u")
    out = gw.publish(user, payload={"title": "t"})
    nid, seq = out["notification"]["id"], out["seq"]
    now = time.time()
    for body in [
        {"userActionState": "snoozed", "snoozedUntil": iso(now - 5)},
        {"userActionState": "snoozed", "snoozedUntil": iso(now + 366 * 86400)},
        {"snoozedUntil": iso(now + 60)},  # not snoozed
        {"userActionState": "activated", "snoozedUntil": iso(now + 60)},
        {"userActionState": "snoozed", "snoozedUntil": "tomorrow"},
        {"userActionState": "snoozed", "snoozedUntil": 1764500000},
    ]:
        r = gw.me("PATCH", f"/notifications/{nid}", gw.token(user), json=body)
        check_error(r, 400, "bad_request")
    n = gw.get_notification(user, nid)
    assert (n["version"], n["userActionState"], n["snoozedUntil"]) == (1, "noInteraction", None)
    r = gw.me("GET", "/sync", gw.token(user), params={"cursor": seq})
    assert r.json()["changes"] == [], "nothing changed"
