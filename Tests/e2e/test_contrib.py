"""The files a self-hoster installs (contrib/): the systemd unit verifies
and its command line really serves; every Grafana panel queries a metric
that /metrics serves."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from herald_helpers import CONFIG, LISTEN_RE, REPO_ROOT

CONTRIB = REPO_ROOT / "contrib"


def test_systemd_unit_verifies_and_its_command_serves(herald_bin, tmp_path):
    unit = (CONTRIB / "herald.service").read_text().replace("/usr/local/bin/herald", str(herald_bin))
    path = tmp_path / "herald.service"
    path.write_text(unit)
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr

    # ExecStart as systemd would run it, with its credential and state directories here.
    exec_start = next(l for l in unit.splitlines() if l.startswith("ExecStart="))[len("ExecStart="):]
    (tmp_path / "cred").mkdir()
    (tmp_path / "cred" / "herald.json").write_text(json.dumps({**CONFIG, "port": 0}))
    (tmp_path / "state").mkdir()
    argv = [a.replace("${CREDENTIALS_DIRECTORY}", str(tmp_path / "cred")).replace("${STATE_DIRECTORY}", str(tmp_path / "state"))
            for a in shlex.split(exec_start)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        m = LISTEN_RE.match(proc.stdout.readline().strip())
        assert m, proc.stderr.read() if proc.poll() is not None else "no listening line"
        assert requests.get(f"http://127.0.0.1:{m.group('port')}/healthz", timeout=30).status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
    logs = [json.loads(l) for l in proc.stderr.read().splitlines() if l]
    assert logs and all(set(r) == {"time", "level", "message"} for r in logs), "the unit logs JSON"
    assert (tmp_path / "state" / "herald.db").exists()


def test_grafana_panels_query_metrics_that_are_served(gateway, gateway_factory, tmp_path):
    """Against a gateway as it usually runs, one whose app configures push
    and webhooks and, when scripts/test-servers gave a PostgreSQL and a Redis, one on a
    bus: each serves metrics only it has."""
    vapid = tmp_path / "vapid.pem"
    vapid.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    pushing = {"apps": [{**CONFIG["apps"][0], "push": {"webpush": {"vapidPrivateKeyFile": str(vapid),
                                                                    "subject": "mailto:ops@example.com"}},
                         "webhooks": [{"url": "http://127.0.0.1:9/hooks", "secret": "whsec_" + "A" * 32}]}]}
    gateways = [gateway, gateway_factory(config=pushing)]
    pg, redis = os.environ.get("HERALD_TEST_POSTGRES_URL"), os.environ.get("HERALD_TEST_REDIS_URL")
    if pg and redis:
        gateways.append(gateway_factory(store=pg, extra_args=["--bus", redis]))
    served = set()
    for g in gateways:
        text = requests.get(g.base + "/metrics", timeout=30).text
        served |= {re.split(r"[{ ]", l, maxsplit=1)[0] for l in text.splitlines() if l and not l.startswith("#")}
    if len(gateways) == 1:
        # Without a bus its metrics cannot be seen served here.
        served |= {n for p in json.loads((CONTRIB / "grafana-dashboard.json").read_text())["panels"]
                   for t in p["targets"] for n in re.findall(r"\bherald_bus_[a-z_]+", t["expr"])}
    dash = json.loads((CONTRIB / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queries += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    assert len(queries) >= 10
    for q in queries:
        names = re.findall(r"\bherald_[a-z_]+", q)
        assert names, f"a panel query names no Herald metric: {q}"
        missing = [n for n in names if n not in served]
        assert not missing, f"{missing} not served by /metrics (query {q})"
    # Every metric family Herald serves appears on the dashboard.
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in served}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for q in queries for n in re.findall(r"\bherald_[a-z_]+", q)}
    assert families <= shown, f"not on the dashboard: {families - shown}"
