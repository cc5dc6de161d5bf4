"""The push stand-ins checked against independent clients (httpx over HTTP/2,
PyJWT, google-auth, pywebpush and py-vapid, http-ece), so that a stand-in
that took anything could not make the gateway look right: each takes what the
real service takes and refuses what it refuses."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import google.auth.transport.requests
import h2.connection
import h2.events
import google.oauth2.service_account
import http_ece
import httpx
import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from py_vapid import Vapid
from pywebpush import WebPusher, WebPushException, webpush

from push_standins import SCOPE, APNsStandIn, FCMStandIn, Outcome, WebPushStandIn, b64url, pem_private, public_point

TOKEN = "ab" * 32
ALERT = json.dumps({"aps": {"alert": {"title": "t", "body": "b"}}}).encode()
TAP = json.dumps({"aps": {"content-available": 1}}).encode()
QUIET = 0.3  # how long an answer that must not come is watched for
STANDINS = Path(__file__).with_name("push_standins.py")


@pytest.fixture
def apns(tmp_path):
    with APNsStandIn(tmp_path / "apns") as s:
        yield s


@pytest.fixture
def fcm(tmp_path):
    with FCMStandIn(tmp_path / "fcm") as s:
        yield s


@pytest.fixture
def web(tmp_path):
    with WebPushStandIn(tmp_path / "web") as s:
        yield s


def trusting(s) -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # a CA bundle named in the environment would win over `verify`
    session.verify = s.ca_file
    return session


# ---------------------------------------------------------------- APNs

def provider_token(s: APNsStandIn, *, key: str | None = None, iat: float | None = None, iss: str | None = None,
                   kid: str | None = None, alg: str = "ES256") -> str:
    """A provider token as Apple describes it, signed with the .p8 file the stand-in wrote."""
    claims = {"iss": iss or s.team_id, "iat": int(time.time() if iat is None else iat)}
    return jwt.encode(claims, key or s.key_file.read_text(), algorithm=alg, headers={"kid": kid or s.key_id})


# One provider token per stand-in: APNs refuses a new one on a connection within 20 minutes,
# and ES256 signatures differ each time, so signing again makes a new token.
_provider_tokens: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def apns_push(client, s: APNsStandIn, token: str = TOKEN, body: bytes = ALERT, method: str = "POST",
              provider: str | None = None, **headers):
    """One push; header keyword arguments (underscores for dashes) override the defaults, None drops one."""
    provider = provider or _provider_tokens.setdefault(s, provider_token(s))
    h = {"authorization": f"bearer {provider}", "apns-topic": s.topic, "apns-push-type": "alert",
         "apns-priority": "10", "apns-expiration": "0"}
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return client.request(method, f"{s.url}/3/device/{token}", headers={k: v for k, v in h.items() if v is not None},
                          content=body)


def held_then_released(s, send):
    """Sends with `s` holding its answers: the request is taken and no answer
    comes until release_held(); answers the one that comes then."""
    s.hold = True
    got = {}
    client = threading.Thread(target=lambda: got.update(r=send()))
    client.start()
    [held] = s.wait_for(1)
    client.join(QUIET)
    assert held["held"] and "r" not in got, "a held answer was sent"
    s.release_held()
    client.join(10)
    return got["r"]


def h2_client(s, **kw) -> httpx.Client:
    return httpx.Client(http2=True, verify=ssl.create_default_context(cafile=s.ca_file), **kw)


def test_apns_takes_a_push_signed_with_its_p8_over_http2(apns):
    assert apns.key_file.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    with h2_client(apns) as c:
        r = apns_push(c, apns, apns_collapse_id="n1")
        assert (r.status_code, r.http_version) == (200, "HTTP/2"), r.text
        assert len(r.headers["apns-id"]) == 36
        apns_id = "123e4567-e89b-12d3-a456-426614174000"
        r = apns_push(c, apns, token="0" * 200, body=TAP, apns_push_type="background", apns_priority="5", apns_id=apns_id)
        assert (r.status_code, r.headers["apns-id"]) == (200, apns_id), r.text
    first, tap = apns.accepted
    assert (first["token"], first["collapseId"], first["payload"], first["connection"], first["held"]) == (
        TOKEN, "n1", json.loads(ALERT), 1, False)
    assert first["headers"]["apns-topic"] == apns.topic and first["at"] <= tap["at"] <= time.time()
    assert tap["headers"]["apns-push-type"] == "background" and tap["payload"] == {"aps": {"content-available": 1}}
    assert apns.refused == []


APNS_REFUSALS = {
    "no provider token": (lambda s: {"authorization": None}, 403, "MissingProviderToken"),
    "not a bearer token": (lambda s: {"authorization": f"basic {provider_token(s)}"}, 403, "InvalidProviderToken"),
    "another key": (lambda s: {"provider": provider_token(s, key=pem_private(ec.generate_private_key(ec.SECP256R1())))},
                    403, "InvalidProviderToken"),
    "another key id": (lambda s: {"provider": provider_token(s, kid="OTHERKEY99")}, 403, "InvalidProviderToken"),
    "another team": (lambda s: {"provider": provider_token(s, iss="OTHERTEAM9")}, 403, "InvalidProviderToken"),
    "HS256": (lambda s: {"provider": provider_token(s, key="s" * 32, alg="HS256")}, 403, "InvalidProviderToken"),
    "issued over an hour ago": (lambda s: {"provider": provider_token(s, iat=time.time() - 3601)}, 403, "ExpiredProviderToken"),
    "issued in the future": (lambda s: {"provider": provider_token(s, iat=time.time() + 120)}, 403, "InvalidProviderToken"),
    "device token not hex": (lambda s: {"token": "zz" * 32}, 400, "BadDeviceToken"),
    "device token too short": (lambda s: {"token": "ab" * 31}, 400, "BadDeviceToken"),
    "device token too long": (lambda s: {"token": "a" * 202}, 400, "BadDeviceToken"),
    "no topic": (lambda s: {"apns_topic": None}, 400, "MissingTopic"),
    "another app's topic": (lambda s: {"apns_topic": "com.example.other"}, 400, "TopicDisallowed"),
    "no push type": (lambda s: {"apns_push_type": None}, 400, "InvalidPushType"),
    "unknown push type": (lambda s: {"apns_push_type": "banner"}, 400, "InvalidPushType"),
    "background at priority 10": (lambda s: {"apns_push_type": "background", "body": TAP}, 400, "BadPriority"),
    "background at the default priority": (lambda s: {"apns_push_type": "background", "apns_priority": None, "body": TAP},
                                           400, "BadPriority"),
    "priority 7": (lambda s: {"apns_priority": "7"}, 400, "BadPriority"),
    "expiration not a number": (lambda s: {"apns_expiration": "soon"}, 400, "BadExpirationDate"),
    "collapse id over 64 bytes": (lambda s: {"apns_collapse_id": "c" * 65}, 400, "BadCollapseId"),
    "apns-id not a UUID": (lambda s: {"apns_id": "42"}, 400, "BadMessageId"),
    "payload over 4096 bytes": (lambda s: {"body": json.dumps({"aps": {"alert": "x" * 4096}}).encode()}, 413, "PayloadTooLarge"),
    "empty payload": (lambda s: {"body": b""}, 400, "PayloadEmpty"),
    "payload without aps": (lambda s: {"body": b'{"herald": {}}'}, 400, "BadPayload"),
    "tap without content-available": (lambda s: {"apns_push_type": "background", "apns_priority": "5",
                                                 "body": b'{"aps": {}}'}, 400, "BadPayload"),
    "GET": (lambda s: {"method": "GET"}, 405, "MethodNotAllowed"),
}


@pytest.mark.parametrize("case", APNS_REFUSALS)
def test_apns_refuses_what_apple_refuses(apns, case):
    change, status, reason = APNS_REFUSALS[case]
    with h2_client(apns) as c:
        r = apns_push(c, apns, **change(apns))
    assert (r.status_code, r.json()["reason"]) == (status, reason)
    assert r.headers["apns-id"]
    assert apns.accepted == [] and [(x["status"], x["reason"]) for x in apns.refused] == [(status, reason)]


def test_apns_speaks_http2_only(apns):
    with httpx.Client(http2=False, verify=ssl.create_default_context(cafile=apns.ca_file)) as c:
        r = apns_push(c, apns)
    assert (r.status_code, r.http_version) == (505, "HTTP/1.1"), "a client without HTTP/2 fails"
    r = trusting(apns).post(f"{apns.url}/3/device/{TOKEN}", data=ALERT,
                            headers={"authorization": f"bearer {provider_token(apns)}", "apns-topic": apns.topic})
    assert r.status_code == 505
    assert apns.accepted == []


def test_apns_refuses_a_new_provider_token_within_20_minutes_on_one_connection(apns):
    first, renewed = provider_token(apns, iat=time.time() - 60), provider_token(apns)
    with h2_client(apns) as c:
        assert apns_push(c, apns, provider=first).status_code == 200
        r = apns_push(c, apns, provider=renewed)
        assert (r.status_code, r.json()["reason"]) == (429, "TooManyProviderTokenUpdates")
        assert apns_push(c, apns, provider=first).status_code == 200
    with h2_client(apns) as c:
        assert apns_push(c, apns, provider=renewed).status_code == 200, "a new connection may start with a new token"
    assert apns.connections == 2


def test_apns_multiplexes_concurrent_streams_and_holds_their_answers(apns):
    provider = provider_token(apns)
    n = 50

    async def run():
        async with httpx.AsyncClient(http2=True, verify=ssl.create_default_context(cafile=apns.ca_file), timeout=30) as c:
            pending = [asyncio.ensure_future(apns_push(c, apns, token=f"{i:064x}", provider=provider)) for i in range(n)]
            await asyncio.to_thread(apns.wait_for, n)
            done, _ = await asyncio.wait(pending, timeout=QUIET)
            assert not done, "held answers were sent"
            apns.release_held()
            return await asyncio.gather(*pending)

    apns.hold = True
    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200] * n
    assert apns.connections == 1, "one connection carried every stream"
    assert {a["connection"] for a in apns.accepted} == {1}
    assert all(a["held"] for a in apns.accepted)


class H2Client:
    """HTTP/2 frames by hand (the h2 library as a client), to see what is answered while streams are held:
    httpx's client reads a held stream's connection under a lock that keeps other streams' answers back."""

    def __init__(self, s: APNsStandIn):
        self.s = s
        ctx = ssl.create_default_context(cafile=s.ca_file)
        ctx.set_alpn_protocols(["h2"])
        self.sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", s.port)), server_hostname="127.0.0.1")
        self.sock.settimeout(10)
        self.conn = h2.connection.H2Connection()
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.statuses: dict[int, int] = {}

    def post(self, token: str, provider: str) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "POST"), (":scheme", "https"), (":authority", f"127.0.0.1:{self.s.port}"),
                                     (":path", f"/3/device/{token}"), ("authorization", f"bearer {provider}"),
                                     ("apns-topic", self.s.topic), ("apns-push-type", "alert")])
        self.conn.send_data(sid, ALERT, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        return sid

    def read_until_answered(self, *sids: int) -> None:
        while not all(sid in self.statuses for sid in sids):
            for ev in self.conn.receive_data(self.sock.recv(65536)):
                if isinstance(ev, h2.events.ResponseReceived):
                    self.statuses[ev.stream_id] = int(dict(ev.headers)[b":status"])
            self.sock.sendall(self.conn.data_to_send())


def test_apns_answers_new_streams_while_others_are_held(apns):
    provider = provider_token(apns)
    client = H2Client(apns)
    apns.hold = True
    held = [client.post(f"{i:064x}", provider) for i in range(5)]
    apns.wait_for(5)
    apns.hold = False
    answered = client.post(TOKEN, provider)
    client.read_until_answered(answered)
    assert client.statuses == {answered: 200}, "only the stream that was not held is answered"
    apns.release_held()
    client.read_until_answered(*held)
    assert [client.statuses[sid] for sid in held] == [200] * 5
    client.sock.close()


def test_a_held_stream_whose_client_went_away_is_dropped(apns):
    gone, stays = H2Client(apns), H2Client(apns)
    apns.hold = True
    gone.post(TOKEN, provider_token(apns))
    held = stays.post(TOKEN, provider_token(apns))
    apns.wait_for(2)
    gone.sock.close()
    deadline = time.monotonic() + 10
    while len(apns.server.live) > 1:  # until the stand-in saw the connection end
        assert time.monotonic() < deadline, "the closed connection was not noticed"
        time.sleep(0.01)
    apns.release_held()
    stays.read_until_answered(held)
    assert stays.statuses == {held: 200}
    stays.sock.close()


def test_apns_answers_scripted_outcomes(apns):
    other = "cd" * 32
    with h2_client(apns) as c:
        apns.script(Outcome(429, "TooManyRequests", 3), key=other)
        apns.script(Outcome(410, "Unregistered"), Outcome(503, "ServiceUnavailable", 1), Outcome(400, "BadDeviceToken"),
                    Outcome(403, "ExpiredProviderToken"))
        r = apns_push(c, apns, token=other)
        assert (r.status_code, r.json()["reason"], r.headers["retry-after"]) == (429, "TooManyRequests", "3")
        r = apns_push(c, apns)
        assert (r.status_code, r.json()["reason"]) == (410, "Unregistered")
        assert abs(r.json()["timestamp"] / 1000 - time.time()) < 60
        r = apns_push(c, apns)
        assert (r.status_code, r.json()["reason"], r.headers["retry-after"]) == (503, "ServiceUnavailable", "1")
        assert apns_push(c, apns).json() == {"reason": "BadDeviceToken"}
        assert apns_push(c, apns).json() == {"reason": "ExpiredProviderToken"}
        assert apns_push(c, apns, token=other).status_code == 200, "the script ran out"
        apns.default_outcome = Outcome(503)
        assert [apns_push(c, apns).json()["reason"] for _ in range(2)] == ["ServiceUnavailable"] * 2
    assert [a["token"] for a in apns.accepted] == [other]


def test_a_key_limited_to_one_environment_is_refused_in_the_other(apns, tmp_path):
    def push(s: APNsStandIn, provider: str):
        with h2_client(s) as c:  # a connection per token: APNs refuses a second one on a connection within 20 minutes
            return apns_push(c, s, provider=provider)
    with APNsStandIn(tmp_path / "sandbox", environment="development", team=apns) as sandbox:
        dev_file = apns.add_key("DEVKEY0001", environment="development")
        assert dev_file.read_text().startswith("-----BEGIN PRIVATE KEY-----")
        dev_token = provider_token(apns, key=dev_file.read_text(), kid="DEVKEY0001")
        r = push(apns, dev_token)
        assert (r.status_code, r.json()) == (403, {"reason": "BadEnvironmentKeyInToken"})
        assert push(sandbox, dev_token).status_code == 200
        # The team's key serves both until it is limited to one.
        team = provider_token(apns)
        assert push(sandbox, team).status_code == 200
        apns.limit_key(apns.key_id, "production")
        assert push(apns, team).status_code == 200
        r = push(sandbox, team)
        assert (r.status_code, r.json()) == (403, {"reason": "BadEnvironmentKeyInToken"})
        other = provider_token(apns, key=pem_private(ec.generate_private_key(ec.SECP256R1())).decode(), kid="NOTOURKEY1")
        assert push(apns, other).json() == {"reason": "InvalidProviderToken"}
        assert [a["keyId"] for a in sandbox.accepted] == ["DEVKEY0001", apns.key_id]
        assert [a["keyId"] for a in apns.accepted] == [apns.key_id]


# ---------------------------------------------------------------- FCM

def fcm_assertion(sa: dict, *, key=None, now: float | None = None, lifetime: int = 3600, **claims) -> str:
    now = int(time.time() if now is None else now)
    body = {"iss": sa["client_email"], "scope": SCOPE, "aud": sa["token_uri"], "iat": now, "exp": now + lifetime, **claims}
    return jwt.encode(body, key or sa["private_key"], algorithm="RS256", headers={"kid": sa["private_key_id"]})


def fcm_grant(session, sa: dict, assertion: str, grant_type: str = "urn:ietf:params:oauth:grant-type:jwt-bearer"):
    return session.post(sa["token_uri"], data={"grant_type": grant_type, "assertion": assertion})


def fcm_send(session, s: FCMStandIn, access: str | None, message: dict, **extra):
    headers = {"Authorization": f"Bearer {access}"} if access else {}
    return session.post(f"{s.url}/v1/projects/{s.project_id}/messages:send", json={"message": message, **extra},
                        headers=headers)


MESSAGE = {"token": "fcm-token-1", "data": {"cursor": "1", "op": "upsert"},
           "android": {"priority": "high", "collapse_key": "n1", "ttl": "60s"}}


def test_fcm_takes_google_auths_grant_and_a_data_message(fcm):
    sa = json.loads(fcm.service_account_file.read_text())
    assert sa["type"] == "service_account" and sa["token_uri"] == f"{fcm.url}/token"
    credentials = google.oauth2.service_account.Credentials.from_service_account_file(
        str(fcm.service_account_file), scopes=[SCOPE])
    refresher = google.auth.transport.requests.Request(trusting(fcm))
    session = google.auth.transport.requests.AuthorizedSession(credentials, auth_request=refresher)
    session.trust_env, session.verify = False, fcm.ca_file
    url = f"{fcm.url}/v1/projects/{sa['project_id']}/messages:send"
    r = session.post(url, json={"message": MESSAGE})
    assert r.status_code == 200, r.text
    assert r.json()["name"].startswith(f"projects/{fcm.project_id}/messages/")
    assert fcm.token_requests == 1 and credentials.token.startswith("ya29.")
    [m] = fcm.accepted
    assert (m["token"], m["message"], m["held"]) == ("fcm-token-1", MESSAGE, False)
    fcm.expire_access_tokens()
    assert session.post(url, json={"message": MESSAGE}).status_code == 200, "google-auth renews on 401"
    assert fcm.token_requests == 2 and len(fcm.accepted) == 2
    assert [x["status"] for x in fcm.refused] == [401]


def test_fcm_grants_a_pyjwt_assertion_for_the_written_key(fcm):
    sa = json.loads(fcm.service_account_file.read_text())
    session = trusting(fcm)
    r = fcm_grant(session, sa, fcm_assertion(sa))
    assert r.status_code == 200, r.text
    assert r.json()["expires_in"] == 3599 and r.json()["token_type"] == "Bearer"
    assert fcm_send(session, fcm, r.json()["access_token"], MESSAGE).status_code == 200


FCM_GRANT_REFUSALS = {
    "another key": (lambda sa: fcm_assertion(sa, key=pem_private(rsa.generate_private_key(public_exponent=65537, key_size=2048))),
                    "invalid_grant"),
    "another issuer": (lambda sa: fcm_assertion(sa, iss="someone@else.iam.gserviceaccount.com"), "invalid_grant"),
    "another audience": (lambda sa: fcm_assertion(sa, aud="https://example.com/token"), "invalid_grant"),
    "expired": (lambda sa: fcm_assertion(sa, now=time.time() - 7200), "invalid_grant"),
    "living over an hour": (lambda sa: fcm_assertion(sa, lifetime=3601), "invalid_grant"),
    "without the messaging scope": (lambda sa: fcm_assertion(sa, scope="https://www.googleapis.com/auth/cloud-platform"),
                                    "invalid_scope"),
}


@pytest.mark.parametrize("case", FCM_GRANT_REFUSALS)
def test_fcm_refuses_bad_assertions(fcm, case):
    make, error = FCM_GRANT_REFUSALS[case]
    sa = json.loads(fcm.service_account_file.read_text())
    r = fcm_grant(trusting(fcm), sa, make(sa))
    assert (r.status_code, r.json()["error"]) == (400, error), r.text
    assert fcm.access_tokens == {}


def test_fcm_refuses_another_grant_type(fcm):
    sa = json.loads(fcm.service_account_file.read_text())
    r = fcm_grant(trusting(fcm), sa, fcm_assertion(sa), grant_type="client_credentials")
    assert (r.status_code, r.json()["error"]) == (400, "unsupported_grant_type")


@pytest.fixture
def fcm_access(fcm):
    sa = json.loads(fcm.service_account_file.read_text())
    session = trusting(fcm)
    return session, fcm_grant(session, sa, fcm_assertion(sa)).json()["access_token"]


FCM_MESSAGE_REFUSALS = {
    "a number in data": {**MESSAGE, "data": {"cursor": 1}},
    "reserved key from": {**MESSAGE, "data": {"from": "x"}},
    "reserved key google.": {**MESSAGE, "data": {"google.sent_time": "1"}},
    "reserved key gcm": {**MESSAGE, "data": {"gcm.n.e": "1"}},
    "data over 4096 bytes": {**MESSAGE, "data": {"blob": "x" * 4096}},
    "an unknown field": {**MESSAGE, "priority": "high"},
    "an unknown android field": {**MESSAGE, "android": {"time_to_live": 60}},
    "no token": {"data": {"a": "b"}},
    "a token and a topic": {**MESSAGE, "topic": "news"},
    "priority urgent": {**MESSAGE, "android": {"priority": "urgent"}},
    "ttl without unit": {**MESSAGE, "android": {"ttl": "60"}},
    "ttl over 4 weeks": {**MESSAGE, "android": {"ttl": f"{28 * 86400 + 1}s"}},
}


@pytest.mark.parametrize("case", FCM_MESSAGE_REFUSALS)
def test_fcm_refuses_invalid_messages(fcm, fcm_access, case):
    session, access = fcm_access
    r = fcm_send(session, fcm, access, FCM_MESSAGE_REFUSALS[case])
    err = r.json()["error"]
    assert (r.status_code, err["status"], err["details"][0]["errorCode"]) == (400, "INVALID_ARGUMENT", "INVALID_ARGUMENT")
    assert fcm.accepted == []


def test_fcm_takes_camel_case_names_and_validate_only(fcm, fcm_access):
    session, access = fcm_access
    camel = {"token": "t", "android": {"collapseKey": "c", "directBootOk": True}}
    assert fcm_send(session, fcm, access, camel).status_code == 200
    assert fcm_send(session, fcm, access, MESSAGE, validateOnly=True).status_code == 200
    assert [m["token"] for m in fcm.accepted] == ["t"], "validate_only delivers nothing"


def test_fcm_refuses_missing_and_expired_access_tokens(tmp_path):
    with FCMStandIn(tmp_path, expires_in=0) as s:
        session = trusting(s)
        sa = json.loads(s.service_account_file.read_text())
        r = fcm_grant(session, sa, fcm_assertion(sa))
        assert r.json()["expires_in"] == 0
        for access in [None, "ya29.forged", r.json()["access_token"]]:
            r = fcm_send(session, s, access, MESSAGE)
            assert (r.status_code, r.json()["error"]["status"]) == (401, "UNAUTHENTICATED"), access
        assert s.accepted == []


def test_fcm_answers_scripted_outcomes_and_holds(fcm, fcm_access):
    session, access = fcm_access
    fcm.script(Outcome(404), Outcome(400), Outcome(429, retry_after=7), Outcome(503), Outcome(403), Outcome(401))
    answers = [fcm_send(session, fcm, access, MESSAGE) for _ in range(6)]
    assert [(r.status_code, r.json()["error"]["status"], r.json()["error"]["details"][0]["errorCode"]) for r in answers] == [
        (404, "NOT_FOUND", "UNREGISTERED"), (400, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
        (429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"), (503, "UNAVAILABLE", "UNAVAILABLE"),
        (403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"), (401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR")]
    assert "registration token" in answers[1].json()["error"]["message"]
    assert answers[2].headers["retry-after"] == "7"
    assert answers[4].json()["error"]["message"] == "SenderId mismatch"
    r = held_then_released(fcm, lambda: fcm_send(session, fcm, access, MESSAGE))
    assert r.status_code == 200 and r.json()["name"]


# ---------------------------------------------------------------- Web Push

@pytest.fixture
def vapid(tmp_path) -> tuple[Path, str]:
    """An application server's VAPID key file and its public key as browsers take it."""
    key = ec.generate_private_key(ec.SECP256R1())
    f = tmp_path / "vapid.pem"
    f.write_bytes(pem_private(key))
    return f, b64url(public_point(key))


def test_web_push_takes_what_pywebpush_sends(web, vapid):
    vapid_file, public = vapid
    sub = web.new_subscription(application_server_key=public)
    data = json.dumps({"title": "Hello", "herald": {"cursor": 1}})
    r = webpush(sub, data=data, vapid_private_key=str(vapid_file), vapid_claims={"sub": "mailto:ops@example.com"}, ttl=60,
                headers={"Urgency": "high", "Topic": "n1"}, requests_session=trusting(web))
    assert r.status_code == 201 and r.headers["location"].startswith(web.url) and r.headers["ttl"] == "60"
    [m] = web.accepted
    assert m["plaintext"] == data.encode() and m["json"] == json.loads(data)
    assert m["subscription"] == sub["endpoint"].rsplit("/", 1)[1]
    assert (m["headers"]["ttl"], m["headers"]["urgency"], m["headers"]["topic"]) == ("60", "high", "n1")
    stranger = web.new_subscription()  # bound to no application server key
    r = webpush(stranger, data="not json", vapid_private_key=str(vapid_file), vapid_claims={"sub": "https://example.com"},
                ttl=0, requests_session=trusting(web))
    assert r.status_code == 201 and web.accepted[1]["plaintext"] == b"not json" and web.accepted[1]["json"] is None
    assert web.refused == []


def web_post(s: WebPushStandIn, sub: dict, vapid_file: Path, *, data: bytes = b'{"a": 1}', claims: dict | None = None,
             body: bytes | None = None, **headers) -> requests.Response:
    """A push built piece by piece (pywebpush encrypts, py-vapid signs), for changing one piece."""
    encrypted = WebPusher(sub).encode(data, "aes128gcm")["body"] if body is None else body
    claims = {"aud": s.url, "sub": "mailto:ops@example.com", "exp": int(time.time()) + 3600, **(claims or {})}
    vapid_key = Vapid.from_file(str(vapid_file))
    h = {"TTL": "60", "Content-Encoding": "aes128gcm", **vapid_key.sign(claims)}
    h.update({k.replace("_", "-"): v for k, v in headers.items()})
    return trusting(s).post(sub["endpoint"], data=encrypted, headers={k: v for k, v in h.items() if v is not None})


def forged_vapid(vapid_file: Path, claims: dict) -> str:
    """A VAPID header py-vapid would refuse to make."""
    key = Vapid.from_file(str(vapid_file))
    return f"vapid t={jwt.encode(claims, vapid_file.read_text(), algorithm='ES256')}, k={b64url(public_point(key.private_key))}"


WEB_REFUSALS = {
    "tampered ciphertext": (lambda s, sub, f: {"body": flip_last_byte(WebPusher(sub).encode(b"{}", "aes128gcm")["body"])}, 400),
    "several records": (lambda s, sub, f: {"body": several_records(sub)}, 400),
    "no VAPID": (lambda s, sub, f: {"Authorization": None}, 401),
    "VAPID for another origin": (lambda s, sub, f: {"claims": {"aud": "https://push.example.net"}}, 401),
    "VAPID expired": (lambda s, sub, f: {"claims": {"exp": int(time.time()) - 10}}, 401),
    "VAPID over 24 hours ahead": (lambda s, sub, f: {"Authorization": forged_vapid(
        f, {"aud": s.url, "sub": "mailto:ops@example.com", "exp": int(time.time()) + 25 * 3600})}, 401),
    "VAPID sub not a URI": (lambda s, sub, f: {"Authorization": forged_vapid(
        f, {"aud": s.url, "sub": "ops@example.com", "exp": int(time.time()) + 3600})}, 401),
    "no TTL": (lambda s, sub, f: {"TTL": None}, 400),
    "negative TTL": (lambda s, sub, f: {"TTL": "-1"}, 400),
    "aesgcm": (lambda s, sub, f: {"Content-Encoding": "aesgcm"}, 415),
    "bad Urgency": (lambda s, sub, f: {"Urgency": "urgent"}, 400),
    "Topic over 32 characters": (lambda s, sub, f: {"Topic": "t" * 33}, 400),
    "Topic outside base64url": (lambda s, sub, f: {"Topic": "a.b"}, 400),
    "over 4096 bytes": (lambda s, sub, f: {"data": b"x" * 4096}, 413),
}


def flip_last_byte(b: bytes) -> bytes:
    return b[:-1] + bytes([b[-1] ^ 1])


def several_records(sub: dict) -> bytes:
    sender = ec.generate_private_key(ec.SECP256R1())
    receiver = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unpad(sub["keys"]["p256dh"]))
    return http_ece.encrypt(b"x" * 100, private_key=sender, dh=receiver, auth_secret=unpad(sub["keys"]["auth"]),
                            version="aes128gcm", rs=64)


def unpad(s: str) -> bytes:
    import base64
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


@pytest.mark.parametrize("case", WEB_REFUSALS)
def test_web_push_refuses_what_push_services_refuse(web, vapid, case):
    make, status = WEB_REFUSALS[case]
    vapid_file, _ = vapid
    sub = web.new_subscription()
    r = web_post(web, sub, vapid_file, **make(web, sub, vapid_file))
    assert r.status_code == status, r.text
    assert web.accepted == [] and [x["status"] for x in web.refused] == [status]


def test_web_push_takes_only_the_subscriptions_application_server_key(web, vapid, tmp_path):
    vapid_file, public = vapid
    sub = web.new_subscription(application_server_key=public)
    other = tmp_path / "other.pem"
    other.write_bytes(pem_private(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(WebPushException) as e:
        webpush(sub, data="x", vapid_private_key=str(other), vapid_claims={"sub": "mailto:ops@example.com"}, ttl=60,
                requests_session=trusting(web))
    assert e.value.response.status_code == 403
    assert web_post(web, sub, vapid_file).status_code == 201
    gone = dict(sub, endpoint=f"{web.url}/push/nosuchsubscription")
    assert web_post(web, gone, vapid_file).status_code == 404


def test_a_bridged_subscription_takes_2744_bytes_and_no_more(web, vapid):
    """Firefox for Android, reached through FCM: autopush refuses larger bodies with its own error form."""
    vapid_file, _ = vapid
    sub, desktop = web.new_subscription(bridged=True), web.new_subscription()
    fits = WebPusher(sub).encode(b"x" * (2744 - 103), "aes128gcm")["body"]
    over = WebPusher(sub).encode(b"x" * (2744 - 102), "aes128gcm")["body"]
    assert (len(fits), len(over)) == (2744, 2745)
    assert web_post(web, sub, vapid_file, body=fits).status_code == 201
    r = web_post(web, sub, vapid_file, body=over)
    assert r.status_code == 413
    assert (r.json()["code"], r.json()["errno"], r.json()["error"]) == (413, 104, "Payload Too Large")
    big = WebPusher(desktop).encode(b"x" * 3993, "aes128gcm")["body"]
    assert len(big) == 4096 and web_post(web, desktop, vapid_file, body=big).status_code == 201, "others take 4096"
    assert [m["plaintext"] for m in web.accepted] == [b"x" * 2641, b"x" * 3993]


def test_web_push_answers_scripted_outcomes_and_holds(web, vapid):
    vapid_file, _ = vapid
    sub, other = web.new_subscription(), web.new_subscription()
    web.script(Outcome(410), Outcome(404), Outcome(429, retry_after=5), Outcome(503))
    web.script(Outcome(302), key=other["endpoint"].rsplit("/", 1)[1])
    answers = [web_post(web, sub, vapid_file) for _ in range(4)]
    assert [r.status_code for r in answers] == [410, 404, 429, 503]
    assert answers[2].headers["retry-after"] == "5"
    web.redirect_to = "https://127.0.0.1:1/elsewhere"
    r = trusting(web).post(other["endpoint"], data=WebPusher(other).encode(b"{}", "aes128gcm")["body"], allow_redirects=False,
                           headers={"TTL": "0", "Content-Encoding": "aes128gcm",
                                    **Vapid.from_file(str(vapid_file)).sign({"aud": web.url, "sub": "mailto:o@example.com"})})
    assert (r.status_code, r.headers["location"]) == (302, web.redirect_to)
    assert held_then_released(web, lambda: web_post(web, sub, vapid_file)).status_code == 201


# ---------------------------------------------------------------- all of them

def open_fds() -> int:
    gc.collect()  # sockets of finished clients
    return len(os.listdir("/proc/self/fd"))


def test_stop_ends_every_thread_and_closes_every_socket(tmp_path):
    threads, fds = set(threading.enumerate()), open_fds()
    apns, fcm = APNsStandIn(tmp_path / "apns").start(), FCMStandIn(tmp_path / "fcm").start()
    session, sa = trusting(fcm), json.loads(fcm.service_account_file.read_text())
    access = fcm_grant(session, sa, fcm_assertion(sa)).json()["access_token"]
    apns.hold = fcm.hold = True
    no_handshake = socket.create_connection(("127.0.0.1", apns.port))
    idle = h2_client(apns)
    assert apns_push(idle, apns, apns_push_type="banner").status_code == 400
    errors = []

    def held_apns():
        with h2_client(apns, timeout=30) as c:
            try:
                apns_push(c, apns)
            except httpx.HTTPError as e:
                errors.append(e)

    def held_fcm():
        try:
            fcm_send(session, fcm, access, MESSAGE)
        except requests.RequestException as e:
            errors.append(e)
    clients = [threading.Thread(target=held_apns), threading.Thread(target=held_fcm)]
    for c in clients:
        c.start()
    apns.wait_for(1)
    fcm.wait_for(1)
    began = time.monotonic()
    apns.stop()
    fcm.stop()
    assert time.monotonic() - began < 5
    for c in clients:
        c.join(10)
    assert len(errors) == 2, "held requests end unanswered"
    for port in (apns.port, fcm.port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port))
    assert [t.name for t in threading.enumerate() if t not in threads] == []
    no_handshake.close()
    idle.close()
    session.close()
    assert open_fds() == fds


def wait_for_line(proc: subprocess.Popen, timeout: float = 20.0) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    assert sel.select(timeout), f"no line from the stand-in in {timeout} s"
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("service", ["apns", "fcm", "webpush"])
def test_the_command_line_serves_until_sigterm(tmp_path, service):
    state, counts = tmp_path / "state", tmp_path / "counts.json"
    proc = subprocess.Popen([sys.executable, str(STANDINS), service, "--port", "0", "--state", str(state),
                             "--outcome", "503:ServiceUnavailable:2", "--outcome", "200", "--count-file", str(counts)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = wait_for_line(proc)
        assert line.startswith("listening on https://127.0.0.1:"), line
        url = line.split()[-1]
        info = json.loads((state / "standin.json").read_text())
        assert info["url"] == url and Path(info["caFile"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
        session = requests.Session()
        session.trust_env, session.verify = False, info["caFile"]
        if service == "apns":
            key = Path(info["keyFile"]).read_text()
            token = jwt.encode({"iss": info["teamId"], "iat": int(time.time())}, key, algorithm="ES256",
                               headers={"kid": info["keyId"]})
            headers = {"authorization": f"bearer {token}", "apns-topic": info["topic"], "apns-push-type": "alert"}
            with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=info["caFile"])) as c:
                answers = [c.post(f"{url}/3/device/{TOKEN}", headers=headers, content=ALERT) for _ in range(3)]
        elif service == "fcm":
            sa = json.loads(Path(info["serviceAccountFile"]).read_text())
            access = fcm_grant(session, sa, fcm_assertion(sa)).json()["access_token"]
            answers = [session.post(f"{url}/v1/projects/{sa['project_id']}/messages:send", json={"message": MESSAGE},
                                    headers={"Authorization": f"Bearer {access}"}) for _ in range(3)]
        else:
            vapid_file = tmp_path / "vapid.pem"
            vapid_file.write_bytes(pem_private(ec.generate_private_key(ec.SECP256R1())))
            [sub] = json.loads(Path(info["subscriptionsFile"]).read_text())
            answers = []
            for _ in range(3):
                try:
                    answers.append(webpush(sub, data="{}", vapid_private_key=str(vapid_file), ttl=0, requests_session=session,
                                           vapid_claims={"sub": "mailto:ops@example.com"}))
                except WebPushException as e:
                    answers.append(e.response)
        assert [r.status_code for r in answers][0] == 503 and answers[0].headers["retry-after"] == "2"
        assert all(200 <= r.status_code < 300 for r in answers[1:]), "the last outcome answers every request after"
        assert json.loads(counts.read_text())["accepted"] == 2 and json.loads(counts.read_text())["refused"] == 1
        assert len((state / "received.jsonl").read_text().splitlines()) == 2
        count = subprocess.run([sys.executable, str(STANDINS), "count", "--state", str(state)], capture_output=True, text=True)
        assert count.stdout.strip() == "2"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
