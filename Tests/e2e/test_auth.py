"""SPEC 2: server keys, device tokens, token issuing, device binding, isolation,
routing before authentication."""

import time

import pytest

from herald_helpers import (check_error, decode_jwt, epoch_seconds, mint_token,
                            parse_time, sign_jwt, uid, verify_jwt)


# ---------------------------------------------------------------- server keys

def test_server_key_accepted(gateway, user):
    r = gateway.server("GET", f"/users/{user}/notifications")
    assert r.status_code == 200, r.text
    assert r.json()["notifications"] == []


@pytest.mark.parametrize("headers", [
    {},                                          # missing
    {"Authorization": "Bearer sk-wrong"},         # wrong
    {"Authorization": "Bearer sk-two"},           # another app's key
    {"Authorization": "Bearer "},                 # empty
    {"Authorization": "sk-one"},                  # no scheme
    {"Authorization": "Basic c2stb25lOg=="},      # other scheme
], ids=["missing", "wrong", "other-app", "empty", "no-scheme", "basic"])
def test_server_key_refused(gateway, user, headers):
    r = gateway.request("GET", f"/v1/apps/app.one/users/{user}/notifications", headers=headers)
    check_error(r, 401)
    r = gateway.request("POST", f"/v1/apps/app.one/users/{user}/notifications", headers=headers,
                        json={"appNotificationId": "x", "payload": {}})
    check_error(r, 401)
    assert gateway.list_all(user) == []


def test_app_one_key_on_app_two_is_401(gateway, user):
    r = gateway.server("POST", f"/users/{user}/notifications", app="app.two", key="sk-one",
                       json={"appNotificationId": "x", "payload": {}})
    check_error(r, 401)
    assert gateway.list_all(user, app="app.two") == []


def test_unknown_app_is_401_not_404(gateway, user):
    for key in ("sk-one", "whatever"):
        r = gateway.request("GET", f"/v1/apps/no.such.app/users/{user}/notifications", key=key)
        check_error(r, 401)
        r = gateway.request("POST", "/v1/apps/no.such.app/tokens", key=key, json={"userId": user})
        check_error(r, 401)


def test_device_token_cannot_use_server_api(gateway, user):
    tok = mint_token(user)
    r = gateway.request("GET", f"/v1/apps/app.one/users/{user}/notifications", token=tok)
    check_error(r, 401)


def test_server_key_is_not_a_device_token(gateway):
    r = gateway.request("GET", "/v1/me/counts", key="sk-one")
    check_error(r, 401)


# ---------------------------------------------------------------- routing before auth

@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/nope"),
    ("GET", "/nope"),
    ("POST", "/v1/apps/app.one/nope"),
    ("GET", "/v1/me/nope"),
    ("GET", "/v1/apps/app.one/users/alice/notifications/n1/extra"),
])
def test_unknown_path_is_404_before_auth(gateway, method, path):
    check_error(gateway.request(method, path), 404)
    check_error(gateway.request(method, path, key="wrong"), 404)


@pytest.mark.parametrize("method,path", [
    ("PUT", "/v1/apps/app.one/users/alice/notifications"),
    ("DELETE", "/v1/apps/app.one/users/alice/notifications"),
    ("POST", "/v1/apps/app.one/users/alice/notifications/n_x"),
    ("GET", "/v1/apps/app.one/tokens"),
    ("POST", "/v1/me/counts"),
    ("PUT", "/v1/me/notifications"),
    ("POST", "/v1/me/notifications/n_x"),
    ("GET", "/v1/me/notifications/read-all"),
    ("PATCH", "/v1/me/notifications/read-all"),
    ("DELETE", "/v1/me/notifications/read-all"),
    ("POST", "/healthz"),
    ("GET", "/v1/apps/no.such.app/tokens"),
])
def test_wrong_method_is_405_before_auth(gateway, method, path):
    check_error(gateway.request(method, path), 405)
    check_error(gateway.request(method, path, key="wrong"), 405)


def test_demo_token_route_is_404_without_demo(gateway):
    check_error(gateway.request("POST", "/v1/demo/token", json={"userId": "alice"}), 404)


def test_demo_mode_issues_demo_tokens(gateway_factory):
    gw = gateway_factory(extra_args=["--demo"])
    r = gw.request("POST", "/v1/demo/token", json={"userId": "alice"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["appId"] == "demo"
    parse_time(body["expiresAt"])
    _, claims, _ = decode_jwt(body["token"])
    assert claims["app"] == "demo" and claims["sub"] == "alice"
    r = gw.me("GET", "/counts", body["token"])
    assert r.status_code == 200, r.text
    # the configured apps are still there
    assert gw.server("GET", "/users/alice/notifications").status_code == 200
    log = gw.stderr_tail(100000).lower()
    assert "demo" in log and "warn" in log, f"--demo is logged as a warning on stderr: {log[-500:]!r}"


# ---------------------------------------------------------------- POST /tokens

def test_issue_token_defaults(gateway, user):
    t0 = time.time()
    r = gateway.server("POST", "/tokens", json={"userId": user})
    t1 = time.time()
    assert r.status_code == 200, r.text
    body = r.json()
    claims = verify_jwt(body["token"], "ts-one")
    header, _, _ = decode_jwt(body["token"])
    assert header["alg"] == "HS256"
    assert claims["app"] == "app.one" and claims["sub"] == user
    assert "dev" not in claims or claims["dev"] is None
    assert isinstance(claims["iat"], int) and isinstance(claims["exp"], int)
    assert claims["exp"] - claims["iat"] == 3600
    assert int(t0) <= claims["iat"] <= t1, (t0, claims["iat"], t1)   # issued during the request
    assert abs(epoch_seconds(body["expiresAt"]) - claims["exp"]) < 1.0
    assert gateway.me("GET", "/counts", body["token"]).status_code == 200
    # the documented request shape, with an explicit null deviceId
    r = gateway.server("POST", "/tokens", json={"userId": user, "ttlSeconds": 3600, "deviceId": None})
    assert r.status_code == 200, r.text
    claims = verify_jwt(r.json()["token"], "ts-one")
    assert claims.get("dev") is None and claims["exp"] - claims["iat"] == 3600


def test_issue_token_with_ttl_and_device(gateway, user):
    r = gateway.server("POST", "/tokens", app="app.two", json={"userId": user, "ttlSeconds": 60, "deviceId": "phone-1"})
    assert r.status_code == 200, r.text
    claims = verify_jwt(r.json()["token"], "ts-two")
    assert claims["app"] == "app.two" and claims["sub"] == user and claims["dev"] == "phone-1"
    assert claims["exp"] - claims["iat"] == 60


@pytest.mark.parametrize("ttl", [60, 2592000])
def test_issue_token_ttl_bounds_accepted(gateway, user, ttl):
    r = gateway.server("POST", "/tokens", json={"userId": user, "ttlSeconds": ttl})
    assert r.status_code == 200, r.text
    claims = verify_jwt(r.json()["token"], "ts-one")
    assert claims["exp"] - claims["iat"] == ttl


@pytest.mark.parametrize("body", [
    {"userId": "u", "ttlSeconds": 59},
    {"userId": "u", "ttlSeconds": 2592001},
    {"userId": "u", "ttlSeconds": 0},
    {"userId": "u", "ttlSeconds": -5},
    {"userId": "u", "ttlSeconds": "3600"},
    {"userId": "u", "ttlSeconds": 3600.5},
    {},
    {"userId": ""},
    {"userId": "bad user"},
    {"userId": "x" * 129},
    {"userId": 42},
    {"userId": "u", "deviceId": "bad device!"},
    {"userId": "u", "deviceId": 7},
], ids=lambda b: str(b)[:40])
def test_issue_token_bad_request(gateway, body):
    check_error(gateway.server("POST", "/tokens", json=body), 400)


def test_issue_token_bad_json(gateway):
    check_error(gateway.server("POST", "/tokens", data=b"{not json", headers={"Content-Type": "application/json"}), 400)


def test_token_of_one_app_is_refused_by_the_other(gateway, user):
    tok2 = gateway.api_token(user, app="app.two")
    # app.two's token names app.two: it reaches app.two's data only
    n1 = gateway.publish(user, app="app.one")["notification"]
    check_error(gateway.me("GET", f"/notifications/{n1['id']}", tok2), 404)
    assert [n["id"] for n in gateway.me("GET", "/notifications", tok2).json()["notifications"]] == []


# ---------------------------------------------------------------- device tokens

def test_python_minted_token_accepted(gateway, user):
    gateway.publish(user)
    r = gateway.me("GET", "/counts", mint_token(user))
    assert r.status_code == 200, r.text
    assert r.json()["total"] == 1


def _refused(gateway, token):
    check_error(gateway.me("GET", "/counts", token), 401)
    check_error(gateway.me("GET", "/notifications", token), 401)


def test_missing_token_refused(gateway):
    check_error(gateway.request("GET", "/v1/me/counts"), 401)
    check_error(gateway.request("GET", "/v1/me/notifications"), 401)


def test_alg_none_refused(gateway, user):
    now = int(time.time())
    claims = {"app": "app.one", "sub": user, "iat": now, "exp": now + 600}
    _refused(gateway, sign_jwt({"alg": "none", "typ": "JWT"}, claims, None))
    _refused(gateway, sign_jwt({"alg": "none", "typ": "JWT"}, claims, "ts-one"))
    _refused(gateway, sign_jwt({"alg": "None"}, claims, None))


def test_rs256_and_other_algs_refused(gateway, user):
    now = int(time.time())
    claims = {"app": "app.one", "sub": user, "iat": now, "exp": now + 600}
    # RS256 header, HMAC'd with the secret (algorithm confusion) and with junk
    _refused(gateway, sign_jwt({"alg": "RS256", "typ": "JWT"}, claims, "ts-one"))
    _refused(gateway, sign_jwt({"alg": "RS256", "typ": "JWT"}, claims, b"\x00" * 32))
    _refused(gateway, sign_jwt({"alg": "HS512", "typ": "JWT"}, claims, "ts-one", alg="HS512"))
    _refused(gateway, sign_jwt({"typ": "JWT"}, claims, "ts-one"))


def test_forged_and_malformed_tokens_refused(gateway, user):
    _refused(gateway, mint_token(user, secret="not-the-secret"))
    _refused(gateway, mint_token(user, app="app.one", secret="ts-two"))
    _refused(gateway, mint_token(user, app="no.such.app", secret="ts-one"))
    good = mint_token(user)
    h, c, s = good.split(".")
    _refused(gateway, f"{h}.{c}.{s[:-4]}AAAA")
    _refused(gateway, f"{h}.{c}")
    _refused(gateway, "garbage")
    _refused(gateway, "")
    # a valid signature over claims then edited: another user
    other = mint_token("mallory")
    _refused(gateway, f"{h}.{other.split('.')[1]}.{s}")


def test_token_missing_claims_refused(gateway, user):
    now = int(time.time())
    _refused(gateway, mint_token(user, exp=None))
    _refused(gateway, mint_token(user, iat=None))
    _refused(gateway, sign_jwt({"alg": "HS256", "typ": "JWT"}, {"app": "app.one", "iat": now, "exp": now + 600}, "ts-one"))
    _refused(gateway, sign_jwt({"alg": "HS256", "typ": "JWT"}, {"sub": user, "iat": now, "exp": now + 600}, "ts-one"))


def test_expired_token_refused_exp_is_strict(gateway, user):
    now = int(time.time())
    _refused(gateway, mint_token(user, iat=now - 100, exp=now - 1))
    _refused(gateway, mint_token(user, iat=now - 100, exp=now - 10))   # within what would be a leeway: still refused
    assert gateway.me("GET", "/counts", mint_token(user, iat=now - 100, exp=now + 30)).status_code == 200


def test_nbf_beyond_leeway_refused(gateway, user):
    now = int(time.time())
    _refused(gateway, mint_token(user, nbf=now + 90))
    _refused(gateway, mint_token(user, nbf=now + 3600))
    # within the 30 s leeway: accepted
    r = gateway.me("GET", "/counts", mint_token(user, nbf=now + 10))
    assert r.status_code == 200, r.text
    r = gateway.me("GET", "/counts", mint_token(user, nbf=now - 10))
    assert r.status_code == 200, r.text


def test_iat_beyond_leeway_refused(gateway, user):
    now = int(time.time())
    _refused(gateway, mint_token(user, iat=now + 120, exp=now + 3600))
    r = gateway.me("GET", "/counts", mint_token(user, iat=now + 10, exp=now + 3600))
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- device binding

def test_bound_token_other_device_is_403_over_http(gateway, user):
    n = gateway.publish(user)["notification"]
    tok = mint_token(user, dev="phone-1")
    assert gateway.me("GET", "/counts", tok).status_code == 200
    assert gateway.me("GET", "/counts", tok, device="phone-1").status_code == 200
    assert gateway.me("GET", "/counts", tok, params={"deviceId": "phone-1"}).status_code == 200
    check_error(gateway.me("GET", "/counts", tok, device="tablet-2"), 403)
    check_error(gateway.me("GET", "/counts", tok, params={"deviceId": "tablet-2"}), 403)
    check_error(gateway.me("PATCH", f"/notifications/{n['id']}", tok, device="tablet-2", json={"readState": "read"}), 403)
    assert gateway.get_notification(user, n["id"])["readState"] == "unread"


def test_bound_token_via_api(gateway, user):
    tok = gateway.api_token(user, device="phone-1")
    check_error(gateway.me("GET", "/notifications", tok, device="phone-2"), 403)
    assert gateway.me("GET", "/notifications", tok, device="phone-1").status_code == 200


def test_device_header_and_query_disagree_is_400(gateway, user):
    tok = mint_token(user)
    check_error(gateway.me("GET", "/counts", tok, device="a", params={"deviceId": "b"}), 400)
    assert gateway.me("GET", "/counts", tok, device="a", params={"deviceId": "a"}).status_code == 200


def test_bad_device_header_is_400(gateway, user):
    tok = mint_token(user)
    check_error(gateway.me("GET", "/counts", tok, device="bad device!"), 400)
    check_error(gateway.me("GET", "/counts", tok, device="x" * 129), 400)


def test_named_http_client_is_listed_unnamed_is_not(gateway, user):
    tok = mint_token(user)
    assert gateway.me("GET", "/counts", tok).status_code == 200
    assert gateway.devices(user) == {}
    assert gateway.me("GET", "/counts", tok, device="laptop-1").status_code == 200
    devs = gateway.devices(user)
    assert set(devs) == {"laptop-1"}
    d = devs["laptop-1"]
    assert {"deviceId", "platform", "tags", "connected", "transport", "lastSeenAt"} <= set(d)
    assert d["platform"] == "other"
    seen = parse_time(d["lastSeenAt"])
    time.sleep(0.05)
    assert gateway.me("GET", "/notifications", tok, device="laptop-1").status_code == 200
    assert parse_time(gateway.devices(user)["laptop-1"]["lastSeenAt"]) > seen, "lastSeenAt is the last request"
    # a token bound with `dev` names its device too
    assert gateway.me("GET", "/counts", mint_token(user, dev="phone-9")).status_code == 200
    assert set(gateway.devices(user)) == {"laptop-1", "phone-9"}


# ---------------------------------------------------------------- isolation: 404, not 403

def test_other_users_notification_is_404(gateway):
    alice, bob = uid("alice"), uid("bob")
    nb = gateway.publish(bob, "secret", payload={"x": 1})["notification"]
    ta = mint_token(alice)
    check_error(gateway.me("GET", f"/notifications/{nb['id']}", ta), 404)
    check_error(gateway.me("PATCH", f"/notifications/{nb['id']}", ta, json={"readState": "read"}), 404)
    check_error(gateway.me("PATCH", f"/notifications/{nb['id']}", ta, json={"userActionState": "dismissed"},
                           headers={"If-Match": '"1"'}), 404)
    check_error(gateway.me("DELETE", f"/notifications/{nb['id']}", ta), 404)
    assert gateway.me("GET", "/notifications", ta).json()["notifications"] == []
    after = gateway.get_notification(bob, nb["id"])
    assert after == nb


def test_other_apps_notification_is_404(gateway, user):
    n1 = gateway.publish(user, app="app.one")["notification"]
    t2 = mint_token(user, app="app.two")
    check_error(gateway.me("GET", f"/notifications/{n1['id']}", t2), 404)
    check_error(gateway.me("DELETE", f"/notifications/{n1['id']}", t2), 404)
    # the server API of app.two does not see app.one's notification either
    check_error(gateway.server("GET", f"/users/{user}/notifications/{n1['id']}", app="app.two"), 404)
    check_error(gateway.server("DELETE", f"/users/{user}/notifications/{n1['id']}", app="app.two"), 404)
    assert gateway.get_notification(user, n1["id"]) == n1


def test_server_path_of_another_user_is_404(gateway):
    alice, bob = uid("alice"), uid("bob")
    na = gateway.publish(alice)["notification"]
    check_error(gateway.server("GET", f"/users/{bob}/notifications/{na['id']}"), 404)
    check_error(gateway.server("PATCH", f"/users/{bob}/notifications/{na['id']}", json={"readState": "read"}), 404)
    check_error(gateway.server("DELETE", f"/users/{bob}/notifications/{na['id']}"), 404)
    assert gateway.get_notification(alice, na["id"]) == na


def test_query_token_only_on_sync_and_events(gateway, user):
    tok = mint_token(user)
    check_error(gateway.request("GET", "/v1/me/counts", params={"token": tok}), 401)
    check_error(gateway.request("GET", "/v1/me/notifications", params={"token": tok}), 401)
    check_error(gateway.request("POST", "/v1/me/notifications/read-all", params={"token": tok}), 401)
