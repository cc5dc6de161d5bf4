"""The push stand-ins checked against independent clients (httpx over
HTTP/2, PyJWT, pywebpush), so a stand-in that accepted anything could not
make the gateway look right: each takes what the real service takes and
refuses what it refuses."""

from __future__ import annotations

import json
import time

import httpx
import jwt
import pytest
import requests
import ssl
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pywebpush import WebPushException, webpush

from push_standins import SCOPE, APNsStandIn, FCMStandIn, Outcome, WebPushStandIn, b64url, pem_private

TOKEN = "ab" * 32


@pytest.fixture
def apns(tmp_path):
    with APNsStandIn(tmp_path) as s:
        yield s


@pytest.fixture
def fcm(tmp_path):
    with FCMStandIn(tmp_path) as s:
        yield s


@pytest.fixture
def web(tmp_path):
    with WebPushStandIn(tmp_path) as s:
        yield s


def provider_token(s: APNsStandIn, key=None, iat=None, kid=None) -> str:
    return jwt.encode({"iss": s.team_id, "iat": int(iat if iat is not None else time.time())}, key or s.key,
                      algorithm="ES256", headers={"kid": kid or s.key_id})


def apns_post(client, s, token=TOKEN, push_type="alert", priority="10", body=None, provider=None):
    # One provider token per test: APNs refuses a new one on a connection within 20 minutes.
    if not hasattr(s, "test_token"):
        s.test_token = provider_token(s)
    headers = {"authorization": f"bearer {provider or s.test_token}", "apns-topic": s.topic,
               "apns-push-type": push_type, "apns-priority": priority, "apns-expiration": "0"}
    payload = body if body is not None else json.dumps({"aps": {"alert": {"title": "t", "body": "b"}}}).encode()
    return client.post(f"{s.url}/3/device/{token}", headers=headers, content=payload)


def test_apns_takes_a_signed_http2_request_and_refuses_what_apple_refuses(apns):
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=apns.ca_file)) as c:
        r = apns_post(c, apns)
        assert r.status_code == 200 and r.http_version == "HTTP/2", r.text
        assert apns.accepted[0]["payload"]["aps"]["alert"]["title"] == "t"
        other = ec.generate_private_key(ec.SECP256R1())
        assert apns_post(c, apns, provider=provider_token(apns, key=other)).json()["reason"] == "InvalidProviderToken"
        r = apns_post(c, apns, push_type="background", priority="10",
                      body=json.dumps({"aps": {"content-available": 1}}).encode())
        assert (r.status_code, r.json()["reason"]) == (400, "BadPriority")
        assert apns_post(c, apns, body=json.dumps({"aps": {"alert": "x" * 5000}}).encode()).status_code == 413
        assert apns_post(c, apns, token="zz").json()["reason"] == "BadDeviceToken"
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=apns.ca_file)) as c:
        r = apns_post(c, apns, provider=provider_token(apns, iat=time.time() - 3700))
        assert (r.status_code, r.json()["reason"]) == (403, "ExpiredProviderToken")
    with httpx.Client(http2=False, verify=ssl.create_default_context(cafile=apns.ca_file)) as c:
        assert apns_post(c, apns).status_code == 505, "HTTP/1.1 is not APNs"


def test_apns_multiplexes_scripts_outcomes_and_holds(apns):
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=apns.ca_file)) as c:
        token = provider_token(apns)
        apns.test_token = token
        for _ in range(20):
            assert apns_post(c, apns, provider=token).status_code == 200
        assert apns.connections == 1
        assert apns_post(c, apns, provider=provider_token(apns, iat=time.time() - 1)).json()["reason"] == "TooManyProviderTokenUpdates"
        apns.script(Outcome(410, "Unregistered"), Outcome(429, "TooManyRequests", 3))
        r = apns_post(c, apns, provider=token)
        assert (r.status_code, r.json()["reason"]) == (410, "Unregistered") and "timestamp" in r.json()
        r = apns_post(c, apns, provider=token)
        assert (r.status_code, r.headers["retry-after"]) == (429, "3")
    apns.hold = True
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=apns.ca_file), timeout=1) as c, pytest.raises(httpx.TimeoutException):
        apns_post(c, apns)
    assert apns.accepted[-1]["held"]


def test_fcm_takes_a_jwt_bearer_grant_and_data_messages(fcm):
    session = requests.Session()
    session.trust_env = False  # a CA bundle named in the environment would win over `verify`
    session.verify = fcm.ca_file
    sa = json.loads(fcm.service_account_file.read_text())
    now = int(time.time())
    assertion = jwt.encode({"iss": sa["client_email"], "scope": SCOPE, "aud": sa["token_uri"], "iat": now, "exp": now + 3600},
                           sa["private_key"], algorithm="RS256")
    r = session.post(sa["token_uri"], data={"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": assertion})
    assert r.status_code == 200, r.text
    access = r.json()["access_token"]
    url = f"{fcm.url}/v1/projects/{sa['project_id']}/messages:send"
    msg = {"message": {"token": "t1", "data": {"cursor": "1"}, "android": {"priority": "high", "ttl": "60s"}}}
    assert session.post(url, json=msg, headers={"Authorization": f"Bearer {access}"}).status_code == 200
    assert fcm.accepted[0]["message"]["data"] == {"cursor": "1"}
    bad = {"message": {"token": "t1", "data": {"cursor": 1}}}
    assert session.post(url, json=bad, headers={"Authorization": f"Bearer {access}"}).json()["error"]["status"] == "INVALID_ARGUMENT"
    assert session.post(url, json=msg, headers={"Authorization": "Bearer nope"}).status_code == 401
    other = ec.generate_private_key(ec.SECP256R1())
    forged = jwt.encode({"iss": sa["client_email"], "scope": SCOPE, "aud": sa["token_uri"], "iat": now, "exp": now + 3600},
                        pem_private(other), algorithm="ES256")
    r = session.post(sa["token_uri"], data={"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": forged})
    assert r.json()["error"] == "invalid_grant"
    fcm.script(Outcome(404, "UNREGISTERED"))
    r = session.post(url, json=msg, headers={"Authorization": f"Bearer {access}"})
    assert r.json()["error"]["details"][0]["errorCode"] == "UNREGISTERED"


def test_web_push_takes_what_pywebpush_sends_and_nothing_forged(web, tmp_path, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", web.ca_file)
    vapid_key = ec.generate_private_key(ec.SECP256R1())
    vapid_pem = tmp_path / "vapid.pem"
    vapid_pem.write_bytes(pem_private(vapid_key))
    public = b64url(vapid_key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint))
    sub = web.new_subscription(application_server_key=public)
    r = webpush(sub, data='{"hello": "world"}', vapid_private_key=str(vapid_pem), vapid_claims={"sub": "mailto:ops@example.com"},
                ttl=60)
    assert r.status_code == 201
    assert web.accepted[0]["json"] == {"hello": "world"}
    with pytest.raises(WebPushException) as e:
        other = tmp_path / "other.pem"
        other.write_bytes(pem_private(ec.generate_private_key(ec.SECP256R1())))
        webpush(sub, data="x", vapid_private_key=str(other), vapid_claims={"sub": "mailto:ops@example.com"}, ttl=60)
    assert e.value.response.status_code == 403, "another application server's key"
    r = requests.post(sub["endpoint"], data=b"\x00" * 100, headers={"TTL": "60", "Content-Encoding": "aes128gcm"}, verify=web.ca_file)
    assert r.status_code == 401, "no VAPID"
    stranger = web.new_subscription()
    r = webpush(stranger, data="y", vapid_private_key=str(vapid_pem), vapid_claims={"sub": "mailto:ops@example.com"}, ttl=60)
    assert r.status_code == 201
    # Ciphertext tampered with in flight.
    tampered = web.new_subscription()
    web.subscriptions[tampered["endpoint"].rsplit("/", 1)[1]]["auth"] = b"\x01" * 16
    with pytest.raises(WebPushException) as e:
        webpush(tampered, data="z", vapid_private_key=str(vapid_pem), vapid_claims={"sub": "mailto:ops@example.com"}, ttl=60)
    assert e.value.response.status_code == 400
