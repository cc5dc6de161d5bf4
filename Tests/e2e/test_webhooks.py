"""Webhooks (SPEC section 13), end to end: the real `herald` binary POSTs
events to local receivers, each of which verifies every request it gets
with the `standardwebhooks` library (PyPI), as an app's receiver would.
Every event type and its data; one seq for the events of one request;
signing with two secrets while rotating; a retry no sooner than
Retry-After; a hung receiver delaying neither live delivery nor another
endpoint; an event acknowledged before a kill -9 arriving after the
restart; two nodes on PostgreSQL and Redis sending each event once; bad
config values refused at start."""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from herald_helpers import APPS, CONFIG, Gateway, herald_binary, iso, mint_token, reload, uid, wait_until
from push_standins import APNsStandIn, Outcome
from test_postgres import store_url  # noqa: F401  (the fixture: a schema per test)

APP = "app.one"


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Receiver:
    """A webhook endpoint on loopback. Every request is verified with each of
    `secrets` (all must verify: Herald signs with every secret it is given);
    a request that does not verify is kept in `bad` and fails the test.
    `script` answers requests in turn (then 200): a status with headers, or
    an Event to hold the answer until it is set."""

    def __init__(self, secrets: list[str]):
        self.secrets = secrets
        self.got: list[dict] = []
        self.bad: list[str] = []
        self.script: list = []
        self.hold: threading.Event | None = None   # when set: every request waits for it
        self.lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    for s in receiver.secrets:
                        Webhook(s).verify(body, headers)
                    assert headers["content-type"] == "application/json"
                    event = json.loads(body)
                except (WebhookVerificationError, AssertionError, KeyError, ValueError) as e:
                    with receiver.lock:
                        receiver.bad.append(f"{e!r}: {headers} {body[:200]!r}")
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver.lock:
                    step = receiver.script.pop(0) if receiver.script else None
                    receiver.got.append({"id": headers["webhook-id"], "ts": int(headers["webhook-timestamp"]),
                                         "signature": headers["webhook-signature"], "event": event, "at": time.monotonic()})
                    receiver.lock.notify_all()
                    hold = receiver.hold
                if isinstance(step, threading.Event):
                    step.wait(60)
                elif hold is not None:
                    hold.wait(60)
                status, extra = step if isinstance(step, tuple) else (200, {})
                try:
                    self.send_response(status)
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass  # Herald was killed while the answer was held

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, pred, what: str, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        with self.lock:
            while not pred(self.got):
                left = deadline - time.monotonic()
                assert left > 0, f"{what}: receiver got {[g['event']['type'] for g in self.got]}"
                self.lock.wait(left)
            return list(self.got)

    def events(self, user: str) -> list[dict]:
        with self.lock:
            return [g["event"] for g in self.got if g["event"]["data"].get("userId") == user]

    def wait_events(self, user: str, n: int, timeout: float = 30.0) -> list[dict]:
        self.wait(lambda got: len([g for g in got if g["event"]["data"].get("userId") == user]) >= n,
                  f"{n} events of {user}", timeout)
        return self.events(user)

    def close(self):
        if self.hold:
            self.hold.set()
        self.server.shutdown()
        assert not self.bad, f"requests that did not verify: {self.bad}"


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(secrets: list[str] | None = None) -> Receiver:
        r = Receiver(secrets or [secret()])
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def hooked(*endpoints: dict, base: dict = CONFIG) -> dict:
    cfg = json.loads(json.dumps(base))
    cfg["apps"][0]["webhooks"] = list(endpoints)
    return cfg


def endpoint(r: Receiver, **extra) -> dict:
    return {"url": r.url, "secret": r.secrets[0], **extra}


def types(events: list[dict]) -> list[str]:
    """Sorted: events are not ordered (SPEC 13), and several go at once."""
    return sorted(e["type"] for e in events)


def patch(gw, user, device, nid, body):
    r = gw.me("PATCH", f"/notifications/{nid}", gw.token(user, dev=device), json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_every_notification_event_and_its_data(gateway_factory, receivers):
    every, reads = receivers(), receivers()
    gw = gateway_factory(config=hooked(endpoint(every), endpoint(reads, events=["notification.read"])))
    user = uid("u")

    created = gw.publish(user, "task-1", {"title": "one"})
    nid = created["notification"]["id"]
    [e] = every.wait_events(user, 1)
    assert e["type"] == "notification.created"
    assert set(e) == {"type", "timestamp", "data"}
    assert e["data"] == {"appId": APP, "userId": user, "seq": created["seq"], "deviceId": None,
                         "notification": created["notification"]}
    replaced = gw.publish(user, "task-1", {"title": "one again"})
    assert every.wait_events(user, 2)[1]["data"]["notification"] == replaced["notification"]

    # Unseen to read: read and seen, one seq, the device named.
    read = patch(gw, user, "phone", nid, {"readState": "read"})
    evs = every.wait_events(user, 4)[2:]
    assert types(evs) == ["notification.read", "notification.seen"]
    assert {e["data"]["seq"] for e in evs} == {read["seq"]}
    assert {e["data"]["deviceId"] for e in evs} == {"phone"}
    assert {e["data"]["notification"]["readState"] for e in evs} == {"read"}
    patch(gw, user, "phone", nid, {"readState": "unread"})
    assert types(every.wait_events(user, 5)[4:]) == ["notification.unread"]

    # Read and dismissed in one request: two events, one seq.
    both = patch(gw, user, "tablet", nid, {"readState": "read", "userActionState": "dismissed"})
    evs = every.wait_events(user, 7)[5:]
    assert types(evs) == ["notification.dismissed", "notification.read"]
    assert [e["data"]["seq"] for e in evs] == [both["seq"]] * 2
    patch(gw, user, "tablet", nid, {"userActionState": "activated"})
    assert types(every.wait_events(user, 8)[7:]) == ["notification.activated"]
    patch(gw, user, "tablet", nid, {"userActionState": "snoozed"})
    assert types(every.wait_events(user, 9)[8:]) == ["notification.snoozed"]

    # Over the WebSocket: the device of the connection.
    ws, _, _ = gw.connect(user, "watch")
    with ws:
        ws.request({"type": "update", "id": nid, "userActionState": "dismissed"})
        [e] = every.wait_events(user, 10)[9:]
        assert (e["type"], e["data"]["deviceId"]) == ("notification.dismissed", "watch")
        ws.request({"type": "delete", "id": nid})
        [e] = every.wait_events(user, 11)[10:]
    assert e["type"] == "notification.deleted"
    assert e["data"] == {"appId": APP, "userId": user, "seq": e["data"]["seq"], "deviceId": "watch", "id": nid,
                         "appNotificationId": "task-1", "reason": "deleted"}

    # read-all and seen-all: each notification's events; the app server's delete; an expiry.
    a, b = gw.publish(user, "a"), gw.publish(user, "b")
    every.wait_events(user, 13)
    r = gw.me("POST", "/notifications/seen-all", gw.token(user, dev="phone"))
    assert r.status_code == 200 and r.json()["updated"] == 2, r.text
    assert types(every.wait_events(user, 15)[13:]) == ["notification.seen"] * 2
    r = gw.me("POST", "/notifications/read-all", gw.token(user, dev="phone"))
    assert r.status_code == 200 and r.json()["updated"] == 2, r.text
    assert types(every.wait_events(user, 17)[15:]) == ["notification.read"] * 2
    assert gw.server("DELETE", f"/users/{user}/notifications/{a['notification']['id']}").status_code == 204
    [e] = every.wait_events(user, 18)[17:]
    assert (e["type"], e["data"]["deviceId"], e["data"]["reason"]) == ("notification.deleted", None, "deleted")
    gw.publish(user, "brief", ttlSeconds=1)
    evs = every.wait_events(user, 20)[18:]
    assert types(evs) == ["notification.created", "notification.deleted"]
    [gone] = [e for e in evs if e["type"] == "notification.deleted"]
    assert (gone["data"]["reason"], gone["data"]["deviceId"], gone["data"]["appNotificationId"]) == ("expired", None, "brief")

    # The second endpoint took only what it asked for; each event has one id everywhere.
    reads.wait_events(user, 4)   # the PATCH, read with dismissed, and read-all's two
    assert set(types(reads.events(user))) == {"notification.read"}
    ids = {g["event"]["data"]["seq"]: g["id"] for g in reads.got}
    assert all(g["id"] == ids[g["event"]["data"]["seq"]] for g in every.got if g["event"]["type"] == "notification.read")
    assert len({g["id"] for g in every.got}) == len(every.got), "unique per event"
    wait_until(lambda: gw.metric('herald_webhook_sent_total{outcome="delivered"}') == len(every.got) + len(reads.got),
               "the deliveries counted")
    assert b  # published above, read by read-all


def test_a_wake_and_a_save_of_preferences_send_their_events(gateway_factory, receivers):
    """notification.woke alone when a snooze ends (Herald's own change, so
    no device), and preferences.updated naming the device that saved, or
    none for the app's server (SPEC 11-13)."""
    every = receivers()
    gw = gateway_factory(config=hooked(endpoint(every)))
    user = uid("u")
    nid = gw.publish(user, "later")["notification"]["id"]
    until = time.time() + 3
    patch(gw, user, "phone", nid, {"userActionState": "snoozed", "snoozedUntil": iso(until)})
    evs = every.wait_events(user, 3, timeout=30)[1:]
    assert types(evs) == ["notification.snoozed", "notification.woke"], evs
    woke = next(e for e in evs if e["type"] == "notification.woke")
    n = woke["data"]["notification"]
    assert (woke["data"]["deviceId"], n["userActionState"], n["readState"], n["seenState"], n["snoozedUntil"]) == \
        (None, "noInteraction", "unread", "unseen", None)

    r = gw.me("PUT", "/preferences", gw.token(user, dev="tablet"), json={"groups": {"ads": {"push": False}}})
    assert r.status_code == 200, r.text
    [e] = every.wait_events(user, 4)[3:]
    assert e["type"] == "preferences.updated"
    assert e["data"] == {"appId": APP, "userId": user, "seq": r.json()["seq"], "deviceId": "tablet",
                         "preferences": r.json()["preferences"]}
    r = gw.server("PUT", f"/users/{user}/preferences", json={"groups": {}})
    assert r.status_code == 200, r.text
    [e] = every.wait_events(user, 5)[4:]
    assert (e["type"], e["data"]["deviceId"], e["data"]["preferences"]) == ("preferences.updated", None, r.json()["preferences"])


def test_a_dead_push_handle_is_push_unregistered(gateway_factory, receivers, tmp_path):
    hook = receivers()
    with APNsStandIn(tmp_path / "apns") as apns:
        a = apns.describe()
        cfg = hooked(endpoint(hook, events=["push.unregistered"]))
        cfg["apps"][0]["push"] = {"apns": {"teamId": a["teamId"], "keyId": a["keyId"], "keyFile": a["keyFile"], "topic": a["topic"],
                                           "endpoint": apns.url, "developmentEndpoint": apns.url, "caFile": apns.ca_file}}
        gw = gateway_factory(config=cfg, store="sqlite:herald.db")
        user, token = uid("u"), f"{random.getrandbits(128):032x}{4:032x}"
        r = gw.me("PUT", "/devices/phone", gw.token(user), json={"platform": "ios", "push": {"service": "apns", "token": token}})
        assert r.status_code == 200, r.text
        apns.script(Outcome(410, "Unregistered"), key=token)
        gw.publish(user)
        [e] = hook.wait_events(user, 1)
    assert e["type"] == "push.unregistered"
    assert e["data"]["service"] == "apns"
    assert (e["data"]["seq"], e["data"]["deviceId"]) == (None, None)
    listed = gw.devices(user)["phone"]
    assert e["data"]["device"]["deviceId"] == "phone" and e["data"]["device"]["push"] is None
    assert {k: v for k, v in e["data"]["device"].items() if k != "lastSeenAt"} == {k: v for k, v in listed.items() if k != "lastSeenAt"}


def test_while_rotating_every_secret_signs_and_a_reload_takes_the_new_list(gateway_factory, receivers):
    new, old = secret(), secret()
    hook = receivers([new, old])   # verifies each request with both
    gw = gateway_factory(config=hooked({"url": hook.url, "secrets": [new, old]}))
    user = uid("u")
    gw.publish(user)
    [got] = hook.wait(lambda g: len(g) == 1, "the event")
    assert len(got["signature"].split(" ")) == 2
    hook.secrets = [new]
    assert "config reloaded" in reload(gw, hooked({"url": hook.url, "secret": new}))
    gw.publish(user)
    [_, got] = hook.wait(lambda g: len(g) == 2, "the event after the reload")
    assert len(got["signature"].split(" ")) == 1
    assert new not in gw.stderr_tail(100_000) and old not in gw.stderr_tail(100_000), "secrets never logged"


def test_a_failed_delivery_is_retried_no_sooner_than_retry_after_with_the_same_id(gateway_factory, receivers):
    hook = receivers()
    hook.script = [(503, {"Retry-After": "7"})]
    gw = gateway_factory(config=hooked(endpoint(hook)), store="sqlite:herald.db")
    gw.publish(uid("u"))
    first, second = hook.wait(lambda g: len(g) == 2, "the event and its retry", timeout=40)
    assert first["id"] == second["id"] and first["event"] == second["event"]
    assert second["at"] - first["at"] >= 7 - 0.01, "Retry-After (7 s) is later than the 5 s backoff's most"
    assert second["ts"] >= first["ts"] + 6, "each attempt has its own timestamp"
    wait_until(lambda: gw.metric('herald_webhook_sent_total{outcome="delivered"}') == 1, "delivered")
    assert gw.metric('herald_webhook_sent_total{outcome="retried"}') == 1
    wait_until(lambda: gw.metric("herald_webhook_pending") == 0, "nothing pending")


def test_a_hung_receiver_delays_neither_live_delivery_nor_another_endpoint(gateway_factory, receivers):
    hung, fine = receivers(), receivers()
    hung.hold = threading.Event()
    gw = gateway_factory(config=hooked(endpoint(hung), endpoint(fine)), store="sqlite:herald.db")
    user = uid("u")
    ws, _, _ = gw.connect(user, "phone")
    with ws:
        for i in range(30):  # more than the hung endpoint takes in flight
            gw.publish(user, f"n{i}")
        ws.expect_changes(30)
        fine.wait_events(user, 30, timeout=10)
    hung.wait(lambda g: len(g) >= 1, "the hung receiver holding requests")
    assert len(hung.got) <= 16, "a bounded number in flight to one endpoint"
    hung.hold.set()
    hung.wait_events(user, 30)


def test_an_event_acknowledged_before_a_kill_arrives_after_the_restart(herald_bin, tmp_path, receivers):
    hook = receivers()
    held = threading.Event()
    hook.script = [held]
    cfg = hooked(endpoint(hook))
    gw = Gateway(herald_bin, tmp_path / "gw", cfg, store="sqlite:herald.db").start()
    try:
        user = uid("u")
        seq = gw.publish(user)["seq"]   # 2xx: the change is durable, its event with it
        [first] = hook.wait(lambda g: len(g) == 1, "the event, its answer held")
        gw.kill()
        held.set()
    finally:
        gw.kill()
    again = Gateway(herald_bin, tmp_path / "gw", cfg, store="sqlite:herald.db").start()
    try:
        [_, second] = hook.wait(lambda g: len(g) == 2, "the event sent again after the restart")
        assert second["id"] == first["id"] and second["event"]["data"]["seq"] == seq
        wait_until(lambda: again.metric("herald_webhook_pending") == 0, "nothing pending")
    finally:
        assert again.terminate(10) == 0, again.stderr_tail()


@pytest.mark.skipif(not (os.environ.get("HERALD_TEST_REDIS_URL") and os.environ.get("HERALD_TEST_POSTGRES_URL")),
                    reason="no test PostgreSQL and Redis (scripts/test-servers starts them)")
def test_two_nodes_on_postgres_send_each_event_once(herald_bin, tmp_path, receivers, store_url):  # noqa: F811
    hook = receivers()
    cfg = hooked(endpoint(hook))
    bus = ["--bus", f"{os.environ['HERALD_TEST_REDIS_URL']}/{random.randrange(1, 1 << 30)}", "--partitions", "2"]
    nodes = [Gateway(herald_bin, tmp_path / f"n{i}", cfg, store=store_url, extra_args=bus).start() for i in range(2)]
    try:
        user = uid("u")
        seqs = [nodes[i % 2].publish(user, f"n{i}")["seq"] for i in range(20)]
        hook.wait_events(user, 20)
        for g in nodes:
            wait_until(lambda: g.metric("herald_webhook_pending") == 0, "nothing pending")
        assert sorted(e["data"]["seq"] for e in hook.events(user)) == sorted(seqs), "each once"
        assert sum(g.metric('herald_webhook_sent_total{outcome="delivered"}') for g in nodes) == 20
    finally:
        for g in nodes:
            assert g.terminate(10) == 0, g.stderr_tail()


@pytest.mark.parametrize("hook, says", [
    ({"url": "ftp://example.com/h", "secret": "S"}, "webhooks[0].url must be an http:// or https:// URL"),
    ({"url": "https://", "secret": "S"}, "webhooks[0].url must be an http:// or https:// URL"),
    ({"url": "https://example.com/h", "secret": "whsec_c2hvcnQ="}, "a secret must be whsec_ and the base64 of 24 to 64"),
    ({"url": "https://example.com/h", "secret": "RAW"}, "a secret must be whsec_"),
    ({"url": "https://example.com/h", "secret": "S", "secrets": ["S"]}, "needs exactly one of secret and secrets"),
    ({"url": "https://example.com/h", "secret": "S", "events": ["notification.opened"]}, 'unknown event type "notification.opened"'),
    ({"url": "https://example.com/h", "secret": "S", "retries": 3}, 'unknown key "retries"'),
    ({"url": "https://example.com/h", "secret": "S", "caFile": "/nonexistent/ca.pem"}, "caFile /nonexistent/ca.pem cannot be read"),
])
def test_a_bad_webhook_value_stops_the_start_with_one_line_and_no_secret(tmp_path, hook, says):
    s = secret()
    hook = json.loads(json.dumps(hook).replace('"S"', json.dumps(s)).replace('"RAW"', json.dumps(s[6:])))
    path = tmp_path / "herald.json"
    path.write_text(json.dumps(hooked(hook)))
    r = subprocess.run([herald_binary(), "serve", "--store", "memory", "--port", "0", "--config", path],
                       capture_output=True, timeout=30)
    lines = r.stderr.decode().splitlines()
    assert (r.returncode, len(lines)) == (2, 1), r.stderr
    assert says in lines[0] and f"app {APP}" in lines[0], lines[0]
    assert s not in lines[0] and s[6:] not in lines[0]
