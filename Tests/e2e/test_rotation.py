"""Key rotation (docs/OPERATIONS.md, "Apps"): several server keys and token
secrets per app, tokens naming their secret with `kid`."""

from herald_helpers import check_error, decode_jwt, mint_token, uid, verify_jwt

OLD = {"kid": "2026-05", "secret": "ts-old"}
NEW = {"kid": "2026-11", "secret": "ts-new"}
ROTATING = {"id": "rot.app", "serverKeys": ["sk-new", "sk-old"], "tokenSecrets": [NEW, OLD]}


def rot_token(user, secret, kid=None, **kw):
    """A token of rot.app signed with `secret`, its header naming `kid` (or none)."""
    header = {"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}
    return mint_token(user, "rot.app", secret=secret, header=header, **kw)


def publish(gw, app, key, user, anid="n"):
    return gw.request("POST", f"/v1/apps/{app}/users/{user}/notifications", key=key,
                      json={"appNotificationId": anid, "payload": {}})


# ---------------------------------------------------------------- several keys and secrets

def test_every_server_key_and_secret_of_an_app_is_accepted(gateway_factory):
    gw = gateway_factory(config={"apps": [ROTATING]})
    user = uid("rot")
    for key in ("sk-new", "sk-old"):
        assert publish(gw, "rot.app", key, user, key).status_code == 201
    check_error(publish(gw, "rot.app", "sk-other", user), 401)
    # Herald signs with the newest secret and names it.
    r = gw.request("POST", "/v1/apps/rot.app/tokens", key="sk-old", json={"userId": user})
    assert r.status_code == 200, r.text
    issued = r.json()["token"]
    assert decode_jwt(issued)[0] == {"alg": "HS256", "typ": "JWT", "kid": "2026-11"}
    verify_jwt(issued, "ts-new")
    for tok in (issued, rot_token(user, "ts-old", "2026-05"), rot_token(user, "ts-old"), rot_token(user, "ts-new")):
        assert gw.me("GET", "/counts", tok).json()["total"] == 2
    for tok in (rot_token(user, "ts-old", "2026-11"), rot_token(user, "ts-new", "2025-01"), rot_token(user, "ts-other")):
        check_error(gw.me("GET", "/counts", tok), 401)
    ws = gw.ws()
    ws.send({"type": "hello", "token": rot_token(user, "ts-new", "2025-01"), "deviceId": "d"})
    code, _ = ws.expect_close()
    assert code == 4001


def test_an_app_with_one_secret_ignores_kid(gateway):
    # Tokens minted before rotation existed may carry any kid.
    user = uid("plain")
    tok = mint_token(user, header={"alg": "HS256", "typ": "JWT", "kid": "whatever"})
    assert gateway.me("GET", "/counts", tok).status_code == 200
