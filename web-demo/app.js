// The Herald web demo: one publisher and three devices of the same user, each
// on a different transport, all in this page. Served at / by `herald serve --demo`.
import { HeraldClient } from './herald.js';

const params = new URLSearchParams(location.search);
// ?gateway=http://host:port lets the page talk to a gateway on another origin.
const GATEWAY = (params.get('gateway') || (location.protocol.startsWith('http') ? location.origin : '')).replace(/\/+$/, '');
const APP_ID = 'demo';
const SERVER_KEY = 'demo-server-key'; // the demo app's documented, public server key
const ID_RE = /^[A-Za-z0-9._@:-]{1,128}$/;

const DEVICES = [
  { key: 'phone', name: 'Phone', transport: 'websocket', platform: 'ios', icon: 'M7 2h10a2 2 0 0 1 2 2v16a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V4a2 2 0 0 1 2-2Zm0 3v13h10V5H7Zm5 14.2a1 1 0 1 0 0 .01Z' },
  { key: 'laptop', name: 'Laptop', transport: 'sse', platform: 'web', icon: 'M4 5a2 2 0 0 1 2-2h12a2 2 0 0 1 2 2v10H4V5Zm2 0v8h12V5H6ZM1 17h22v1a2 2 0 0 1-2 2H3a2 2 0 0 1-2-2v-1Z' },
  { key: 'watch', name: 'Watch', transport: 'poll', platform: 'other', icon: 'M8 1h8l1 4a6 6 0 0 1 0 14l-1 4H8l-1-4A6 6 0 0 1 7 5l1-4Zm4 6a5 5 0 1 0 0 10 5 5 0 0 0 0-10Zm-.8 1.8h1.6v3.5l2.3 1.4-.8 1.3-3.1-1.9V8.8Z' },
];

const TRANSPORT_LABEL = { websocket: 'WebSocket', sse: 'Server-Sent Events', poll: 'Long-poll' };
const SNOOZE_MS = 60_000;
const STATE_LABEL = { noInteraction: '', activated: 'Opened', dismissed: 'Dismissed', snoozed: 'Snoozed' };

const SAMPLES = [
  ['Build #128 passed', 'All 412 tests green on main in 3 min 12 s.'],
  ['New comment on “Q3 roadmap”', 'Dana: Looks good, ship it on Monday?'],
  ['Your order has shipped', 'Package 1Z-8842 arrives tomorrow between 9 and 12.'],
  ['Standup in 5 minutes', 'Room Aurora · or join from your browser.'],
  ['Deploy failed on staging', 'health check /healthz timed out after 30 s.'],
  ['Lena shared a file', '“Herald architecture.pdf” · 2.4 MB'],
];

const $ = (sel, root = document) => root.querySelector(sel);

// ---------------------------------------------------------------- device ids

/** Stable per tab: a second tab gets its own suffix, so it is another set of devices. */
function tabSuffix() {
  let s = null;
  try { s = sessionStorage.getItem('herald-demo-suffix'); } catch { /* ignore */ }
  if (!s) {
    s = Math.random().toString(36).slice(2, 8);
    try { sessionStorage.setItem('herald-demo-suffix', s); } catch { /* ignore */ }
  }
  return s;
}
const SUFFIX = tabSuffix();

// ---------------------------------------------------------------- helpers

function relativeTime(iso) {
  const t = Date.parse(iso);
  if (!t) return '';
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 10) return 'just now';
  if (s < 60) return `${s} s ago`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ago`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h} h ago`;
  return new Date(t).toLocaleDateString(undefined, { month: 'short', day: 'numeric' });
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function showBanner(text, kind = 'error') {
  const b = $('#banner');
  if (!text) { b.hidden = true; return; }
  b.textContent = text;
  b.className = `banner ${kind}`;
  b.hidden = false;
}

async function fetchJson(url, init) {
  const res = await fetch(url, init);
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  if (!res.ok) {
    const err = new Error(data?.error?.message || `HTTP ${res.status}`);
    err.status = res.status;
    err.code = data?.error?.code;
    throw err;
  }
  return { status: res.status, data };
}

// ---------------------------------------------------------------- tokens

/** extra: the rest of a token request ({deviceId, ttlSeconds}). */
async function demoToken(userId, extra = {}) {
  try {
    const { data } = await fetchJson(`${GATEWAY}/v1/demo/token`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ userId, ...extra }),
    });
    return data.token;
  } catch (e) {
    if (e.status === 404) showBanner('This gateway is not in demo mode: start it with `herald serve --demo`.');
    throw e;
  }
}

// ---------------------------------------------------------------- device panels

class DevicePanel {
  constructor(spec) {
    this.spec = spec;
    this.deviceId = `${spec.key}-${SUFFIX}`;
    const node = $('#device-template').content.firstElementChild.cloneNode(true);
    node.dataset.testid = `device-${spec.key}`;
    node.dataset.device = spec.key;
    node.dataset.deviceId = this.deviceId;
    $('h2', node).textContent = spec.name;
    $('.device-id', node).textContent = this.deviceId;
    $('.device-id', node).title = 'device id (stable for this tab)';
    $('.device-icon', node).innerHTML = `<svg viewBox="0 0 24 24"><path d="${spec.icon}"/></svg>`;
    this.node = node;
    this.list = $('.notifications', node);
    this.items = new Map(); // id -> li
    this.fresh = new Set(); // ids just published: animated when they appear
    this.client = null;

    this.list.addEventListener('click', (ev) => this.onAction(ev));
    $('.toggle', node).addEventListener('click', () => this.toggleConnection());
    $('.seen-all', node).addEventListener('click', () => this.client?.seenAll().catch((e) => this.setError(`seen all failed: ${e.message}`)));
    this.mute = $('[data-testid="mute-marketing"]', node);
    this.mute.addEventListener('change', () => this.saveMute(this.mute.checked));
  }

  connect(userId) {
    this.disconnect();
    this.userId = userId;
    this.fresh.clear();
    this.list.replaceChildren();
    this.items.clear();
    this.setError(null);
    const client = new HeraldClient({
      baseUrl: GATEWAY,
      getToken: () => demoToken(userId),
      deviceId: this.deviceId,
      platform: this.spec.platform,
      transport: this.spec.transport,
      storagePrefix: 'herald-demo',
      backoffMaxMs: 10_000,
    });
    client.on('status', (status, transport) => this.renderStatus(status, transport));
    client.on('notifications', (list) => this.renderList(list));
    client.on('unread', (n) => this.renderUnread(n));
    // Saved on any device, so every panel's switch follows (PROTOCOL 16).
    client.on('preferences', (p) => this.renderPreferences(p));
    client.on('change', (c) => {
      if (c.op === 'upsert' && c.notification.version === 1) this.fresh.add(c.notification.id);
      else pushControl.changed();
    });
    client.on('error', (e) => {
      // While the gateway is unreachable the status already says 'reconnecting'.
      if (e.code !== 'token_unavailable' && e.code !== 'network') this.setError(e.message || String(e));
    });
    this.client = client;
    this.renderStatus('connecting', this.spec.transport);
    this.renderUnread(0);
    client.start();
  }

  renderPreferences(p) {
    this.mute.checked = p.groups.marketing?.inbox === false;
  }

  /** Mutes or unmutes the group for the user, at the version this device shows. */
  async saveMute(muted) {
    if (!this.client) return;
    const p = this.client.preferences ?? await this.client.fetchPreferences();
    const groups = { ...p.groups, marketing: { ...p.groups.marketing, inbox: !muted } };
    try {
      await this.client.savePreferences({ groups }, { ifVersion: p.version });
    } catch (e) {
      this.setError(`Saving the preferences failed: ${e.message}`);
      this.renderPreferences(this.client.preferences ?? p);
    }
  }

  disconnect() {
    if (this.client) this.client.stop();
    this.client = null;
  }

  toggleConnection() {
    if (!this.client) return;
    if (this.client.status === 'offline') {
      this.setError(null);
      this.client.start();
    } else {
      this.client.stop();
    }
  }

  setError(text) {
    const e = $('.device-error', this.node);
    e.hidden = !text;
    e.textContent = text || '';
    clearTimeout(this.errorTimer);
    if (text) this.errorTimer = setTimeout(() => { e.hidden = true; }, 6000);
  }

  renderStatus(status, transport) {
    const s = $('.status', this.node);
    s.dataset.status = status;
    s.dataset.transport = transport || '';
    const label = TRANSPORT_LABEL[transport] || transport || '';
    const text = {
      live: `Live · ${label}`,
      connecting: `Connecting · ${label}`,
      reconnecting: `Reconnecting · ${label}`,
      offline: 'Offline',
    }[status] || status;
    $('.status-text', s).textContent = text;
    this.node.classList.toggle('is-offline', status === 'offline');
    $('.toggle', this.node).textContent = status === 'offline' ? 'Go online' : 'Go offline';
  }

  renderUnread(n) {
    const b = $('.unread-badge', this.node);
    b.textContent = String(n);
    b.dataset.count = String(n);
    b.classList.toggle('zero', !n);
    b.title = `${n} unread`;
  }

  renderList(list) {
    const seen = new Set();
    let prev = null;
    for (const n of list) {
      seen.add(n.id);
      let li = this.items.get(n.id);
      if (!li) {
        li = el('li', { 'data-testid': 'notification', 'data-id': n.id });
        if (this.fresh.delete(n.id)) {
          li.classList.add('arrive');
          li.addEventListener('animationend', () => li.classList.remove('arrive'), { once: true });
        }
        this.items.set(n.id, li);
      }
      if (li.dataset.version !== String(n.version) || li.dataset.rendered !== '1') this.fillItem(li, n);
      // Keep the DOM in list order, moving only what is out of place.
      const want = prev ? prev.nextSibling : this.list.firstChild;
      if (want !== li) this.list.insertBefore(li, want);
      prev = li;
    }
    for (const [id, li] of this.items) {
      if (!seen.has(id)) { li.remove(); this.items.delete(id); }
    }
    $('.empty', this.node).hidden = list.length > 0;
    this.fresh.clear();
  }

  fillItem(li, n) {
    const title = n.payload?.title ?? n.appNotificationId;
    const body = n.payload?.body ?? '';
    const state = n.userActionState;
    li.className = ['notification', n.readState, state, n.priority === 'high' ? 'high' : '',
      li.classList.contains('arrive') ? 'arrive' : ''].filter(Boolean).join(' ');
    li.dataset.state = state;
    li.dataset.readState = n.readState;
    li.dataset.seenState = n.seenState;
    li.dataset.version = String(n.version);
    li.dataset.rendered = '1';

    const chips = el('div', { class: 'chips' });
    if (n.priority === 'high') chips.append(el('span', { class: 'chip high', text: 'High' }));
    if (n.seenState === 'unseen') chips.append(el('span', { class: 'chip new', 'data-testid': 'unseen-label', text: 'New' }));
    if (STATE_LABEL[state]) {
      const until = n.snoozedUntil ? ` until ${new Date(n.snoozedUntil).toLocaleTimeString()}` : '';
      chips.append(el('span', { class: `chip ${state}`, 'data-testid': 'state-label', text: STATE_LABEL[state] + until }));
    }

    const actions = el('div', { class: 'actions' });
    const btn = (action, label, extra = {}) => el('button', {
      type: 'button', class: `ghost small btn-${action}`, 'data-action': action,
      'data-testid': `btn-${action}`, ...extra,
    }, label);
    actions.append(n.readState === 'unread' ? btn('read', 'Read') : btn('unread', 'Unread'));
    if (state !== 'dismissed') actions.append(btn('dismiss', 'Dismiss'));
    if (state !== 'snoozed' && state !== 'dismissed') actions.append(btn('snooze', 'Snooze 1 min'));
    actions.append(btn('delete', 'Delete', { class: 'ghost small danger btn-delete' }));

    li.replaceChildren(
      el('span', { class: 'unread-dot', 'aria-label': n.readState === 'unread' ? 'unread' : 'read' }),
      el('div', { class: 'n-main' },
        el('div', { class: 'n-head' },
          el('span', { class: 'n-title', 'data-testid': 'notification-title', text: title }),
          el('time', { class: 'n-time', datetime: n.createdAt, title: new Date(n.createdAt).toLocaleString(), text: relativeTime(n.createdAt) })),
        body ? el('p', { class: 'n-body', 'data-testid': 'notification-body', text: body }) : null,
        el('div', { class: 'n-foot' }, chips, actions)),
    );
  }

  async onAction(ev) {
    const b = ev.target.closest('button[data-action]');
    if (!b || !this.client) return;
    const li = b.closest('li[data-id]');
    const id = li.dataset.id;
    const c = this.client;
    li.classList.add('busy');
    for (const x of li.querySelectorAll('button')) x.disabled = true;
    try {
      switch (b.dataset.action) {
        case 'read': await c.markRead(id); break;
        case 'unread': await c.markUnread(id); break;
        // In this demo, dismissing (the user has handled it) also marks it read.
        case 'dismiss': await c.dismiss(id, { markRead: true }); break;
        // Herald wakes it in a minute: unread, unseen and back on every device.
        case 'snooze': await c.snooze(id, Date.now() + SNOOZE_MS); break;
        case 'delete': await c.remove(id); break;
        default: break;
      }
    } catch (e) {
      this.setError(`${b.dataset.action} failed: ${e.message}`);
    } finally {
      li.classList.remove('busy');
      for (const x of li.querySelectorAll('button')) x.disabled = false;
    }
  }

  tick() {
    for (const t of this.list.querySelectorAll('time[datetime]')) {
      t.textContent = relativeTime(t.getAttribute('datetime'));
    }
  }
}

// ---------------------------------------------------------------- this browser's tray (Web Push)

const WORKER_TOKEN_TTL = 30 * 86400; // the demo has no token URL: the worker gets the longest token

/**
 * "Enable push on this browser": a fourth device of the user, `browser-<suffix>`,
 * that holds no connection, so the gateway sends it Web Push. herald-sw.js shows
 * each push in the OS tray and closes those handled on any device when it runs.
 */
class PushControl {
  constructor() {
    this.deviceId = `browser-${SUFFIX}`;
    this.button = $('#push-toggle');
    this.status = $('#push-status');
    this.client = null;
    this.registration = null;
    this.enabled = false;
    this.nudge = null;
    $('#push-device').textContent = this.deviceId;
    if (!('serviceWorker' in navigator) || typeof PushManager === 'undefined') {
      this.button.disabled = true;
      this.say('This browser has no Web Push here (it needs https or localhost).', 'error');
      return;
    }
    this.button.addEventListener('click', () => this.toggle());
  }

  /** The device belongs to the signed-in user: a switch moves this browser's subscription along. */
  async setUser(userId) {
    this.userId = userId;
    this.client = new HeraldClient({
      baseUrl: GATEWAY, deviceId: this.deviceId, platform: 'web', storage: null,
      getToken: () => demoToken(userId, { deviceId: this.deviceId, ttlSeconds: WORKER_TOKEN_TTL }),
    });
    if (this.button.disabled && !this.registration) return;
    await this.run(async () => {
      this.registration ??= await navigator.serviceWorker.register('herald-sw.js');
      // Subscribed on an earlier visit: register again (idempotent), which also renews the worker's token.
      if (this.enabled || await this.registration.pushManager.getSubscription()) await this.enable();
    });
  }

  async toggle() {
    await this.run(async () => {
      if (this.enabled) {
        await this.client.disablePush(this.registration);
        this.enabled = false;
        this.say('Push is off for this browser.');
      } else {
        // Asked here, in the click: some browsers prompt only during a user gesture.
        if (Notification.permission === 'default') await Notification.requestPermission();
        await this.enable();
      }
    });
  }

  async enable() {
    await this.client.enablePush(this.registration);
    this.enabled = true;
    this.say(`Push is on: ${this.userId}'s notifications reach this browser's system tray, also with this tab closed.`, 'ok');
  }

  async run(fn) {
    this.button.disabled = true;
    try {
      await fn();
    } catch (e) {
      this.say(e.code === 'push_unavailable'
        ? 'This gateway\'s demo app has no Web Push: start it with a config that gives it a VAPID key (web-demo/README.md, "Push in the demo").'
        : `Push: ${e.message}`, 'error');
    } finally {
      this.button.disabled = false;
      this.button.textContent = this.enabled ? 'Disable push on this browser' : 'Enable push on this browser';
      this.button.dataset.enabled = String(this.enabled);
    }
  }

  /** A card saw a change: the worker cleans the tray now instead of at the next push. */
  changed() {
    if (!this.enabled || this.nudge) return;
    this.nudge = setTimeout(() => {
      this.nudge = null;
      this.registration.active?.postMessage({ type: 'herald-push-sync' });
    }, 100);
  }

  say(text, kind = '') {
    this.status.textContent = text;
    this.status.className = `publish-result ${kind}`;
  }
}

const pushControl = new PushControl();

// ---------------------------------------------------------------- publisher

let sampleIndex = 1;

function currentUser() {
  return $('#user-id').value.trim();
}

async function publish(ev) {
  ev.preventDefault();
  const out = $('#publish-result');
  const user = currentUser();
  if (!ID_RE.test(user)) {
    out.className = 'publish-result error';
    out.textContent = 'Enter a valid user id first.';
    return;
  }
  const title = $('#publish-title').value.trim();
  const body = $('#publish-body').value.trim();
  const given = $('#publish-app-id').value.trim();
  const appNotificationId = given || `demo-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}`;
  const priority = document.querySelector('input[name="priority"]:checked')?.value || 'normal';
  const groupName = $('#publish-group').value;
  const button = $('#publish-button');
  button.disabled = true;
  out.className = 'publish-result';
  out.textContent = 'Publishing…';
  try {
    const { status, data } = await fetchJson(
      `${GATEWAY}/v1/apps/${APP_ID}/users/${encodeURIComponent(user)}/notifications`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${SERVER_KEY}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ appNotificationId, payload: { title, body }, priority, groupName }),
      });
    out.className = 'publish-result ok';
    out.dataset.id = data?.notification?.id || '';
    out.textContent = data?.suppressed
      ? `Not delivered: ${user} keeps “${groupName}” out of the inbox (their preferences)`
      : `${status === 201 ? 'Published' : 'Replaced'} “${title}” (${appNotificationId}) · seq ${data?.seq}`;
    if (!given) {
      const [t, b] = SAMPLES[sampleIndex++ % SAMPLES.length];
      $('#publish-title').value = t;
      $('#publish-body').value = b;
      $('input[name="priority"][value="normal"]').checked = true;
    }
  } catch (e) {
    out.className = 'publish-result error';
    out.textContent = `Publish failed: ${e.message}`;
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- start

function main() {
  if (!GATEWAY) {
    showBanner('Open this page from a Herald gateway (`herald serve --demo`, then http://127.0.0.1:8080/), or add ?gateway=http://host:port.');
  }
  const panels = DEVICES.map((d) => new DevicePanel(d));
  const host = $('#devices');
  for (const p of panels) host.append(p.node);

  const inbox = $('#inbox');
  inbox.setAttribute('url', GATEWAY);
  inbox.setAttribute('device-id', `inbox-${SUFFIX}`);
  // A real app would navigate to what the notification is about; the demo has nowhere to go.
  inbox.addEventListener('herald-activate', () => inbox.close());
  const userInput = $('#user-id');
  let connectedUser = null;
  const switchUser = () => {
    const user = currentUser();
    if (!ID_RE.test(user)) { userInput.classList.add('invalid'); return; }
    userInput.classList.remove('invalid');
    if (user === connectedUser) return;
    connectedUser = user;
    $('#publish-user').textContent = user;
    $('#publish-result').textContent = '';
    try { sessionStorage.setItem('herald-demo-user', user); } catch { /* ignore */ }
    if (GATEWAY) {
      for (const p of panels) p.connect(user);
      pushControl.setUser(user);
      inbox.tokenProvider = () => demoToken(user, { deviceId: inbox.getAttribute('device-id') }); // reconnects it
    }
  };
  try {
    const saved = sessionStorage.getItem('herald-demo-user');
    if (params.get('user')) userInput.value = params.get('user');
    else if (saved) userInput.value = saved;
  } catch { /* ignore */ }
  userInput.addEventListener('change', switchUser);
  userInput.addEventListener('keydown', (e) => { if (e.key === 'Enter') { e.preventDefault(); switchUser(); } });
  userInput.addEventListener('input', () => userInput.classList.toggle('invalid', !ID_RE.test(currentUser())));
  switchUser();

  $('#publish-form').addEventListener('submit', publish);
  setInterval(() => panels.forEach((p) => p.tick()), 10_000);
  window.heraldDemo = { panels, pushControl, inbox, GATEWAY }; // handy from the console
}

main();
