// herald-inbox.js: <herald-inbox>, a notification bell and inbox panel on top
// of herald.js. No framework, no build step:
//
//   <script type="module" src="/herald-inbox.js"></script>
//   <herald-inbox url="https://herald.example.com" device-id="web-1" token-url="/my-app/herald-token"></herald-inbox>
//
// It holds a device token only (from `tokenProvider` or `token-url`), never a
// server key. See web-demo/README.md, "<herald-inbox>".

import { HeraldClient } from './herald.js';

const PAGE = 20; // items rendered per scroll step

const STRINGS = {
  bell: 'Notifications',
  bellUnseen: 'Notifications, {count} new',
  title: 'Notifications',
  close: 'Close',
  unread: 'Unread',
  all: 'All',
  preferences: 'Preferences',
  markAllRead: 'Mark all as read',
  empty: 'You are all caught up',
  emptyAll: 'No notifications yet',
  markRead: 'Mark as read',
  markUnread: 'Mark as unread',
  dismiss: 'Dismiss',
  snooze: 'Snooze',
  delete: 'Delete',
  dismissed: 'Dismissed',
  snoozeFor: 'Snooze until',
  snoozeHour: 'In 1 hour',
  snoozeEvening: 'This evening',
  snoozeMorning: 'Tomorrow morning',
  snoozeWeek: 'Next week',
  snoozeAt: 'Pick a time',
  snoozeApply: 'Snooze',
  offline: 'Offline: showing what was last synced',
  connecting: 'Connecting…',
  announceNew: 'New notification: {title}',
  announceRead: 'Marked as read',
  announceUnread: 'Marked as unread',
  announceDismissed: 'Dismissed',
  announceSnoozed: 'Snoozed until {time}',
  announceDeleted: 'Deleted',
  announceAllRead: 'All marked as read',
  announceOffline: 'Offline',
  announceOnline: 'Back online',
  announceFailed: 'That did not work: {message}',
  prefsHint: 'Where each kind of notification reaches you, on every device.',
  prefsDefault: 'Everything else',
  prefsInbox: 'Inbox',
  prefsPush: 'Push',
  prefsCritical: 'always on',
  prefsSaved: 'Preferences saved',
  prefsStale: 'Changed on another device meanwhile: shown as they are now',
  push: 'Notify me on this device',
  pushOn: 'This device gets push notifications',
  pushFailed: 'Push is not available: {message}',
};

const ICONS = {
  bell: 'M12 22a2.5 2.5 0 0 0 2.45-2h-4.9A2.5 2.5 0 0 0 12 22Zm7-6V11a7 7 0 0 0-5.5-6.84V3.5a1.5 1.5 0 0 0-3 0v.66A7 7 0 0 0 5 11v5l-2 2v1h18v-1Z',
  close: 'M6.4 5 5 6.4 10.6 12 5 17.6 6.4 19l5.6-5.6 5.6 5.6 1.4-1.4-5.6-5.6L19 6.4 17.6 5 12 10.6Z',
  read: 'M9 16.2 4.8 12l-1.4 1.4L9 19 21 7l-1.4-1.4Z',
  unread: 'M12 7a5 5 0 1 0 0 10 5 5 0 0 0 0-10Z',
  dismiss: 'M20 6H4V4h16Zm-1 2H5v11a2 2 0 0 0 2 2h10a2 2 0 0 0 2-2Zm-4 5H9v-2h6Z', // archive: out of the way, kept
  snooze: 'M12 2a10 10 0 1 0 0 20 10 10 0 0 0 0-20Zm0 18a8 8 0 1 1 0-16 8 8 0 0 1 0 16Zm.5-13H11v6l5.2 3.2.8-1.3-4.5-2.7Z',
  delete: 'M6 19a2 2 0 0 0 2 2h8a2 2 0 0 0 2-2V7H6Zm13-15h-3.5l-1-1h-5l-1 1H5v2h14Z',
  prefs: 'M19.4 13a7.5 7.5 0 0 0 0-2l2.1-1.6-2-3.5-2.5 1a7.3 7.3 0 0 0-1.7-1L15 3h-4l-.4 2.9a7.3 7.3 0 0 0-1.7 1l-2.5-1-2 3.5L6.6 11a7.5 7.5 0 0 0 0 2l-2.1 1.6 2 3.5 2.5-1a7.3 7.3 0 0 0 1.7 1L11 21h4l.4-2.9a7.3 7.3 0 0 0 1.7-1l2.5 1 2-3.5ZM13 15.5a3.5 3.5 0 1 1 0-7 3.5 3.5 0 0 1 0 7Z',
};

const CSS = `
:host {
  --herald-accent: #4f46e5; --herald-on-accent: #fff;
  --herald-bg: #fff; --herald-fg: #111827; --herald-muted: #4b5563; --herald-line: #e5e7eb;
  --herald-hover: #f3f4f6; --herald-badge: #dc2626; --herald-switch-off: #9ca3af; --herald-radius: 12px;
  --herald-font: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif;
  --herald-panel-width: 400px; --herald-panel-height: min(640px, 85vh); --herald-panel-margin: 64px 16px auto auto;
  display: inline-block; position: relative; font-family: var(--herald-font); color: var(--herald-fg);
  color-scheme: light dark; /* the time picker's native field follows too */
}
@media (prefers-color-scheme: dark) {
  :host {
    --herald-accent: #a5b4fc; --herald-on-accent: #111827;
    --herald-bg: #1f2937; --herald-fg: #f9fafb; --herald-muted: #d1d5db; --herald-line: #374151;
    --herald-hover: #374151; --herald-badge: #f87171; --herald-switch-off: #6b7280;
  }
}
svg { width: 20px; height: 20px; fill: currentColor; flex: none; }
button { font: inherit; color: inherit; cursor: pointer; }
button:focus-visible, input:focus-visible, a:focus-visible { outline: 2px solid var(--herald-accent); outline-offset: 2px; }
.bell { position: relative; display: grid; place-items: center; width: 40px; height: 40px;
  border: 1px solid var(--herald-line); border-radius: 50%; background: var(--herald-bg); }
.bell:hover { background: var(--herald-hover); }
.badge { position: absolute; top: -4px; right: -4px; min-width: 18px; height: 18px; padding: 0 5px; box-sizing: border-box;
  border-radius: 9px; background: var(--herald-badge); color: #fff; font-size: 11px; font-weight: 700; line-height: 18px; text-align: center; }
.badge[hidden] { display: none; }
dialog { margin: var(--herald-panel-margin); width: var(--herald-panel-width); max-width: calc(100vw - 24px); height: var(--herald-panel-height); padding: 0;
  border: 1px solid var(--herald-line); border-radius: var(--herald-radius); background: var(--herald-bg); color: var(--herald-fg);
  box-shadow: 0 20px 50px rgb(0 0 0 / .25); font-family: var(--herald-font); }
dialog[open] { display: flex; flex-direction: column; }
dialog::backdrop { background: rgb(0 0 0 / .2); }
.head { display: flex; align-items: center; gap: 8px; padding: 12px 12px 8px 16px; }
h2 { flex: 1; margin: 0; font-size: 16px; }
.icon { display: grid; place-items: center; width: 32px; height: 32px; padding: 0; border: 0; border-radius: 8px; background: none; color: var(--herald-muted); }
.icon:hover, .icon[aria-pressed="true"] { background: var(--herald-hover); color: var(--herald-fg); }
.offline { margin: 0 16px 8px; padding: 6px 10px; border-radius: 8px; background: var(--herald-hover); color: var(--herald-muted); font-size: 13px; }
.bar { display: flex; align-items: center; gap: 6px; padding: 0 16px 8px; border-bottom: 1px solid var(--herald-line); }
.tab { padding: 5px 12px; border: 1px solid var(--herald-line); border-radius: 999px; background: none; font-size: 13px; }
.tab[aria-pressed="true"] { background: var(--herald-accent); border-color: var(--herald-accent); color: var(--herald-on-accent); }
.link { margin-left: auto; padding: 4px; border: 0; background: none; color: var(--herald-accent); font-size: 13px; text-decoration: underline; }
.link:disabled { color: var(--herald-muted); cursor: default; text-decoration: none; }
.scroll { flex: 1; overflow-y: auto; }
ul { margin: 0; padding: 0; list-style: none; }
li { border-bottom: 1px solid var(--herald-line); }
li.dismissed .main { opacity: .65; }
li.dismissed .title { text-decoration: line-through; }
.main { display: grid; grid-template-columns: 12px 1fr; gap: 2px 8px; width: 100%; padding: 12px 16px 4px; border: 0; background: none; text-align: left; }
.main:hover { background: var(--herald-hover); }
.dot { width: 8px; height: 8px; margin-top: 6px; border-radius: 50%; }
li.unread .dot { background: var(--herald-accent); }
.title { font-weight: 600; overflow-wrap: anywhere; }
.body, .time { grid-column: 2; color: var(--herald-muted); font-size: 13px; overflow-wrap: anywhere; }
.time { font-size: 12px; }
.actions { display: flex; gap: 2px; padding: 0 12px 8px 32px; }
.actions .icon { width: 28px; height: 28px; }
.actions svg { width: 16px; height: 16px; }
.picker { display: flex; flex-wrap: wrap; gap: 6px; margin: 0 16px 12px 36px; padding: 8px; border: 1px solid var(--herald-line); border-radius: 8px; }
.picker legend { font-size: 12px; color: var(--herald-muted); }
.picker button, .picker input { padding: 4px 8px; border: 1px solid var(--herald-line); border-radius: 6px; background: var(--herald-bg); color: inherit; font: inherit; font-size: 13px; }
.empty { padding: 48px 16px; color: var(--herald-muted); text-align: center; }
.prefs { padding: 12px 16px; }
.prefs p { margin: 0 0 12px; color: var(--herald-muted); font-size: 13px; }
table { width: 100%; border-collapse: collapse; font-size: 14px; }
th, td { padding: 8px 4px; border-bottom: 1px solid var(--herald-line); text-align: left; }
td:not(:first-child), th:not(:first-child) { width: 64px; text-align: center; }
input[role="switch"] { appearance: none; position: relative; width: 34px; height: 20px; margin: 0; border-radius: 10px;
  background: var(--herald-switch-off); cursor: pointer; vertical-align: middle; }
input[role="switch"]::before { content: ''; position: absolute; top: 2px; left: 2px; width: 16px; height: 16px;
  border-radius: 50%; background: #fff; transition: transform .15s; }
input[role="switch"]:checked { background: var(--herald-accent); }
input[role="switch"]:checked::before { transform: translateX(14px); }
input[role="switch"]:disabled { opacity: .6; cursor: default; }
.note { display: block; color: var(--herald-muted); font-size: 12px; }
.push { display: flex; flex-wrap: wrap; align-items: center; gap: 8px; padding: 10px 16px; border-top: 1px solid var(--herald-line); font-size: 13px; }
.push button { padding: 5px 12px; border: 1px solid var(--herald-accent); border-radius: 999px; background: none; color: var(--herald-accent); }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
[hidden] { display: none !important; }
`;

function svg(name) {
  return `<svg viewBox="0 0 24 24" aria-hidden="true"><path d="${ICONS[name]}"/></svg>`;
}

/** RFC 6901: the value at `pointer` in `obj`, or undefined. */
export function jsonPointer(obj, pointer) {
  if (!pointer) return obj;
  let v = obj;
  for (const raw of pointer.replace(/^\//, '').split('/')) {
    if (v == null || typeof v !== 'object') return undefined;
    v = v[raw.replace(/~1/g, '/').replace(/~0/g, '~')];
  }
  return v;
}

/** The snooze picker's ends, as Dates, from `now`: evenings at 18:00, mornings at 8:00, next week Monday 8:00. */
export function snoozeChoices(now = new Date()) {
  const at = (days, hour) => {
    const d = new Date(now);
    d.setDate(d.getDate() + days);
    d.setHours(hour, 0, 0, 0);
    return d;
  };
  const choices = { hour: new Date(now.getTime() + 3_600_000), morning: at(1, 8), week: at(((8 - now.getDay()) % 7) || 7, 8) };
  if (now.getHours() < 17) choices.evening = at(0, 18); // later than 17:00, "this evening" is too near to offer
  return choices;
}

function format(template, values) {
  return template.replace(/\{(\w+)\}/g, (m, k) => (k in values ? String(values[k]) : m));
}

/** Visible in a tab: snoozed ones stay out until they wake; Unread also leaves out dismissed ones. */
function inTab(n, tab) {
  if (n.userActionState === 'snoozed') return false;
  return tab === 'all' || (n.readState === 'unread' && n.userActionState !== 'dismissed');
}

export class HeraldInbox extends HTMLElement {
  static observedAttributes = ['url', 'device-id', 'token-url', 'lang', 'title-pointer', 'body-pointer', 'push', 'groups'];

  constructor() {
    super();
    this._strings = { ...STRINGS };
    this._tokenProvider = null;
    this._client = null;
    this._off = [];
    this._tab = 'unread';
    this._view = 'list';
    this._limit = PAGE;
    this._known = new Set(); // ids shown so far: an upsert of another id is announced as new
    this._items = new Map(); // id -> li, reused across renders so focus stays where it was
    this._snoozing = null;   // id whose picker is open
    this._counts = null;
    this._wasLive = null;    // live at the last status other than 'connecting'
    this._restart = null;
    this._clock = null;
    const root = this.attachShadow({ mode: 'open' });
    root.innerHTML = `<style>${CSS}</style>
<button type="button" class="bell" part="bell" aria-haspopup="dialog" aria-expanded="false">${svg('bell')}<span class="badge" part="badge" aria-hidden="true" hidden></span></button>
<dialog part="panel" aria-labelledby="h">
  <div class="head" part="header"><h2 id="h"></h2>
    <button type="button" class="icon prefs-toggle" aria-pressed="false">${svg('prefs')}</button>
    <button type="button" class="icon close">${svg('close')}</button></div>
  <p class="offline" part="offline" hidden></p>
  <div class="bar" part="tabs">
    <button type="button" class="tab" part="tab" data-tab="unread" aria-pressed="true"></button>
    <button type="button" class="tab" part="tab" data-tab="all" aria-pressed="false"></button>
    <button type="button" class="link read-all" part="action"></button>
  </div>
  <div class="scroll">
    <ul part="list" class="list"></ul>
    <p class="empty" part="empty" hidden></p>
    <div class="more" aria-hidden="true"></div>
    <section class="prefs" part="preferences" aria-labelledby="ph" hidden><h3 id="ph" class="sr"></h3><p></p>
      <table><thead><tr><th scope="col"><span class="sr"></span></th><th scope="col"></th><th scope="col"></th></tr></thead><tbody></tbody></table>
    </section>
  </div>
  <div class="push" part="push" hidden><button type="button"></button><span role="status"></span></div>
  <div class="sr" aria-live="polite"></div>
</dialog>
<div class="sr" aria-live="polite"></div>`;
    const $ = (s) => root.querySelector(s);
    this._el = {
      bell: $('.bell'), badge: $('.badge'), dialog: $('dialog'), heading: $('#h'), prefsToggle: $('.prefs-toggle'),
      close: $('.close'), offline: $('.offline'), bar: $('.bar'), tabs: [...root.querySelectorAll('.tab')],
      readAll: $('.read-all'), scroll: $('.scroll'), list: $('.list'), empty: $('.empty'), more: $('.more'),
      prefs: $('.prefs'), prefsBody: $('tbody'), push: $('.push'),
      // A modal dialog makes all outside it inert, live regions too: one inside it, one for while it is closed.
      live: [...root.querySelectorAll('[aria-live]')],
    };
    this._wire();
  }

  // ------------------------------------------------------------------ public API

  /** async () => token (or {token}): how the inbox gets device tokens; setting it (re)connects. */
  get tokenProvider() { return this._tokenProvider; }
  set tokenProvider(fn) {
    this._tokenProvider = fn;
    this._scheduleRestart();
  }

  /** Replaces any of the built-in strings ({count}, {title}, {time}, {message} are filled in). */
  get strings() { return { ...this._strings }; }
  set strings(s) {
    this._strings = { ...STRINGS, ...s };
    this._renderStatic();
    this._render();
  }

  /** The HeraldClient underneath, once connected (for apps that want more of it). */
  get client() { return this._client; }

  open() {
    if (this._el.dialog.open) return;
    this._el.dialog.showModal();
    this._el.bell.setAttribute('aria-expanded', 'true');
    this._clock = setInterval(() => this._render(), 30_000); // relative times move on
    this._render();
    this._seenAll();
  }

  close() { if (this._el.dialog.open) this._el.dialog.close(); }

  // ------------------------------------------------------------------ lifecycle

  connectedCallback() {
    this._renderStatic();
    this._scheduleRestart();
  }

  disconnectedCallback() { this._stop(); }

  attributeChangedCallback(name) {
    if (!this.isConnected) return;
    if (['url', 'device-id', 'token-url'].includes(name)) this._scheduleRestart();
    else if (name === 'push') this._renderPush();
    else { this._renderStatic(); this._render(); this._renderPrefs(); }
  }

  /** Attributes and tokenProvider are often set one after the other: connect once, after them all. */
  _scheduleRestart() {
    if (this._restart || !this.isConnected) return;
    this._restart = Promise.resolve().then(() => {
      this._restart = null;
      this._start();
    });
  }

  _tokenSource() {
    if (this._tokenProvider) return this._tokenProvider;
    const url = this.getAttribute('token-url');
    if (!url) return null;
    // As herald-sw.js asks it: GET ?deviceId=, with the page's cookies; the token as text or JSON {token}.
    return async () => {
      const u = new URL(url, location.href);
      u.searchParams.set('deviceId', this.getAttribute('device-id'));
      const r = await fetch(u, { credentials: 'same-origin', cache: 'no-store' });
      if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
      const text = await r.text();
      try { return JSON.parse(text).token; } catch { return text.trim(); }
    };
  }

  _start() {
    this._stop();
    const getToken = this._tokenSource();
    const deviceId = this.getAttribute('device-id');
    if (!getToken || !deviceId) return; // waiting for them
    const client = new HeraldClient({
      baseUrl: this.getAttribute('url') || undefined,
      getToken, deviceId, platform: 'web',
      transport: this.getAttribute('transport') || 'auto',
      storagePrefix: 'herald-inbox', // apart from any HeraldClient of the app's own for the same device
    });
    this._client = client;
    const on = (ev, fn) => this._off.push(client.on(ev, fn));
    // A change's event comes before the list that holds it: ids are known once listed (a reset included).
    on('notifications', (list) => {
      for (const n of list) this._known.add(n.id);
      this._render();
    });
    on('unread', () => this._render());
    on('unseen', () => this._renderBadge());
    on('status', (s) => this._renderStatus(s));
    on('preferences', () => this._renderPrefs());
    on('change', (c) => {
      this._announceArrival(c);
      this._emit('herald-change', c);
    });
    client.start();
    this._renderStatus(client.status);
    this._render();
    this._renderPush();
  }

  _stop() {
    for (const off of this._off) off();
    this._off = [];
    this._client?.stop();
    this._client = null;
    this._wasLive = null;
    this._known.clear();
    this._items.clear();
    this._el.list.replaceChildren();
  }

  // ------------------------------------------------------------------ events from the user

  _wire() {
    const el = this._el;
    el.bell.addEventListener('click', () => this.open());
    el.close.addEventListener('click', () => this.close());
    el.dialog.addEventListener('close', () => {
      el.bell.setAttribute('aria-expanded', 'false');
      clearInterval(this._clock);
      this._snoozing = null;
      el.bell.focus();
    });
    el.dialog.addEventListener('click', (e) => { if (e.target === el.dialog) this.close(); }); // the backdrop
    el.dialog.addEventListener('cancel', (e) => {
      if (!this._snoozing) return;
      e.preventDefault(); // Esc closes the snooze picker first, then the panel
      const li = this._items.get(this._snoozing);
      this._snoozing = null;
      this._render();
      li?.querySelector('[data-action="snooze"]').focus();
    });
    el.dialog.addEventListener('keydown', (e) => { if (e.key === 'Tab') this._trapTab(e); });
    for (const t of el.tabs) t.addEventListener('click', () => this._showTab(t.dataset.tab));
    el.prefsToggle.addEventListener('click', () => this._showView(this._view === 'prefs' ? 'list' : 'prefs'));
    el.readAll.addEventListener('click', () => this._act(() => this._client.markAllRead(), 'announceAllRead'));
    el.list.addEventListener('click', (e) => this._onItemClick(e));
    el.prefsBody.addEventListener('change', (e) => {
      e.target.setAttribute('aria-checked', String(e.target.checked));
      this._savePref(e.target);
    });
    el.push.querySelector('button').addEventListener('click', () => this._enablePush());
    // Paging: the next PAGE items when the end of the list scrolls into view.
    new IntersectionObserver((entries) => {
      if (!entries.some((x) => x.isIntersecting) || this._limit >= this._visible().length) return;
      this._limit += PAGE;
      this._render();
    }, { root: el.scroll, rootMargin: '120px' }).observe(el.more);
  }

  /** A modal dialog makes the page inert, but Tab would still leave for the browser's own UI: wrap around. */
  _trapTab(e) {
    const all = [...this.shadowRoot.querySelectorAll('dialog button, dialog input')]
      .filter((x) => !x.disabled && x.getClientRects().length > 0);
    const first = all[0], last = all[all.length - 1];
    const current = this.shadowRoot.activeElement;
    if (e.shiftKey ? current === first : current === last) {
      e.preventDefault();
      (e.shiftKey ? last : first).focus();
    }
  }

  _showTab(tab) {
    this._tab = tab;
    this._limit = PAGE;
    this._showView('list');
  }

  _showView(view) {
    this._view = view;
    if (view === 'prefs' && !this._client?.preferences) this._client?.fetchPreferences().catch((e) => this._fail(e));
    this._renderStatic();
    this._render();
    this._renderPrefs();
  }

  _onItemClick(e) {
    const button = e.target.closest('button');
    const li = e.target.closest('li[data-id]');
    if (!button || !li) return;
    const id = li.dataset.id;
    const n = this._client?.notifications.find((x) => x.id === id);
    if (!n) return;
    const c = this._client;
    const action = button.dataset.action;
    if (action === 'activate') {
      this._act(() => c.activate(id, { markRead: true }), null, li);
      this._emit('herald-activate', { notification: n });
    } else if (action === 'toggle-read') {
      const read = n.readState === 'unread';
      this._act(() => (read ? c.markRead(id) : c.markUnread(id)), read ? 'announceRead' : 'announceUnread', li);
    } else if (action === 'dismiss') {
      // Herald's clients dismiss and read in one: a user who dismisses expects the count to drop (PROTOCOL 5.6).
      this._act(() => c.dismiss(id, { markRead: true }), 'announceDismissed', li);
    } else if (action === 'delete') {
      this._act(() => c.remove(id), 'announceDeleted', li);
    } else if (action === 'snooze') {
      this._snoozing = this._snoozing === id ? null : id;
      this._renderItem(li, n);
      if (this._snoozing) li.querySelector('.picker button')?.focus();
    } else if (action === 'snooze-at') {
      const input = li.querySelector('.picker input');
      const until = button.dataset.choice === 'at' ? new Date(input.value) : snoozeChoices()[button.dataset.choice];
      if (!(until > new Date())) { input.focus(); return; }
      this._snoozing = null;
      // Read too, so the badge and Unread drop while it sleeps; Herald makes it unread and unseen when it wakes.
      this._act(() => c.snooze(id, until, { markRead: true }), ['announceSnoozed', { time: this._absTime(until) }], li);
    }
  }

  /**
   * Runs an action and says how it went. `from`: the item it empties, whose
   * focus moves to a neighbour rather than be lost with it.
   */
  async _act(fn, say, from) {
    const next = from && (from.nextElementSibling || from.previousElementSibling);
    const hadFocus = from?.contains(this.shadowRoot.activeElement);
    try {
      await fn();
      if (say) this._announce(...[].concat(say));
      if (hadFocus && !from.isConnected) (next?.isConnected ? next.querySelector('.main') : this._el.tabs[0]).focus();
    } catch (e) {
      this._fail(e);
    }
  }

  async _seenAll() {
    if (!this._client || this._client.unseen === 0) return;
    try { await this._client.seenAll(); } catch (e) { this._fail(e); }
  }

  _savePref(input) {
    const prefs = this._client?.preferences;
    if (!prefs) return;
    const { group, channel } = input.dataset;
    const changes = group
      ? { groups: { ...prefs.groups, [group]: { ...prefs.groups[group], [channel]: input.checked } } }
      : { default: { ...prefs.default, [channel]: input.checked } };
    this._client.savePreferences(changes, { ifVersion: prefs.version }).then(
      () => this._announce('prefsSaved'),
      (e) => {
        if (e.code !== 'precondition_failed') { this._fail(e); this._renderPrefs(); return; }
        this._announce('prefsStale');
        this._client.fetchPreferences().catch((e2) => this._fail(e2));
      });
  }

  async _enablePush() {
    const status = this._el.push.querySelector('[role="status"]');
    try {
      // Asked first, in the click: some browsers prompt only during a user gesture.
      if (globalThis.Notification?.permission === 'default') await Notification.requestPermission();
      const registration = await navigator.serviceWorker.register(this.getAttribute('service-worker') || 'herald-sw.js');
      await this._client.enablePush(registration, { tokenUrl: this.getAttribute('token-url') ?? undefined });
      status.textContent = this._strings.pushOn;
      this._el.push.querySelector('button').hidden = true;
    } catch (e) {
      status.textContent = format(this._strings.pushFailed, { message: e.message });
    }
  }

  // ------------------------------------------------------------------ rendering

  _lang() {
    return this.closest('[lang]')?.getAttribute('lang') || document.documentElement.lang || navigator.language;
  }

  /** Labels that depend on strings, the tab and the view, not on the notifications. */
  _renderStatic() {
    const s = this._strings, el = this._el;
    el.heading.textContent = s.title;
    el.close.setAttribute('aria-label', s.close);
    el.prefsToggle.setAttribute('aria-label', s.preferences);
    el.prefsToggle.setAttribute('aria-pressed', String(this._view === 'prefs'));
    el.readAll.textContent = s.markAllRead;
    el.bar.hidden = this._view !== 'list';
    el.prefs.hidden = this._view !== 'prefs';
    el.prefs.querySelector('h3').textContent = s.preferences;
    el.prefs.querySelector('p').textContent = s.prefsHint;
    const ths = el.prefs.querySelectorAll('th');
    ths[0].firstChild.textContent = s.preferences;
    ths[1].textContent = s.prefsInbox;
    ths[2].textContent = s.prefsPush;
    el.push.querySelector('button').textContent = s.push;
    for (const t of el.tabs) t.setAttribute('aria-pressed', String(t.dataset.tab === this._tab));
    this._renderBadge();
    this._renderStatus(this._client?.status ?? 'connecting');
  }

  _renderBadge() {
    const n = this._client?.unseen ?? 0;
    this._el.badge.hidden = n === 0;
    this._el.badge.textContent = n > 99 ? '99+' : String(n);
    this._el.bell.setAttribute('aria-label', n ? format(this._strings.bellUnseen, { count: n }) : this._strings.bell);
    this._emitCounts();
    // New arrivals while the panel is open are in front of the user: seen.
    if (n && this._el.dialog.open && this._client?.status === 'live') this._seenAll();
  }

  _renderStatus(status) {
    const live = status === 'live';
    // Only a change after the first connection is news; null until then.
    if (status !== 'connecting') {
      if (this._wasLive != null && live !== this._wasLive) this._announce(live ? 'announceOnline' : 'announceOffline');
      this._wasLive = live;
    }
    this._el.offline.hidden = live;
    this._el.offline.textContent = status === 'connecting' ? this._strings.connecting : this._strings.offline;
    this.dataset.status = status; // for styling the host from the page: herald-inbox[data-status="live"]
  }

  _visible() {
    return (this._client?.notifications ?? []).filter((n) => inTab(n, this._tab));
  }

  _render() {
    const el = this._el, s = this._strings;
    const all = this._client?.notifications ?? [];
    const unread = this._client?.unread ?? 0;
    el.tabs[0].textContent = `${s.unread} (${unread})`;
    el.tabs[1].textContent = `${s.all} (${all.filter((n) => inTab(n, 'all')).length})`;
    el.readAll.disabled = unread === 0;
    this._emitCounts();
    if (!el.dialog.open) return; // rendered when it opens
    const shown = this._view === 'list' ? this._visible().slice(0, this._limit) : [];
    const keep = new Set(shown.map((n) => n.id));
    for (const [id, li] of this._items) {
      if (!keep.has(id)) { li.remove(); this._items.delete(id); }
    }
    shown.forEach((n, i) => {
      let li = this._items.get(n.id);
      if (!li) {
        li = document.createElement('li');
        li.dataset.id = n.id;
        li.setAttribute('part', 'item');
        this._items.set(n.id, li);
      }
      this._renderItem(li, n);
      // Move only what is out of place: a node taken out of the document loses focus.
      if (el.list.children[i] !== li) el.list.insertBefore(li, el.list.children[i] ?? null);
    });
    el.empty.hidden = this._view !== 'list' || shown.length > 0;
    el.empty.textContent = this._tab === 'unread' ? s.empty : s.emptyAll;
  }

  _renderItem(li, n) {
    const s = this._strings;
    const title = this._title(n);
    const body = jsonPointer(n.payload, this.getAttribute('body-pointer') ?? '/body');
    const unread = n.readState === 'unread';
    const dismissed = n.userActionState === 'dismissed';
    // What it shows, not its version: a seen-all changes nothing here, and a redraw under a pointer loses the click.
    const key = JSON.stringify([n.readState, n.userActionState, title, body, n.createdAt, this._snoozing === n.id,
      this._strings, this._relTime(n.createdAt)]);
    if (li.dataset.key === key) return; // unchanged: keep the DOM (and its focus) as it is
    li.dataset.key = key;
    li.dataset.readState = n.readState;
    li.dataset.state = n.userActionState;
    li.className = `${unread ? 'unread' : 'read'}${dismissed ? ' dismissed' : ''}`;
    const focused = this.shadowRoot.activeElement;
    const refocus = li.contains(focused) ? focused.dataset.action + (focused.dataset.choice ?? '') : null;
    const typed = li.querySelector('.picker input')?.value; // a time being chosen survives a redraw
    li.innerHTML = `
<button type="button" class="main" part="item-main" data-action="activate">
  <span class="dot" part="unread-dot"></span><span class="title" part="item-title"></span>
  ${body != null ? '<span class="body" part="item-body"></span>' : ''}
  <span class="time" part="item-time"><time></time><span class="state"></span></span>
</button>
<div class="actions">
  <button type="button" class="icon" part="action" data-action="toggle-read">${svg(unread ? 'read' : 'unread')}</button>
  <button type="button" class="icon" part="action" data-action="snooze" aria-expanded="${this._snoozing === n.id}">${svg('snooze')}</button>
  ${dismissed ? '' : `<button type="button" class="icon" part="action" data-action="dismiss">${svg('dismiss')}</button>`}
  <button type="button" class="icon" part="action" data-action="delete">${svg('delete')}</button>
</div>`;
    const q = (sel) => li.querySelector(sel);
    q('.title').textContent = title;
    if (body != null) q('.body').textContent = String(body);
    q('time').dateTime = n.createdAt;
    q('time').textContent = this._relTime(n.createdAt);
    q('time').title = this._absTime(n.createdAt);
    const state = [unread ? s.unread : '', dismissed ? s.dismissed : ''].filter(Boolean).join(', ');
    q('.state').textContent = state ? ` · ${state}` : '';
    for (const [action, label] of [['toggle-read', unread ? s.markRead : s.markUnread], ['snooze', s.snooze],
      ['dismiss', s.dismiss], ['delete', s.delete]]) {
      const b = q(`[data-action="${action}"]`);
      if (b) { b.setAttribute('aria-label', `${label}: ${title}`); b.title = label; }
    }
    if (this._snoozing === n.id) {
      li.append(this._picker(title));
      if (typed) li.querySelector('.picker input').value = typed;
    }
    if (refocus) li.querySelectorAll('[data-action]').forEach((b) => {
      if (b.dataset.action + (b.dataset.choice ?? '') === refocus) b.focus();
    });
  }

  _picker(title) {
    const s = this._strings;
    const box = document.createElement('fieldset');
    box.className = 'picker';
    box.setAttribute('part', 'snooze-picker');
    const legend = document.createElement('legend');
    legend.textContent = `${s.snoozeFor}: ${title}`;
    box.append(legend);
    const choices = snoozeChoices();
    for (const [choice, label] of [['hour', s.snoozeHour], ['evening', s.snoozeEvening], ['morning', s.snoozeMorning], ['week', s.snoozeWeek]]) {
      if (!choices[choice]) continue;
      const b = document.createElement('button');
      Object.assign(b, { type: 'button', textContent: label, title: this._absTime(choices[choice]) });
      Object.assign(b.dataset, { action: 'snooze-at', choice });
      box.append(b);
    }
    const input = document.createElement('input');
    input.type = 'datetime-local';
    input.setAttribute('aria-label', s.snoozeAt);
    const apply = document.createElement('button');
    Object.assign(apply, { type: 'button', textContent: s.snoozeApply });
    Object.assign(apply.dataset, { action: 'snooze-at', choice: 'at' });
    box.append(input, apply);
    return box;
  }

  _title(n) {
    return String(jsonPointer(n.payload, this.getAttribute('title-pointer') ?? '/title') ?? '');
  }

  _relTime(iso) {
    const secs = (Date.parse(iso) - Date.now()) / 1000;
    const rtf = new Intl.RelativeTimeFormat(this._lang(), { numeric: 'auto' });
    for (const [unit, size] of [['year', 31_536_000], ['month', 2_592_000], ['week', 604_800], ['day', 86_400], ['hour', 3600], ['minute', 60]]) {
      if (Math.abs(secs) >= size) return rtf.format(Math.round(secs / size), unit);
    }
    return rtf.format(0, 'second'); // "now"
  }

  _absTime(t) {
    return new Intl.DateTimeFormat(this._lang(), { dateStyle: 'medium', timeStyle: 'short' }).format(new Date(t));
  }

  /** A switch per group and channel: groups saved, critical ones, ones seen in the list and the `groups` attribute. */
  _renderPrefs() {
    const prefs = this._client?.preferences;
    if (this._view !== 'prefs' || !prefs) return;
    const s = this._strings;
    const names = new Set([...(this.getAttribute('groups') || '').split(',').map((g) => g.trim()).filter(Boolean),
      ...Object.keys(prefs.groups), ...prefs.critical]);
    for (const n of this._client.notifications) if (n.groupName) names.add(n.groupName);
    const rows = [[null, s.prefsDefault], ...[...names].sort().map((g) => [g, g])];
    const focused = this.shadowRoot.activeElement;
    const refocus = focused?.dataset.channel ? `${focused.dataset.group ?? ''}|${focused.dataset.channel}` : null;
    this._el.prefsBody.replaceChildren(...rows.map(([group, label]) => {
      const tr = document.createElement('tr');
      const th = document.createElement('th');
      th.scope = 'row';
      th.textContent = label;
      const critical = group != null && prefs.critical.includes(group);
      if (critical) {
        const note = document.createElement('span');
        note.className = 'note';
        note.textContent = s.prefsCritical;
        th.append(note);
      }
      tr.append(th);
      for (const channel of ['inbox', 'push']) {
        const input = document.createElement('input');
        input.type = 'checkbox';
        input.setAttribute('role', 'switch');
        input.setAttribute('part', 'switch');
        input.setAttribute('aria-label', `${label}: ${channel === 'inbox' ? s.prefsInbox : s.prefsPush}`);
        input.dataset.channel = channel;
        if (group != null) input.dataset.group = group;
        input.checked = group == null ? prefs.default[channel] : HeraldClient.allows(prefs, channel, group);
        input.disabled = critical;
        input.setAttribute('aria-checked', String(input.checked)); // older screen readers read the role's state only
        const td = document.createElement('td');
        td.append(input);
        tr.append(td);
        if (`${group ?? ''}|${channel}` === refocus) queueMicrotask(() => input.focus());
      }
      return tr;
    }));
  }

  _renderPush() {
    const can = this.hasAttribute('push') && 'serviceWorker' in navigator && 'PushManager' in globalThis;
    this._el.push.hidden = !can;
    if (!can || globalThis.Notification?.permission !== 'granted') return;
    // Subscribed on an earlier visit: enable again (idempotent), so the worker gets a fresh token.
    navigator.serviceWorker.getRegistration().then((r) => r?.pushManager.getSubscription())
      .then((sub) => { if (sub) this._enablePush(); }, () => {});
  }


  // ------------------------------------------------------------------ announcing

  _announce(key, values = {}) {
    const [inside, outside] = this._el.live;
    const region = this._el.dialog.open ? inside : outside;
    // Cleared first, so the same words said twice are announced twice.
    inside.textContent = outside.textContent = '';
    const text = format(this._strings[key], values);
    setTimeout(() => { region.textContent = text; }, 50);
  }

  _fail(e) { this._announce('announceFailed', { message: e?.message || String(e) }); }

  /** A notification new to this inbox, or back from a snooze, is announced. */
  _announceArrival(c) {
    if (c.op !== 'upsert') return;
    const n = c.notification;
    const back = n.userActionState === 'noInteraction' && n.readState === 'unread' && n.seenState === 'unseen';
    if ((!this._known.has(n.id) || back) && inTab(n, 'all')) {
      this._announce('announceNew', { title: this._title(n) });
    }
    this._known.add(n.id);
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail, bubbles: true, composed: true }));
  }

  _emitCounts() {
    const c = this._client;
    if (!c) return;
    const counts = { unread: c.unread, unseen: c.unseen, total: c.notifications.filter((n) => inTab(n, 'all')).length };
    const key = JSON.stringify(counts);
    if (key === this._counts) return;
    this._counts = key;
    this._emit('herald-counts', counts);
  }
}

customElements.define('herald-inbox', HeraldInbox);
