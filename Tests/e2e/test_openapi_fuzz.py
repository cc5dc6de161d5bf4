"""Schemathesis against the live gateway: every answer must match docs/openapi.yaml.

One `herald serve --demo` per store (memory, sqlite) gets real data (a user
with notifications of every targeting, registered devices, a feed with
history), then `schemathesis run` generates requests for every operation of
docs/openapi.yaml from its schemas: valid ones, invalid ones (negative mode),
boundary values (coverage phase), chains through links (stateful phase). The
server API runs with the app's server key, the device API with a device token
from `POST /v1/apps/{app}/tokens`. Checks: no 5xx, every status code
documented for its operation, the documented content type, response bodies
(each Server-Sent Event too) and headers valid against their schemas,
schema-invalid requests refused, credentials enforced, undocumented methods
answered 405 with `Allow`, deleted resources gone and created ones readable.
The gateway must also live through it (the fixtures stop it with SIGTERM and
want exit status 0).

Generation is derandomized (Hypothesis `derandomize`): the same requests on
every run, so CI cannot fail at random. HERALD_API_FUZZ_EXAMPLES sets the
examples per operation in the fuzzing phase (default below); docs/FUZZING.md
says how to run it longer.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from herald_helpers import REPO_ROOT
from openapi_spec_validator import validate
from openapi_spec_validator.readers import read_from_filename

EXAMPLES = int(os.environ.get("HERALD_API_FUZZ_EXAMPLES", "25"))
# Unset: derandomized, the same requests every run. A number: random
# generation from that seed, to explore beyond the fixed run by hand.
SEED = os.environ.get("HERALD_API_FUZZ_SEED")
SCHEMA = REPO_ROOT / "docs" / "openapi.yaml"
HOOKS = Path(__file__).resolve().parent / "openapi_fuzz_hooks.py"
# The app, user and device ids of the document's examples: the examples phase
# sends those, and the coverage phase starts from them, so they reach real
# data too (the fuzzing phase draws from the dictionaries below).
APP = {"id": "com.example.todo", "serverKey": "sk-fuzz", "tokenSecret": "ts-fuzz"}
USER = "alice"
DEVICES = {"phone-1": {"platform": "ios", "tags": ["lang:it", "beta"]}, "web-1": {"platform": "web"}}
DRAFTS = [
    {},
    {"priority": "high", "groupName": "tasks", "displayTimeToLive": 600, "ttlSeconds": 86400},
    {"targetPlatforms": ["ios"]},
    {"targetPlatforms": ["web", "android"]},
    {"targetTags": "lang:it && !muted"},
    {"targetTags": "beta || lang:fr"},
    {"targetPlatforms": []},
    {"payload": {"title": "nested", "body": {"deep": [1, 2, {"x": None}]}}},
]


def _seed(gw) -> tuple[str, dict[str, list]]:
    """Real data for generated requests to find; answers a device token and
    the dictionaries (values that exist) the fuzz draws path, query and
    header values from."""
    r = gw.server("POST", "/tokens", app=APP["id"], key=APP["serverKey"], json={"userId": USER})
    assert r.status_code == 200, r.text
    token = r.json()["token"]
    doomed_devices = ["old-1", "old-2", "old-3"]
    for device, body in [*DEVICES.items(), *((d, {}) for d in doomed_devices)]:
        r = gw.me("PUT", f"/devices/{device}", token, json=body)
        assert r.status_code == 200, r.text

    def publish(anid: str, fields: dict) -> str:
        body = {"appNotificationId": anid, "payload": {"title": anid}, **fields}
        r = gw.server("POST", f"/users/{USER}/notifications", app=APP["id"], key=APP["serverKey"], json=body)
        assert r.status_code == 201, r.text
        return r.json()["notification"]["id"]

    ids = [publish(f"seed-{i}", f) for i, f in enumerate(DRAFTS * 2)]
    doomed = {by: [publish(f"doomed-by-{by}-{i}", {}) for i in range(8)] for by in ("server", "device")}
    # history in the feed: a state change and a tombstone
    r = gw.server("PATCH", f"/users/{USER}/notifications/{ids[0]}", app=APP["id"], key=APP["serverKey"],
                  json={"readState": "read"})
    assert r.status_code == 200, r.text
    r = gw.server("DELETE", f"/users/{USER}/notifications/{doomed['server'].pop()}", app=APP["id"],
                  key=APP["serverKey"])
    assert r.status_code == 204, r.text
    reset = gw.me("GET", "/sync", token, params={"limit": 3}).json()
    page = gw.me("GET", "/notifications", token, params={"limit": 2}).json()
    cursors = [0, reset["cursor"] - 3, reset["cursor"]]
    return token, {
        "apps": [APP["id"]],
        "users": [USER],
        "ids": ids,
        "doomedByServer": doomed["server"],
        "doomedByDevice": doomed["device"],
        "devices": list(DEVICES),
        "doomedDevices": doomed_devices,
        "cursors": cursors,
        "cursorTexts": [str(c) for c in cursors],
        "epochs": [reset["epoch"]],
        "pages": [p for p in (reset["next"], page["next"]) if p],
        "files": ["index.html", "herald.js", "herald-sw.js", "app.js", "style.css", "README.md", "admin.js", "admin.css", "icon.svg"],
    }


def _toml(value) -> str:
    # JSON strings, numbers, booleans and arrays of them are valid TOML too.
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def _bindings(bindings: dict[str, tuple[str, float]]) -> str:
    return _toml({k: {"dictionary": d, "probability": p} for k, (d, p) in bindings.items()})


def _config(gw, token: str, dictionaries: dict[str, list]) -> str:
    # Known values are drawn with these probabilities, generated ones
    # otherwise (unknown apps: 401; unknown users and ids: empty lists and
    # 404; malformed ones: 400).
    bindings = {
        "path.app": ("apps", 0.9), "path.user": ("users", 0.9), "path.id": ("ids", 0.7),
        "header.Herald-Device": ("devices", 0.5), "query.deviceId": ("devices", 0.5),
        "query.cursor": ("cursors", 0.6), "query.epoch": ("epochs", 0.6), "query.before": ("pages", 0.5),
        "path.deviceId": ("devices", 0.6), "path.file": ("files", 0.6),
    }
    deletes = {"deleteUserNotification": {"path.id": ("doomedByServer", 0.7)},
               "deleteMyNotification": {"path.id": ("doomedByDevice", 0.7)},
               "deleteDevice": {"path.deviceId": ("doomedDevices", 0.6)},
               "serverDeleteDevice": {"path.deviceId": ("doomedDevices", 0.6)}}
    lines = [
        f"base-url = {_toml(gw.base)}",
        "workers = 1",  # one request at a time: the same order, the same answers
        f"parameters = {_bindings(bindings)}",
        *([] if SEED is None else [f"seed = {int(SEED)}"]),
        "[generation]",
        f"deterministic = {_toml(SEED is None)}",
        f"max-examples = {EXAMPLES}",
        "[checks]",
        "enabled = false",
        *(f"{c}.enabled = true" for c in (
            "not_a_server_error", "status_code_conformance", "content_type_conformance",
            "response_schema_conformance", "response_headers_conformance", "negative_data_rejection",
            "ignored_auth", "unsupported_method", "use_after_free", "ensure_resource_availability")),
        # A head over 8 KiB (a long generated query) is refused with 413.
        "negative_data_rejection.expected-statuses = [400, 401, 403, 404, 413, 429]",
        "[auth.openapi]",
        f"serverKey = {_toml({'bearer': APP['serverKey']})}",
        f"deviceToken = {_toml({'bearer': token})}",
        f"deviceTokenQuery = {_toml({'api_key': token})}",
        "[dictionaries]",
        *(f"{name} = {_toml({'values': values})}" for name, values in dictionaries.items()),
        # DELETEs take their own notifications and devices, and not the ids
        # earlier answers showed (schemathesis reuses those by default): the
        # examples phase would delete every notification before the other
        # operations' later phases get to them.
        *(line for op, bindings in deletes.items() for line in (
            "[[operations]]",
            f"include-operation-id = {_toml(op)}",
            f"parameters = {_bindings(bindings)}",
            *(f"phases.{p}.extra-data-sources.responses = false" for p in ("examples", "coverage", "fuzzing")))),
        # The WebSocket protocol is not HTTP: after a successful upgrade the
        # connection speaks frames, which schemathesis cannot (test_websocket.py).
        "[[operations]]",
        'include-operation-id = "webSocket"',
        "enabled = false",
        # A generated Authorization header beside the configured ?token= has
        # a random scheme, which is rightly no device token: the query token
        # is used and the answer is 200, which ignored_auth takes for a bypass.
        "[[operations]]",
        'include-operation-id = ["sync", "events"]',
        "generation.with-security-parameters = false",
        # An event stream never ends: read its first event, or what came
        # within 10 s (a cursor at the feed's end gets no event).
        "[[operations]]",
        'include-operation-id = "events"',
        # its cursor's schema is a string (Last-Event-ID wins over any cursor)
        f"parameters = {_bindings({'query.cursor': ('cursorTexts', 0.6)})}",
        "max-stream-events = 1",
        "request-timeout = 10",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("store", ["memory", "sqlite:herald.db"])
def test_openapi_fuzz(gateway_factory, tmp_path, store):
    gw = gateway_factory(config={"apps": [APP]}, extra_args=["--demo"], store=store)
    token, dictionaries = _seed(gw)
    config = tmp_path / "schemathesis.toml"
    config.write_text(_config(gw, token, dictionaries))
    log = tmp_path / "requests.ndjson"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS), "HERALD_FUZZ_LOG": str(log)}
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", str(SCHEMA), "--no-color",
         "--report", "har", "--report-dir", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"schemathesis found problems (HAR of every request in {tmp_path}):\n{run.stdout}\n{run.stderr}"

    statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in log.read_text().splitlines():
        r = json.loads(line)
        statuses[r["operation"]][r["status"]] += 1
    # The run only means something if it got past validation into the
    # handlers: each of these must have answered with success at least once.
    for op in ("GET /v1/apps/{app}/users/{user}/notifications/{id}",
               "PATCH /v1/apps/{app}/users/{user}/notifications/{id}",
               "DELETE /v1/apps/{app}/users/{user}/notifications/{id}",
               "GET /v1/me/notifications/{id}", "PATCH /v1/me/notifications/{id}",
               "DELETE /v1/me/notifications/{id}", "GET /v1/me/notifications", "GET /v1/me/sync",
               "GET /v1/me/events", "PUT /v1/me/devices/{deviceId}", "DELETE /v1/me/devices/{deviceId}",
               "GET /v1/apps/{app}/users/{user}/notifications", "GET /v1/apps/{app}/users/{user}/devices",
               "POST /v1/apps/{app}/users/{user}/notifications", "POST /v1/apps/{app}/notifications",
               "POST /v1/me/notifications/read-all", "GET /v1/me/counts", "GET /{file}",
               "GET /v1/me/preferences", "PUT /v1/me/preferences",
               "GET /v1/apps/{app}/users/{user}/preferences", "PUT /v1/apps/{app}/users/{user}/preferences"):
        assert any(200 <= s < 300 for s in statuses[op]), f"{op} never succeeded: {dict(statuses[op])}"


def _parameter_schema(doc: dict, path: str, method: str, name: str) -> dict:
    def resolve(o: dict) -> dict:
        while "$ref" in o:
            o = functools.reduce(lambda d, k: d[k], o["$ref"].removeprefix("#/").split("/"), doc)
        return o
    item = doc["paths"][path]
    params = [resolve(p) for p in item.get("parameters", []) + item[method].get("parameters", [])]
    return resolve(next(p["schema"] for p in params if p["name"] == name))


def test_document_is_valid_openapi():
    validate(read_from_filename(str(SCHEMA))[0])


def test_document_takes_any_events_cursor_since_last_event_id_wins():
    """Found by the API fuzz: with a non-empty Last-Event-ID the gateway does
    not read `cursor` at all (test_http_transport.py::
    test_last_event_id_wins_over_a_bad_cursor_query, PROTOCOL.md section 8),
    so the document may not call any cursor invalid there."""
    schema = _parameter_schema(read_from_filename(str(SCHEMA))[0], "/v1/me/events", "get", "cursor")
    for cursor in ("not-a-number", "", "-1", "12"):
        assert jsonschema.Draft202012Validator(schema).is_valid(cursor), (cursor, schema)


@pytest.mark.parametrize("if_match", ['"1"', "1", 'W/"1"', "W/1", "007", '"007"', "0" * 30 + "1", "9223372036854775807",
                                      "0", '"0"', 'W/"0"', "*", '"1", "2"', '"1', "1.0", "-1", ""])
def test_if_match_pattern_agrees_with_the_gateway(gateway, user, if_match):
    """Found by the API fuzz: the document's pattern took `"0"`, which the
    gateway refuses, and refused zero-padded versions, which it takes."""
    schema = _parameter_schema(read_from_filename(str(SCHEMA))[0], "/v1/me/notifications/{id}", "patch", "If-Match")
    n = gateway.publish(user)["notification"]
    r = gateway.server("PATCH", f"/users/{user}/notifications/{n['id']}", headers={"If-Match": if_match},
                       json={"readState": "read"})
    assert r.status_code in (200, 400, 412), r.text
    assert (r.status_code != 400) == jsonschema.Draft202012Validator(schema).is_valid(if_match), (r.status_code, r.text)
