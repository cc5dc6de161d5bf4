// The inspector's page (docs/PROTOCOL.md section 18). The server key is kept
// in sessionStorage only (gone when the tab closes) and sent as a bearer to
// this origin; every value from the gateway is written as text, never HTML.
const KEY = "herald-admin";
const REFRESH_MS = 5000;
const $ = (id) => document.getElementById(id);

let session = JSON.parse(sessionStorage.getItem(KEY) || "null");
let liveTimer = null;
let nextPage = null;

function say(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

async function api(path) {
  const r = await fetch(`/v1/apps/${encodeURIComponent(session.app)}${path}`, {
    headers: { Authorization: `Bearer ${session.key}` },
    cache: "no-store",
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw Object.assign(new Error(body.error?.message || `HTTP ${r.status}`), { status: r.status });
  return body;
}

/** Replaces the rows of `table`'s body with one per entry of `rows`, each an array of cell texts. */
function fill(table, rows, empty) {
  const body = $(table).tBodies[0];
  body.replaceChildren();
  if (rows.length === 0) rows = [[empty]];
  for (const cells of rows) {
    const tr = body.insertRow();
    for (const c of cells) {
      const td = tr.insertCell();
      td.textContent = c.text ?? c;
      if (c.problem) td.classList.add("problem");
    }
  }
}

const outcomeText = (o) => `${o.outcome}${o.reason ? ` (${o.reason})` : ""} at ${o.at}`;
const problem = (text, bad) => ({ text, problem: bad });

async function refreshLive() {
  try {
    const a = await api("/inspect");
    $("live-node").textContent = a.node ?? "single node";
    $("live-at").textContent = new Date().toLocaleTimeString();
    const h = a.health;
    fill("health-table", [
      ["store", problem(h.store, h.store !== "ok")],
      ["bus", h.bus ?? "none (single node)"],
      ["push", problem(h.push ?? "not configured", h.push === "failing")],
      ...(h.pushProblems ?? []).map((p) => [`push ${p.service}`, problem(p.problem, true)]),
    ]);
    fill("connections-table", Object.entries(a.connections).map(([t, n]) => [t, String(n)]));
    // A cluster's nodes, from the presence records; null on a single node.
    $("nodes-table").hidden = a.nodes === null;
    if (a.nodes) {
      fill("nodes-table", a.nodes.map((n) => [
        n.node === a.node ? `${n.node} (this node)` : n.node, String(n.devices.websocket), String(n.devices.sse), String(n.devices.poll),
      ]), "no devices connected");
    }
    fill("webhooks-table", a.webhooks.map((w) => [
      w.url, String(w.pending ?? "unknown (store down)"), String(w.inFlight), problem(w.lastFailures.map(outcomeText).join("; ") || "none", w.lastFailures.length > 0),
    ]), "no webhook endpoints");
  } catch (e) {
    if (e.status === 401) return signOut("The server key was refused; sign in again.");
    say(`Live status: ${e.message}`, true);
  }
}

async function inspectUser(user, before) {
  const query = before ? `?before=${encodeURIComponent(before)}` : "";
  try {
    const u = await api(`/users/${encodeURIComponent(user)}/inspect${query}`);
    for (const el of document.querySelectorAll(".user-name")) el.textContent = user;
    fill("devices-table", u.devices.map((d) => [
      d.deviceId, d.platform, d.tags.join(", "),
      d.connected ? `${d.transport}${d.here ? " (this node)" : " (another node)"}` : "no",
      d.push?.service ?? "none",
      String(d.pushesPending),
      d.lastSeenAt,
      problem(d.pushOutcomes.map(outcomeText).join("; ") || "none",
              d.pushOutcomes.some((o) => o.outcome !== "delivered")),
    ]), "no registered devices");
    fill("notifications-table", u.notifications.map((n) => [
      n.id, n.appNotificationId, n.readState, n.seenState, n.userActionState, String(n.version), n.updatedAt,
    ]), "no notifications");
    fill("changes-table", u.changes.map((c) => [
      String(c.seq), c.op, c.notification?.id ?? c.id ?? "",
      c.op === "upsert" ? `version ${c.notification.version}` : c.reason ?? "",
    ]), "no changes");
    $("feed-head").textContent = String(u.head);
    nextPage = u.next;
    $("next-page").hidden = !nextPage;
    $("user-result").hidden = false;
    say(`Inspected user ${user}.`);
  } catch (e) {
    if (e.status === 401) return signOut("The server key was refused; sign in again.");
    say(`User ${user}: ${e.message}`, true);
  }
}

function showSignedIn() {
  $("sign-in").hidden = true;
  $("signed-in").hidden = false;
  $("signed-in-app").textContent = session.app;
  refreshLive();
  liveTimer = setInterval(refreshLive, REFRESH_MS);
}

function signOut(message = "Signed out.") {
  sessionStorage.removeItem(KEY);
  session = null;
  clearInterval(liveTimer);
  $("signed-in").hidden = true;
  $("user-result").hidden = true;
  $("sign-in").hidden = false;
  say(message, message !== "Signed out.");
}

$("sign-in-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  session = { app: $("app-id").value.trim(), key: $("server-key").value };
  $("server-key").value = "";
  try {
    await api("/inspect");
  } catch (e) {
    session = null;
    return say(e.status === 401 ? "That app id and server key do not match." : `Sign in: ${e.message}`, true);
  }
  sessionStorage.setItem(KEY, JSON.stringify(session));
  say("Signed in.");
  showSignedIn();
});

$("sign-out").addEventListener("click", () => signOut());
$("user-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  inspectUser($("user-id").value.trim());
});
$("next-page").addEventListener("click", () => inspectUser($("user-id").value.trim(), nextPage));

if (session) showSignedIn();
