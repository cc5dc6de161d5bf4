"""<herald-inbox> (web-demo/herald-inbox.js) on the demo page, against a real
gateway in headless Chromium, used as a user would: real clicks and keys on
its shadow DOM, waiting for what the page shows (never for a fixed time).

The demo page's inbox is a fourth device of the user, `inbox-<tab suffix>`,
so a second tab is a second inbox of the same user. Covered: the unseen badge
and seen-all across tabs, live publishes, a dismiss elsewhere, paging on
scroll, the snooze picker and a wake, muting a group and a save from
elsewhere, critical groups, a gateway restart on SQLite, the keyboard-only
path, axe (axe-selenium-python), token-url, JSON pointers, lang, strings,
the events, the push button, and a switch of user.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from conftest import SERVER_KEY, Gateway, assert_accessible, rfc3339_in

WAIT = 30.0

STATE_JS = """
const host = document.querySelector('herald-inbox');
const r = host.shadowRoot;
const badge = r.querySelector('.badge');
const active = r.activeElement;
return {
  status: host.dataset.status,
  badge: badge.hidden ? 0 : Number(badge.textContent),
  bellLabel: r.querySelector('.bell').getAttribute('aria-label'),
  open: r.querySelector('dialog').open,
  tabs: [...r.querySelectorAll('.tab')].map((t) => t.textContent),
  items: [...r.querySelectorAll('li[data-id]')].map((li) => ({
    id: li.dataset.id, title: li.querySelector('.title').textContent, readState: li.dataset.readState,
    state: li.dataset.state, picker: !!li.querySelector('.picker'),
    body: li.querySelector('.body')?.textContent ?? null, time: li.querySelector('time').textContent,
  })),
  empty: !r.querySelector('.empty').hidden,
  offline: !r.querySelector('.offline').hidden,
  announced: [...r.querySelectorAll('[aria-live]')].map((x) => x.textContent).join(''),
  push: r.querySelector('.push').hidden ? null : r.querySelector('.push [role="status"]').textContent,
  switches: [...r.querySelectorAll('tbody input')].map((i) => ({
    group: i.dataset.group ?? null, channel: i.dataset.channel, checked: i.checked, disabled: i.disabled })),
  focus: document.activeElement === host && active
    ? { inDialog: !!active.closest('dialog'), bell: active.classList.contains('bell'), action: active.dataset.action ?? null }
    : null,
};
"""


def state(d) -> dict:
    return d.execute_script(STATE_JS)


def wait_for(d, what: str, cond, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = state(d)
        if r := cond(last):
            return r
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; inbox state:\n{json.dumps(last, indent=1)}")


def inbox(d, selector: str):
    return d.find_element(By.CSS_SELECTOR, "herald-inbox").shadow_root.find_element(By.CSS_SELECTOR, selector)


def click(d, selector: str) -> None:
    """Clicks the inbox's element; again if a change just redrew it (a seen-all, a change from elsewhere)."""
    for _ in range(20):
        try:
            inbox(d, selector).click()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} kept being redrawn")


def click_item(d, nid: str, action: str) -> None:
    click(d, f'li[data-id="{nid}"] [data-action="{action}"]')


def titles(s: dict) -> list[str]:
    return [it["title"] for it in s["items"]]


def server(base: str, method: str, path: str, body: dict | None = None) -> dict:
    headers = {"Authorization": f"Bearer {SERVER_KEY}", "Content-Type": "application/json"}
    req = urllib.request.Request(base + path, method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def open_demo(d, base: str, user: str) -> dict:
    d.get(f"{base}/?user={user}")
    return wait_for(d, "the inbox live", lambda s: s["status"] == "live" and s)


def open_panel(d) -> dict:
    click(d, ".bell")
    return wait_for(d, "the panel open", lambda s: s["open"] and s)


def press(d, key: str) -> None:
    """A key as the user presses it: to whatever has the focus."""
    ActionChains(d).send_keys(key).perform()


def test_badge_live_updates_and_another_tab(gateway_proc, driver):
    gw, d, user = gateway_proc, driver, "inbox-tabs"
    open_demo(d, gw.url, user)
    nid = gw.publish(user, "b1", "Build 1 passed", payload={"title": "Build 1 passed", "body": "412 tests"})["notification"]["id"]
    wait_for(d, "badge 1", lambda s: s["badge"] == 1 and s["bellLabel"] == "Notifications, 1 new")
    tab1 = d.current_window_handle
    d.switch_to.new_window("tab")
    tab2 = d.current_window_handle
    open_demo(d, gw.url, user)
    wait_for(d, "badge 1 in tab 2", lambda s: s["badge"] == 1)

    # Opening the panel lists it and marks everything seen: both badges clear.
    s = open_panel(d)
    s = wait_for(d, "the item listed, badge cleared", lambda s: titles(s) == ["Build 1 passed"] and s["badge"] == 0 and s)
    assert s["items"][0]["readState"] == "unread" and s["tabs"] == ["Unread (1)", "All (1)"], s
    d.switch_to.window(tab1)
    wait_for(d, "tab 1's badge cleared", lambda s: s["badge"] == 0)

    # A publish appears live, newest first, and is announced; the open panel keeps it seen.
    open_panel(d)
    gw.publish(user, "b2", "Build 2 failed")
    s = wait_for(d, "the new one on top", lambda s: titles(s) == ["Build 2 failed", "Build 1 passed"] and s)
    wait_for(d, "announced", lambda s: s["announced"] == "New notification: Build 2 failed")
    wait_for(d, "seen while open", lambda s: s["badge"] == 0)

    # Dismissed in tab 2: it leaves tab 1's Unread, and All shows it dismissed.
    d.switch_to.window(tab2)
    wait_for(d, "tab 2 has both", lambda s: len(s["items"]) == 2)
    click_item(d, nid, "dismiss")
    d.switch_to.window(tab1)
    wait_for(d, "gone from Unread", lambda s: titles(s) == ["Build 2 failed"] and s["tabs"][0] == "Unread (1)")
    click(d, '.tab[data-tab="all"]')
    s = wait_for(d, "All lists it dismissed", lambda s: len(s["items"]) == 2 and s)
    assert {k: s["items"][1][k] for k in ("id", "body", "readState", "state")} == {
        "id": nid, "body": "412 tests", "readState": "read", "state": "dismissed"}, s

    # Mark all as read empties Unread.
    click(d, ".read-all")
    click(d, '.tab[data-tab="unread"]')
    wait_for(d, "the empty state", lambda s: s["items"] == [] and s["empty"] and s["tabs"][0] == "Unread (0)")


def test_pages_as_the_user_scrolls(gateway_proc, driver):
    gw, d, user = gateway_proc, driver, "inbox-paging"
    for i in range(25):
        gw.publish(user, f"p{i}", f"Item {i:02}")
    open_demo(d, gw.url, user)
    open_panel(d)
    s = wait_for(d, "the first page", lambda s: s["tabs"][1] == "All (25)" and len(s["items"]) == 20 and s)
    assert titles(s)[0] == "Item 24", s
    d.execute_script("arguments[0].scrollTop = arguments[0].scrollHeight", inbox(d, ".scroll"))
    s = wait_for(d, "the rest", lambda s: len(s["items"]) == 25 and s)
    assert titles(s) == [f"Item {i:02}" for i in range(24, -1, -1)], s


def test_snooze_comes_back(gateway_proc, driver):
    gw, d, user = gateway_proc, driver, "inbox-snooze"
    open_demo(d, gw.url, user)
    nid = gw.publish(user, "s1", "Call Lena back")["notification"]["id"]
    open_panel(d)
    wait_for(d, "listed", lambda s: titles(s) == ["Call Lena back"])
    click_item(d, nid, "snooze")
    wait_for(d, "the picker", lambda s: s["items"][0]["picker"])
    click(d, '.picker [data-choice="hour"]')
    wait_for(d, "snoozed out of the list", lambda s: s["items"] == [] and s["empty"])
    n = server(gw.url, "GET", f"/v1/apps/demo/users/{user}/notifications/{nid}")["notification"]
    until = time.mktime(time.strptime(n["snoozedUntil"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert n["userActionState"] == "snoozed" and abs(until - time.time() - 3600) < 120, n
    # A chosen time (the picker's field is local time).
    other = gw.publish(user, "s2", "Renew the passport")["notification"]["id"]
    wait_for(d, "the second listed", lambda s: titles(s) == ["Renew the passport"])
    click_item(d, other, "snooze")
    d.execute_script("document.querySelector('herald-inbox').shadowRoot.querySelector('.picker input').value = arguments[0]",
                     time.strftime("%Y-%m-%dT%H:%M", time.localtime(time.time() + 7200)))
    click(d, '.picker [data-choice="at"]')
    wait_for(d, "the second snoozed", lambda s: s["items"] == [])
    n2 = server(gw.url, "GET", f"/v1/apps/demo/users/{user}/notifications/{other}")["notification"]
    until2 = time.mktime(time.strptime(n2["snoozedUntil"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert abs(until2 - time.time() - 7200) < 120, n2
    # Rather than wait the hour, the app server moves the end 3 s ahead: it comes back unread.
    server(gw.url, "PATCH", f"/v1/apps/demo/users/{user}/notifications/{nid}", {"snoozedUntil": rfc3339_in(3)})
    s = wait_for(d, "back in Unread", lambda s: titles(s) == ["Call Lena back"] and s)
    assert s["items"][0]["readState"] == "unread" and s["items"][0]["state"] == "noInteraction", s


def test_muted_group_stops_appearing(gateway_proc, driver):
    gw, d, user = gateway_proc, driver, "inbox-prefs"
    open_demo(d, gw.url, user)
    open_panel(d)
    click(d, ".prefs-toggle")
    wait_for(d, "a switch per group and channel", lambda s: {(x["group"], x["channel"]) for x in s["switches"]} >= {
        (None, "inbox"), (None, "push"), ("builds", "inbox"), ("marketing", "inbox"), ("marketing", "push")})
    click(d, 'input[data-group="marketing"][data-channel="inbox"]')
    # Saved for the user: the demo's Phone card (another device) follows.
    phone_mute = d.find_element(By.CSS_SELECTOR, '[data-testid="device-phone"] [data-testid="mute-marketing"]')
    deadline = time.monotonic() + WAIT
    while not phone_mute.is_selected() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert phone_mute.is_selected(), "the Phone card's switch did not follow the inbox's save"
    r = gw.publish(user, "m1", "Spring sale", groupName="marketing")
    assert r.get("suppressed") == "preferences", r
    gw.publish(user, "k1", "Build green", groupName="builds")
    click(d, ".prefs-toggle")
    wait_for(d, "only the build", lambda s: titles(s) == ["Build green"])
    # A save elsewhere (the app's server) arrives as a `preferences` change: the switch follows.
    click(d, ".prefs-toggle")
    server(gw.url, "PUT", f"/v1/apps/demo/users/{user}/preferences", {"groups": {}})
    wait_for(d, "unmuted in the inbox", lambda s: any(
        x["group"] == "marketing" and x["channel"] == "inbox" and x["checked"] for x in s["switches"]))


def own_gateway(tmp_path) -> Gateway:
    """A demo gateway on SQLite whose demo app has a critical group, `security`."""
    config = tmp_path / "herald.json"
    config.write_text(json.dumps({"apps": [{"id": "demo", "serverKey": SERVER_KEY, "tokenSecret": "t" * 32,
                                            "criticalGroups": ["security"]}]}))
    return Gateway(tmp_path, ["--config", str(config)], store=f"sqlite:{tmp_path / 'herald.db'}").start()


def test_critical_group_is_shown_and_disabled(browser_paths, driver, tmp_path):
    gw = own_gateway(tmp_path)
    try:
        d = driver
        open_demo(d, gw.url, "inbox-critical")
        open_panel(d)
        click(d, ".prefs-toggle")
        s = wait_for(d, "the security switches", lambda s: [x for x in s["switches"] if x["group"] == "security"])
        assert s == [{"group": "security", "channel": c, "checked": True, "disabled": True} for c in ("inbox", "push")], s
    finally:
        gw.stop()


def test_gateway_restart_is_survived(browser_paths, driver, tmp_path):
    gw = own_gateway(tmp_path)
    try:
        d, user = driver, "inbox-restart"
        open_demo(d, gw.url, user)
        gw.publish(user, "r1", "Before the restart")
        open_panel(d)
        wait_for(d, "the first", lambda s: titles(s) == ["Before the restart"])
        assert gw.stop() == 0
        wait_for(d, "the offline indicator, announced", lambda s: s["offline"] and s["status"] != "live"
                 and s["announced"] == "Offline")
        gw.start(gw.port)
        gw.publish(user, "r2", "After the restart")  # likely before the inbox is back: it catches up
        s = wait_for(d, "both, live again", lambda s: s["status"] == "live" and not s["offline"]
                     and titles(s) == ["After the restart", "Before the restart"] and s)
        assert len({it["id"] for it in s["items"]}) == 2
    finally:
        if gw.proc and gw.proc.poll() is None:
            gw.stop()


def test_keyboard_only(gateway_proc, driver):
    gw, d, user = gateway_proc, driver, "inbox-keys"
    open_demo(d, gw.url, user)
    nid = gw.publish(user, "k1", "Keyboard only")["notification"]["id"]
    wait_for(d, "badge 1", lambda s: s["badge"] == 1)
    d.execute_script("document.activeElement.blur()")
    for _ in range(10):  # the bell follows the user field in the header
        press(d, Keys.TAB)
        if (state(d)["focus"] or {}).get("bell"):
            break
    assert state(d)["focus"] == {"inDialog": False, "bell": True, "action": None}, state(d)
    press(d, Keys.ENTER)
    s = wait_for(d, "open, focus inside", lambda s: s["open"] and s["focus"] and s["focus"]["inDialog"] and s)
    # Tab goes round inside the dialog and reaches the item's actions.
    seen = []
    for _ in range(20):
        press(d, Keys.TAB)
        f = state(d)["focus"]
        assert f and f["inDialog"], f"focus left the dialog after {seen}"
        seen.append(f["action"])
        if f["action"] == "snooze":
            break
    assert seen[-1] == "snooze", seen
    # The picker opens with the focus in it; Esc closes the picker alone, back on its button.
    press(d, Keys.ENTER)
    wait_for(d, "the picker, focused", lambda s: s["items"][0]["picker"] and s["focus"]["action"] == "snooze-at")
    press(d, Keys.ESCAPE)
    wait_for(d, "the picker closed, the panel open", lambda s: s["open"] and not s["items"][0]["picker"]
             and s["focus"]["action"] == "snooze")
    ActionChains(d).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
    wait_for(d, "on mark as read", lambda s: s["focus"]["action"] == "toggle-read")
    press(d, Keys.ENTER)
    wait_for(d, "read, gone from Unread", lambda s: s["items"] == [] and s["focus"] and s["focus"]["inDialog"])
    assert server(gw.url, "GET", f"/v1/apps/demo/users/{user}/notifications/{nid}")["notification"]["readState"] == "read"
    press(d, Keys.ESCAPE)
    wait_for(d, "closed, focus on the bell", lambda s: not s["open"] and s["focus"] and s["focus"]["bell"])


def test_axe_finds_nothing(gateway_proc, driver):
    gw, d, user = gateway_proc, driver, "inbox-axe"
    open_demo(d, gw.url, user)
    nid = gw.publish(user, "a1", "Accessible", payload={"title": "Accessible", "body": "for everyone"})["notification"]["id"]
    gw.publish(user, "a2", "Another one")

    def check(what: str) -> None:
        assert_accessible(d, what, context="herald-inbox")

    check("the bell")
    open_panel(d)
    wait_for(d, "listed", lambda s: len(s["items"]) == 2)
    click_item(d, nid, "snooze")
    wait_for(d, "the picker", lambda s: any(it["picker"] for it in s["items"]))
    check("the panel with the snooze picker")
    click(d, ".prefs-toggle")
    wait_for(d, "the switches", lambda s: s["switches"])
    check("the preferences")


PAGE_JS = """
const [user, done] = [arguments[0], arguments[arguments.length - 1]];
// The app's token endpoint, stubbed in the page: it mints a demo token bound to the device asked for.
const realFetch = window.fetch.bind(window);
window.tokenAsks = [];
window.fetch = async (u, o) => {
  const url = new URL(u, location.href);
  if (url.pathname !== '/app/herald-token') return realFetch(u, o);
  tokenAsks.push(url.searchParams.get('deviceId'));
  const r = await realFetch('/v1/demo/token', { method: 'POST',
    body: JSON.stringify({ userId: user, deviceId: url.searchParams.get('deviceId') }) });
  return new Response(JSON.stringify({ token: (await r.json()).token }));
};
import('/herald-inbox.js').then(() => {
  const el = document.createElement('herald-inbox');
  for (const [k, v] of Object.entries({ 'device-id': 'web-it', 'token-url': '/app/herald-token', lang: 'it',
                                        'title-pointer': '/t', 'body-pointer': '/b/text', push: '' })) el.setAttribute(k, v);
  el.strings = { unread: 'Da leggere', all: 'Tutte' };
  window.events = [];
  for (const t of ['herald-activate', 'herald-counts', 'herald-change']) {
    el.addEventListener(t, (e) => events.push([t, t === 'herald-change' ? e.detail.op : e.detail]));
  }
  document.body.replaceChildren(el);
  done('ok');
}).catch((e) => done(String(e)));
"""


def test_token_url_pointers_language_strings_and_events(gateway_proc, driver):
    gw, d, user = gateway_proc, driver, "inbox-app"
    d.get(gw.url + "/herald.js")  # any page of the gateway's origin
    assert d.execute_async_script(PAGE_JS, user) == "ok"
    wait_for(d, "live", lambda s: s["status"] == "live")
    assert d.execute_script("return tokenAsks") == ["web-it"]
    nid = gw.publish(user, "it1", "", payload={"t": "Ciao", "b": {"text": "mondo"}})["notification"]["id"]
    wait_for(d, "badge 1", lambda s: s["badge"] == 1)
    open_panel(d)
    s = wait_for(d, "listed", lambda s: s["items"] and s)
    assert (s["items"][0]["title"], s["items"][0]["body"], s["items"][0]["time"]) == ("Ciao", "mondo", "ora"), s
    assert s["tabs"] == ["Da leggere (1)", "Tutte (1)"], s
    click_item(d, nid, "activate")
    wait_for(d, "read", lambda s: s["items"] == [])
    n = server(gw.url, "GET", f"/v1/apps/demo/users/{user}/notifications/{nid}")["notification"]
    assert (n["userActionState"], n["readState"]) == ("activated", "read"), n
    events = d.execute_script("return events")
    assert [e[1]["notification"]["id"] for e in events if e[0] == "herald-activate"] == [nid], events
    assert ["herald-change", "upsert"] in events, events
    counts = [e[1] for e in events if e[0] == "herald-counts"]
    assert {"unread": 1, "unseen": 1, "total": 1} in counts, counts
    wait_for(d, "the counts at 0", lambda s: d.execute_script("return events.filter((e) => e[0] === 'herald-counts').at(-1)[1]")
             == {"unread": 0, "unseen": 0, "total": 1})

    # The page opted in to push; this gateway's demo app has no VAPID key, and the inbox says so.
    assert state(d)["push"] == "", state(d)
    click(d, ".push button")
    wait_for(d, "push refused", lambda s: (s["push"] or "").startswith("Push is not available: "))


def test_switching_user_reconnects_the_inbox(gateway_proc, driver):
    gw, d = gateway_proc, driver
    open_demo(d, gw.url, "inbox-first")
    gw.publish("inbox-first", "f1", "For the first user")
    wait_for(d, "badge 1", lambda s: s["badge"] == 1)
    field = d.find_element(By.CSS_SELECTOR, '[data-testid="user-id"]')
    field.clear()
    field.send_keys("inbox-second", Keys.ENTER)
    gw.publish("inbox-second", "s1", "For the second user")
    open_panel(d)
    wait_for(d, "only the second user's", lambda s: s["status"] == "live" and titles(s) == ["For the second user"])


SNOOZE_JS = """
const done = arguments[arguments.length - 1];
import('/herald-inbox.js').then(({ snoozeChoices }) => {
  const local = (d) => d && [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(), d.getMinutes()];
  const at = (h) => Object.fromEntries(Object.entries(snoozeChoices(new Date(2026, 11, 3, h, 30))).map(([k, v]) => [k, local(v)]));
  done({ afternoon: at(16), night: at(21), sunday: local(snoozeChoices(new Date(2026, 11, 6, 10)).week) });
});
"""


def test_snooze_choices(gateway_proc, driver):
    """The picker's ends in local time, from a Thursday (3 December 2026) and a Sunday."""
    driver.get(gateway_proc.url + "/herald.js")
    r = driver.execute_async_script(SNOOZE_JS)
    assert r["afternoon"] == {"hour": [2026, 12, 3, 17, 30], "evening": [2026, 12, 3, 18, 0],
                              "morning": [2026, 12, 4, 8, 0], "week": [2026, 12, 7, 8, 0]}, r
    assert "evening" not in r["night"], r  # this evening has gone
    assert r["sunday"] == [2026, 12, 7, 8, 0], r  # next week: the coming Monday
