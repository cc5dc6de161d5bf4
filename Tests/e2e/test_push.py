"""Push to devices that are not connected (SPEC section 10), end to end: the
real `herald` binary against the local stand-ins of APNs, FCM and Web Push
(push_standins.py, each checked against independent clients in
test_push_standins.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from herald_helpers import APPS, Gateway, complete_lines, herald_binary, refused_start, reload, uid, uid_in, wait_until
from push_standins import APNsStandIn, FCMStandIn, Outcome, WebPushStandIn, pem_private

APP = "app.one"


@pytest.fixture
def services(tmp_path):
    with APNsStandIn(tmp_path / "apns") as apns, FCMStandIn(tmp_path / "fcm") as fcm, WebPushStandIn(tmp_path / "web") as web:
        yield apns, fcm, web


def push_config(apns: APNsStandIn, fcm: FCMStandIn, web: WebPushStandIn, vapid_file) -> dict:
    a = apns.describe()
    return {"apps": [{"id": APP, **APPS[APP], "push": {
        "alert": {"title": "/title", "body": "/body"},
        "apns": {"teamId": a["teamId"], "keyId": a["keyId"], "keyFile": a["keyFile"], "topic": a["topic"],
                 "endpoint": apns.url, "developmentEndpoint": apns.url, "caFile": apns.ca_file},
        "fcm": {"serviceAccountFile": str(fcm.service_account_file), "endpoint": fcm.url, "caFile": fcm.ca_file},
        "webpush": {"vapidPrivateKeyFile": str(vapid_file), "subject": "mailto:ops@example.com",
                    "allowedHosts": [f"127.0.0.1:{web.server.port}"], "caFile": web.ca_file}}}]}


@pytest.fixture
def vapid_file(tmp_path):
    f = tmp_path / "vapid.pem"
    f.write_bytes(pem_private(ec.generate_private_key(ec.SECP256R1())))
    return f


@pytest.fixture
def pushing(gateway_factory, services, vapid_file):
    """A gateway on SQLite whose app pushes through the three stand-ins."""
    apns, fcm, web = services
    gw = gateway_factory(config=push_config(apns, fcm, web, vapid_file), store="sqlite:herald.db")
    return gw, apns, fcm, web


def apns_token(n: int = 0) -> str:
    """A device token of its own (64 hex digits): handles are unique per app."""
    return f"{uuid.uuid4().int:032x}{n:032x}"


def register(gw, user: str, device: str, push, platform: str = "ios"):
    r = gw.me("PUT", f"/devices/{device}", gw.token(user), json={"platform": platform, "push": push})
    assert r.status_code == 200, r.text
    return r.json()["device"]


def apns_handle(token: str) -> dict:
    return {"service": "apns", "token": token}


@pytest.mark.parametrize("value", [-1, 3601, 1.5, "15", None])
def test_a_bad_tap_interval_stops_the_start_with_one_line(services, vapid_file, tmp_path, value):
    cfg = push_config(*services, vapid_file)
    cfg["apps"][0]["push"]["tapIntervalSeconds"] = value
    assert "push.tapIntervalSeconds must be a whole number from 0 to 3600" in refused_start(cfg, tmp_path)


def test_taps_to_one_device_go_the_tap_interval_apart(gateway_factory, services, vapid_file):
    """The second tap waits out the interval from the first one's answer,
    then carries the last change."""
    apns = services[0]
    cfg = push_config(*services, vapid_file)
    cfg["apps"][0]["push"]["tapIntervalSeconds"] = 2
    gw = gateway_factory(config=cfg, store="sqlite:herald.db")
    user, token = uid("u"), apns_token(10)
    register(gw, user, "tablet", apns_handle(token))
    gw.publish(user, payload={"x": 1})  # no alert fields: a tap
    [first] = apns.wait_for(1)
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="delivered"}') == 1, "the first tap answered")
    gw.publish(user, payload={"x": 2})
    last = gw.publish(user, payload={"x": 3})
    [_, second] = apns.wait_for(2)
    assert second["at"] - first["at"] >= 2 - 0.001, "spaced (Herald's clock counts whole milliseconds)"
    assert second["payload"]["herald"]["cursor"] == last["seq"], "one tap for both changes"


@pytest.mark.parametrize("value", [0, 3601, 1.5, "60", None])
def test_a_bad_ping_interval_stops_the_start_with_one_line(services, vapid_file, tmp_path, value):
    cfg = push_config(*services, vapid_file)
    cfg["apps"][0]["push"]["pingIntervalSeconds"] = value
    assert "push.pingIntervalSeconds must be a whole number from 1 to 3600" in refused_start(cfg, tmp_path)


@pytest.mark.parametrize("service", ["apns", "fcm"])
def test_an_idle_connection_is_pinged_and_the_next_push_reuses_it(gateway_factory, services, vapid_file, service):
    """No new connection after a quiet spell: the idle one was kept, with a
    PING each interval (FCM's OAuth token request went over it too)."""
    standin = services[0] if service == "apns" else services[1]
    cfg = push_config(*services, vapid_file)
    cfg["apps"][0]["push"]["pingIntervalSeconds"] = 1
    gw = gateway_factory(config=cfg, store="sqlite:herald.db")
    user = uid("u")
    if service == "apns":
        register(gw, user, "phone", apns_handle(apns_token(1)))
    else:
        register(gw, user, "pixel", {"service": "fcm", "token": "fcm-token-ping"}, platform="android")
    gw.publish(user, payload={"title": "One", "body": "first"})
    [first] = standin.wait_for(1)
    wait_until(lambda: len(standin.pings()) >= 3, "three PINGs on the idle connection")
    pings = standin.pings()
    assert {number for number, _ in pings} == {first["connection"]}
    gaps = [b - a for (_, a), (_, b) in zip(pings, pings[1:])]
    assert all(gap >= 0.9 for gap in gaps), f"one PING a second, not more: {gaps}"
    gw.publish(user, payload={"title": "Two", "body": "after the quiet"})
    [_, second] = standin.wait_for(2)
    assert second["connection"] == first["connection"]
    assert standin.connections == 1, "the idle connection was kept, not reopened"

def test_a_disconnected_device_gets_an_alert_a_connected_one_nothing(pushing):
    gw, apns, fcm, _ = pushing
    user = uid("u")
    phone, tablet = apns_token(1), apns_token(2)
    register(gw, user, "phone", apns_handle(phone))
    register(gw, user, "tablet", apns_handle(tablet))
    register(gw, user, "pixel", {"service": "fcm", "token": "fcm-token-1"}, platform="android")
    assert gw.devices(user)["phone"]["push"] == {"service": "apns"}
    ws, _, _ = gw.connect(user, "tablet")
    with ws:
        out = gw.publish(user, payload={"title": "Review", "body": "the plan"}, priority="high", groupName="work")
        ws.expect_changes(1)
    n = out["notification"]
    [p] = apns.wait_for(1)
    fcm.wait_for(1)
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="delivered"}') == 1, "the APNs push answered")
    assert [a["token"] for a in apns.accepted] == [phone], "the connected tablet got nothing"
    h = p["headers"]
    assert (h["apns-push-type"], h["apns-priority"], h["apns-collapse-id"], h["apns-topic"]) == ("alert", "10", n["id"], apns.topic)
    # The notification lives 30 days; a push at most 28.
    assert abs(int(h["apns-expiration"]) - (time.time() + 28 * 86400)) < 120
    assert p["payload"]["aps"] == {"alert": {"title": "Review", "body": "the plan"}, "thread-id": "work"}
    herald = p["payload"]["herald"]
    assert (herald["cursor"], herald["id"], herald["op"]) == (out["seq"], n["id"], "upsert") and herald["epoch"]
    data = fcm.accepted[0]["message"]
    assert data["data"] == {"kind": "alert", "cursor": str(out["seq"]), "epoch": herald["epoch"], "op": "upsert", "id": n["id"],
                            "title": "Review", "body": "the plan", "groupName": "work"}
    assert data["android"]["priority"] == "high" and "collapse_key" not in data["android"], "FCM keeps four collapse keys at most"
    assert fcm.token_requests == 1


def test_a_dismiss_on_the_phone_taps_the_sleeping_tablet(pushing):
    gw, apns, _, _ = pushing
    user = uid("u")
    tablet = apns_token(3)
    register(gw, user, "tablet", apns_handle(tablet))
    phone, _, _ = gw.connect(user, "phone")
    with phone:
        n = gw.publish(user, payload={"title": "t", "body": "b"})["notification"]
        apns.wait_for(1)
        ack, _ = phone.request({"type": "update", "id": n["id"], "userActionState": "dismissed"})
        assert ack["type"] == "ack"
    [_, tap] = apns.wait_for(2)
    assert tap["token"] == tablet
    assert (tap["headers"]["apns-push-type"], tap["headers"]["apns-priority"]) == ("background", "5")
    assert tap["payload"]["aps"] == {"content-available": 1}
    assert tap["payload"]["herald"]["id"] == n["id"] and tap["payload"]["herald"]["op"] == "state"
    assert tap["payload"]["herald"]["cursor"] == ack["seq"]


def test_a_dead_handle_is_removed_and_gets_nothing_more(pushing):
    gw, apns, fcm, _ = pushing
    user = uid("u")
    dead = apns_token(4)
    register(gw, user, "phone", apns_handle(dead))
    register(gw, user, "pixel", {"service": "fcm", "token": "fcm-dead-test"}, platform="android")
    apns.script(Outcome(410, "Unregistered"), key=dead)
    gw.publish(user, payload={"title": "t", "body": "b"})
    wait_until(lambda: gw.devices(user)["phone"]["push"] is None, "the dead handle removed")
    assert "phone" in gw.devices(user), "the device stays registered"
    fcm.wait_for(1)
    gw.publish(user, payload={"title": "t2", "body": "b"})
    fcm.wait_for(2)  # the same commit would have recorded the phone's
    wait_until(lambda: gw.metric('herald_push_sent_total{service="fcm",outcome="delivered"}') == 2, "both FCM pushes answered")
    assert apns.accepted == [] and len(apns.refused) == 1
    assert gw.metric('herald_push_sent_total{service="apns",outcome="unregistered",reason="Unregistered"}') == 1


def test_429_and_503_are_retried_no_sooner_than_retry_after(pushing):
    gw, apns, _, _ = pushing
    user, token = uid("u"), apns_token(5)
    register(gw, user, "phone", apns_handle(token))
    apns.script(Outcome(429, "TooManyRequests", 2), Outcome(503, "ServiceUnavailable", 2), key=token)
    gw.publish(user, payload={"title": "t", "body": "b"})
    [p] = apns.wait_for(1, timeout=30)
    first, second = apns.refused
    assert (first["status"], second["status"]) == (429, 503)
    assert second["at"] - first["at"] >= 2 and p["at"] - second["at"] >= 2, "Retry-After honoured"
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="retried"}') == 2, "two retries counted")


def test_too_many_provider_token_updates_is_retried_with_the_same_token(pushing):
    """Apple's 429 TooManyProviderTokenUpdates: Herald keeps its token (a
    new one would be refused the same way), waits and sends again."""
    gw, apns, _, _ = pushing
    user, token = uid("u"), apns_token(9)
    register(gw, user, "phone", apns_handle(token))
    apns.script(Outcome(429, "TooManyProviderTokenUpdates"), key=token)
    gw.publish(user, payload={"title": "t", "body": "b"})
    [p] = apns.wait_for(1)
    [refused] = apns.refused
    assert refused["reason"] == "TooManyProviderTokenUpdates"
    assert p["headers"]["authorization"] == refused["authorization"], "the same provider token"
    assert p["at"] - refused["at"] >= 1, "after the backoff"
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="retried"}') == 1, "the retry counted")


def handle_moves(gw, apns, alice: str, bob: str, token: str) -> None:
    """Alice's phone registers `token`, then the app server gives it to
    bob's iPad: alice's registration loses it, and only bob's notification
    is pushed."""
    register(gw, alice, "phone", apns_handle(token))
    r = gw.server("PUT", f"/users/{bob}/devices/ipad", json={"platform": "ios", "push": apns_handle(token)})
    assert r.status_code == 200 and r.json()["device"]["push"] == {"service": "apns"}, r.text
    assert gw.devices(alice)["phone"]["push"] is None
    gw.publish(alice, payload={"title": "for alice", "body": "b"})
    gw.publish(bob, payload={"title": "for bob", "body": "b"})
    [p] = apns.wait_for(1)
    assert p["payload"]["aps"]["alert"]["title"] == "for bob"
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="delivered"}') == 1, "answered")
    assert len(apns.accepted) == 1


def test_a_moved_handle_stops_the_first_users_pushes(pushing):
    gw, apns, _, _ = pushing
    handle_moves(gw, apns, uid("alice"), uid("bob"), apns_token(6))


def test_web_push_carries_the_change_encrypted_to_the_browser(pushing):
    gw, _, _, web = pushing
    user = uid("u")
    keys = gw.me("GET", "/push", gw.token(user)).json()
    assert keys["services"] == ["apns", "fcm", "webpush"] and keys["webPushPublicKey"]
    sub = web.new_subscription(application_server_key=keys["webPushPublicKey"])
    register(gw, user, "browser", {"service": "webpush", "subscription": sub}, platform="web")
    out = gw.publish(user, payload={"title": "Hello", "body": "browser"})
    [m] = web.wait_for(1)
    body = m["json"]
    assert body["title"] == "Hello" and body["herald"]["id"] == out["notification"]["id"]
    assert body["change"] == {"seq": out["seq"], "op": "upsert", "notification": out["notification"]}
    assert int(m["headers"]["ttl"]) > 0 and m["headers"]["urgency"] == "normal"
    assert m["headers"]["topic"] == out["notification"]["id"]


def test_device_given_urls_never_make_herald_post_elsewhere(pushing, tmp_path):
    gw, apns, _, web = pushing
    user = uid("u")
    sub = web.new_subscription()
    keys = sub["keys"]
    for endpoint in ["http://127.0.0.1:1/x", f"https://127.0.0.1:{web.server.port + 1}/x", "https://127.0.0.1/x", "https://169.254.169.254/latest/meta-data", "https://internal.example/x",
                     "https://user@127.0.0.1/x", "https://127.0.0.1\\@evil.example/x"]:
        r = gw.me("PUT", "/devices/browser", gw.token(user),
                  json={"platform": "web", "push": {"service": "webpush", "subscription": {"endpoint": endpoint, "keys": keys}}})
        assert r.status_code == 400, (endpoint, r.text)
    assert "browser" not in gw.devices(user)
    # A push service that redirects is not followed.
    with WebPushStandIn(tmp_path / "elsewhere") as elsewhere:
        web.script(Outcome(302, "moved"), key=sub["endpoint"].rsplit("/", 1)[1])
        web.redirect_to = elsewhere.url + "/push/x"
        register(gw, user, "browser", {"service": "webpush", "subscription": sub}, platform="web")
        gw.publish(user, payload={"title": "t", "body": "b"})
        wait_until(lambda: gw.metric('herald_push_sent_total{service="webpush",outcome="rejected",reason="302"}', absent=0) == 1, "the redirect refused")
        assert elsewhere.connections == 0


def test_a_hung_service_delays_no_live_delivery(pushing):
    gw, apns, _, _ = pushing
    apns.hold = True
    sleepers = [uid("s") for _ in range(20)]
    for k, u in enumerate(sleepers):
        register(gw, u, "phone", apns_handle(apns_token(100 + k)))
        gw.publish(u, payload={"title": "t", "body": "b"})
    apns.wait_for(20)
    assert all(a.get("held") for a in apns.accepted)
    awake = uid("awake")
    ws, _, _ = gw.connect(awake, "laptop")
    with ws:
        for _ in range(20):
            gw.publish(awake, payload={"title": "live"})
            ws.expect_changes(1, timeout=5)
    apns.release_held()


needs_cluster = pytest.mark.skipif(not os.environ.get("HERALD_TEST_POSTGRES_URL") or not os.environ.get("HERALD_TEST_REDIS_URL"),
                                   reason="needs scripts/test-servers (PostgreSQL and Redis)")


def two_nodes_push(gateway_factory, services, vapid_file, n: int):
    """Two nodes on one PostgreSQL store and Redis bus, and `n` users' phones
    registered and published to through each in turn: the nodes, and the
    notifications' ids."""
    config = push_config(*services, vapid_file)
    pg, redis = os.environ["HERALD_TEST_POSTGRES_URL"], os.environ["HERALD_TEST_REDIS_URL"]
    nodes = [gateway_factory(config=config, store=pg, extra_args=["--bus", redis]) for _ in range(2)]
    prefix = uid("pair")
    for i in range(n):
        r = nodes[i % 2].server("PUT", f"/users/{prefix}-{i}/devices/phone", json={"platform": "ios", "push": apns_handle(f"{i:064x}")})
        assert r.status_code == 200, r.text
    ids = {nodes[i % 2].publish(f"{prefix}-{i}", payload={"title": f"n{i}", "body": "b"})["notification"]["id"] for i in range(n)}
    return nodes, ids


@needs_cluster
def test_two_nodes_send_each_push_once(gateway_factory, services, vapid_file):
    apns = services[0]
    n = 1000
    nodes, ids = two_nodes_push(gateway_factory, services, vapid_file, n)
    got = apns.wait_for(n, timeout=120)
    collapse = [g["collapseId"] for g in got]
    assert set(collapse) == ids and len(collapse) == n, "every push once"
    delivered = lambda: sum(node.metric('herald_push_sent_total{service="apns",outcome="delivered"}') for node in nodes)
    wait_until(lambda: delivered() == n, "every push answered")
    assert len(apns.accepted) == n, "none twice"


@needs_cluster
def test_two_nodes_sign_with_one_provider_token(gateway_factory, services, vapid_file):
    """Apple asks for few provider tokens per team: the nodes of one
    deployment share the one in the store, whichever made it. Each node
    sends the pushes it records, so both ask for a token at once."""
    apns = services[0]
    n = 20
    two_nodes_push(gateway_factory, services, vapid_file, n)
    got = apns.wait_for(n)
    assert len({g["connection"] for g in got}) == 2, "each node sent over its own connection"
    assert {g["headers"]["authorization"] for g in got} == {got[0]["headers"]["authorization"]}, "one provider token"
    assert apns.refused == []


def test_a_handle_moves_between_the_partitions_of_one_database(gateway_factory, services, vapid_file):
    """On PostgreSQL a node's partitions share the registrations: a handle
    registered for a user of the other partition is taken from the first in
    the same batch (its unique key would refuse it otherwise), and only the
    second user's pushes go to it."""
    apns, fcm, web = services
    gw = gateway_factory(config=push_config(apns, fcm, web, vapid_file), store=os.environ["HERALD_TEST_POSTGRES_URL"],
                         extra_args=["--partitions", "2"])
    handle_moves(gw, apns, uid_in(0, 2, "alice"), uid_in(1, 2, "bob"), apns_token(8))


def test_a_push_acknowledged_before_kill_9_is_sent_after_the_restart(gateway_factory, services, vapid_file, tmp_path):
    apns, fcm, web = services
    workdir = tmp_path / "durable"
    config = push_config(apns, fcm, web, vapid_file)
    gw = Gateway(herald_binary(), workdir, config, store="sqlite:herald.db").start()
    user, token = uid("u"), apns_token(7)
    register(gw, user, "phone", apns_handle(token))
    apns.hold = True
    out = gw.publish(user, payload={"title": "kept", "body": "b"})
    apns.wait_for(1)  # the stand-in holds its answer
    gw.kill()
    apns.release_held()
    again = Gateway(herald_binary(), workdir, config, store="sqlite:herald.db").start()
    try:
        pushes = apns.wait_for(2, timeout=30)
        assert pushes[1]["collapseId"] == out["notification"]["id"] and not pushes[1].get("held")
        assert pushes[1]["headers"]["authorization"] == pushes[0]["headers"]["authorization"], "the stored provider token"
    finally:
        again.terminate()


def test_a_connection_lost_without_a_close_handshake_gets_a_tap(pushing):
    gw, apns, _, _ = pushing
    user, token = uid("u"), apns_token(8)
    register(gw, user, "tablet", apns_handle(token))
    tablet, _, _ = gw.connect(user, "tablet")
    out = gw.publish(user, payload={"title": "t", "body": "b"})
    tablet.expect_changes(1)
    # The connection ends with no close frame, as when the network goes.
    tablet.conn.socket.shutdown(socket.SHUT_RDWR)
    tablet.close()
    [tap] = apns.wait_for(1)
    assert tap["token"] == token and tap["headers"]["apns-push-type"] == "background"
    assert tap["payload"]["herald"]["cursor"] == out["seq"]


# ---------------------------------------------------------------- what the real services answer

def test_a_large_web_push_carries_the_change_only_within_2744_bytes(pushing):
    """Firefox for Android (autopush through FCM) refuses bodies over 2,744
    bytes with 413: the change rides only in bodies within that, and a 413 is
    answered by sending the push again without the change, its text cut."""
    gw, _, _, web = pushing
    user = uid("u")
    android = web.new_subscription(bridged=True)
    # Keys as some libraries give them, with `=` padding.
    padded = {**android, "keys": {k: v + "=" * (-len(v) % 4) for k, v in android["keys"].items()}}
    assert padded["keys"] != android["keys"]
    register(gw, user, "android", {"service": "webpush", "subscription": padded}, platform="web")
    small = gw.publish(user, payload={"title": "small", "body": "b"})
    [m] = web.wait_for(1)
    assert m["json"]["change"]["notification"]["id"] == small["notification"]["id"] and m["size"] <= 2744
    gw.publish(user, payload={"title": "large change", "body": "b", "pad": "x" * 2700})
    [_, m] = web.wait_for(2)
    assert "change" not in m["json"] and m["json"]["title"] == "large change" and m["size"] <= 2744
    # A text too long for 2,744 bytes fits the usual 4,096: refused once, then sent cut.
    gw.publish(user, payload={"title": "t" * 3000, "body": "b"})
    [_, _, m] = web.wait_for(3)
    assert m["json"]["title"].endswith("…") and m["size"] <= 2744
    [refusal] = web.refused
    assert refusal["status"] == 413
    wait_until(lambda: gw.metric('herald_push_sent_total{service="webpush",outcome="delivered"}') == 3, "all three answered")
    assert gw.metric('herald_push_sent_total{service="webpush",outcome="rejected",reason="413"}', absent=0) == 0


def test_fcm_sender_id_mismatch_removes_the_handle_not_the_credentials(pushing):
    gw, _, fcm, _ = pushing
    user = uid("u")
    register(gw, user, "pixel", {"service": "fcm", "token": "fcm-other-project"}, platform="android")
    fcm.script(Outcome(403, "SENDER_ID_MISMATCH"), key="fcm-other-project")
    gw.publish(user, payload={"title": "t", "body": "b"})
    wait_until(lambda: gw.devices(user)["pixel"]["push"] is None, "the handle removed")
    assert fcm.refused[-1]["status"] == 403 and "SENDER_ID_MISMATCH" in fcm.refused[-1]["reason"]
    assert gw.metric('herald_push_sent_total{service="fcm",outcome="unregistered",reason="SENDER_ID_MISMATCH"}') == 1
    assert gw.request("GET", "/healthz").json()["push"] == "ok"


def test_web_push_406_is_throttling_and_retried(pushing):
    """WNS (Edge) answers 406 when it throttles."""
    gw, _, _, web = pushing
    user = uid("u")
    sub = web.new_subscription()
    web.script(Outcome(406, "Not Acceptable", 1), key=sub["endpoint"].rsplit("/", 1)[1])
    register(gw, user, "edge", {"service": "webpush", "subscription": sub}, platform="web")
    gw.publish(user, payload={"title": "t", "body": "b"})
    [m] = web.wait_for(1)
    [refusal] = web.refused
    assert refusal["status"] == 406 and m["at"] - refusal["at"] >= 1, "Retry-After honoured"
    wait_until(lambda: gw.metric('herald_push_sent_total{service="webpush",outcome="delivered"}') == 1, "answered")
    assert gw.metric('herald_push_sent_total{service="webpush",outcome="retried"}') == 1


def test_a_retry_leaving_under_a_second_of_lifetime_expires(pushing):
    """A notification living 30 s whose push is throttled for 29 s: what
    would be left of its lifetime by then is under a second, so it is not sent."""
    gw, apns, _, _ = pushing
    user, token = uid("u"), apns_token(9)
    register(gw, user, "phone", apns_handle(token))
    apns.script(Outcome(429, "TooManyRequests", 29), key=token)
    gw.publish(user, payload={"title": "t", "body": "b"}, ttlSeconds=30)
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="expired"}') == 1, "the push given up")
    assert gw.metric('herald_push_sent_total{service="apns",outcome="retried"}') == 0
    assert apns.accepted == [] and len(apns.refused) == 1


def test_fcm_quota_exceeded_waits_at_least_a_minute(pushing):
    """No Retry-After: Herald's own backoff would try again in a second, but
    Google asks for 60 s, which a push living 60 s does not have."""
    gw, _, fcm, _ = pushing
    user = uid("u")
    register(gw, user, "pixel", {"service": "fcm", "token": "fcm-quota"}, platform="android")
    fcm.script(Outcome(429), key="fcm-quota")
    gw.publish(user, payload={"title": "t", "body": "b"}, ttlSeconds=60)
    wait_until(lambda: gw.metric('herald_push_sent_total{service="fcm",outcome="expired"}') == 1, "the push given up")
    [refusal] = fcm.refused
    assert refusal["status"] == 429 and "QUOTA_EXCEEDED" in refusal["reason"] and fcm.accepted == []


def test_most_answers_calling_handles_dead_for_one_reason_are_a_configuration_warning(pushing):
    """A wrong topic makes Apple answer DeviceTokenNotForTopic for every
    device: logged once as a likely configuration error, in /healthz, and
    counted by reason."""
    gw, apns, _, _ = pushing
    users = [uid("u") for _ in range(10)]
    for k, user in enumerate(users):
        token = apns_token(200 + k)
        register(gw, user, "phone", apns_handle(token))
        apns.script(Outcome(400, "DeviceTokenNotForTopic"), key=token)
        gw.publish(user, payload={"title": "t", "body": "b"})
    health = wait_until(lambda: (h := gw.request("GET", "/healthz").json()).get("pushProblems") and h, "the warning")
    assert health["pushProblems"] == [{"app": APP, "service": "apns", "problem": "handlesDead", "reason": "DeviceTokenNotForTopic"}]
    assert health["push"] == "ok", "the credentials are fine"
    wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="unregistered",reason="DeviceTokenNotForTopic"}',
                                 absent=0) == 10, "every answer counted")
    # The log line follows the judgement /healthz shows.
    warnings = wait_until(lambda: [l for l in complete_lines(gw) if "likely a configuration error" in l], "the log line")
    assert len(warnings) == 1 and "DeviceTokenNotForTopic" in warnings[0] and APP in warnings[0], warnings


def two_environments(apns: APNsStandIn, sandbox: APNsStandIn, tmp_path) -> dict:
    """APNs settings reaching production at `apns` and the sandbox at `sandbox` (one CA file for both)."""
    ca = tmp_path / "apns-ca.pem"
    ca.write_text(Path(apns.ca_file).read_text() + Path(sandbox.ca_file).read_text())
    a = apns.describe()
    return {"teamId": a["teamId"], "keyId": a["keyId"], "keyFile": a["keyFile"], "topic": a["topic"],
            "endpoint": apns.url, "developmentEndpoint": sandbox.url, "caFile": str(ca)}


def test_an_environment_limited_key_fails_only_its_environment(gateway_factory, services, vapid_file, tmp_path):
    apns, fcm, web = services
    apns.limit_key(apns.key_id, "production")
    with APNsStandIn(tmp_path / "sandbox", environment="development", team=apns) as sandbox:
        config = push_config(apns, fcm, web, vapid_file)
        config["apps"][0]["push"]["apns"] = two_environments(apns, sandbox, tmp_path)
        gw = gateway_factory(config=config, store="sqlite:herald.db")
        prod_user, dev_user = uid("prod"), uid("dev")
        register(gw, prod_user, "phone", apns_handle(apns_token(10)))
        register(gw, dev_user, "phone", {**apns_handle(apns_token(11)), "environment": "development"})
        gw.publish(dev_user, payload={"title": "dev", "body": "b"})
        [refusal] = sandbox.wait_for(1, refused=True)
        assert refusal["reason"] == "BadEnvironmentKeyInToken"
        problem = {"app": APP, "service": "apns", "environment": "development", "problem": "credentialsRefused"}
        health = wait_until(lambda: (h := gw.request("GET", "/healthz").json()).get("pushProblems") and h, "the failure shown")
        assert (health["push"], health["pushProblems"]) == ("failing", [problem])
        [line] = wait_until(lambda: [l for l in complete_lines(gw) if "refused app" in l], "the log line")
        assert "for development devices" in line and "BadEnvironmentKeyInToken" in line, line
        # Production devices are served all along, and do not clear it.
        gw.publish(prod_user, payload={"title": "prod", "body": "b"})
        [p] = apns.wait_for(1)
        assert p["keyId"] == apns.key_id
        wait_until(lambda: gw.metric('herald_push_sent_total{service="apns",outcome="delivered"}') == 1, "answered")
        assert gw.request("GET", "/healthz").json()["pushProblems"] == [problem]

        # A sandbox-only key for development devices, read from its file at each reload.
        dev_file = apns.add_key("DEVKEY0001", environment="development")
        right = dev_file.read_bytes()
        dev_file.write_bytes(pem_private(ec.generate_private_key(ec.SECP256R1())))  # a key Apple does not know
        config["apps"][0]["push"]["apns"].update(developmentKeyId="DEVKEY0001", developmentKeyFile=str(dev_file))
        assert "config reloaded from" in reload(gw, config)
        wait_until(lambda: any(r["reason"] == "InvalidProviderToken" for r in sandbox.refused), "a push signed with the new file",
                   timeout=60)
        dev_file.write_bytes(right)
        assert "config reloaded from" in reload(gw, config), "the same config, another key in its file"
        [d] = sandbox.wait_for(1, timeout=60)
        assert (d["keyId"], d["payload"]["aps"]["alert"]["title"]) == ("DEVKEY0001", "dev")
        wait_until(lambda: gw.request("GET", "/healthz").json()["push"] == "ok", "the failure cleared")
        assert "pushProblems" not in gw.request("GET", "/healthz").json()


def serve_exit(herald_bin, tmp_path, config: dict) -> subprocess.CompletedProcess:
    f = tmp_path / "herald.json"
    f.write_text(json.dumps(config))
    return subprocess.run([str(herald_bin), "serve", "--store", "memory", "--port", "0", "--config", str(f)],
                          capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("subject", ["mailto: ops@example.com", "mailto:<ops@example.com>", "mailto:Ops <ops@example.com>",
                                     "mailto:ops@localhost", "mailto:ops@example.com,dev@example.com", "mailto:",
                                     "https://localhost/contact", "https://127.0.0.1/", "https://", "ops@example.com"])
def test_a_vapid_subject_apple_refuses_stops_the_start(herald_bin, services, vapid_file, tmp_path, subject):
    config = push_config(*services, vapid_file)
    config["apps"][0]["push"]["webpush"]["subject"] = subject
    r = serve_exit(herald_bin, tmp_path, config)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.decode().splitlines()
    assert "push.webpush.subject" in line, line


def test_a_development_key_needs_its_id_and_file_together(herald_bin, services, vapid_file, tmp_path):
    config = push_config(*services, vapid_file)
    config["apps"][0]["push"]["apns"]["developmentKeyId"] = "DEVKEY0001"
    r = serve_exit(herald_bin, tmp_path, config)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.decode().splitlines()
    assert "developmentKeyId and developmentKeyFile" in line, line


def test_an_https_vapid_subject_starts(gateway_factory, services, vapid_file):
    config = push_config(*services, vapid_file)
    config["apps"][0]["push"]["webpush"]["subject"] = "https://example.com/contact"
    assert gateway_factory(config=config).request("GET", "/healthz").json()["push"] == "ok"
