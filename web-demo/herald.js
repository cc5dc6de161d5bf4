// herald.js: a small, dependency-free browser client for the Herald gateway.
//
//   import { HeraldClient } from './herald.js';
//   const client = new HeraldClient({ baseUrl, getToken, deviceId: 'phone-1' });
//   client.on('notifications', (list) => render(list));
//   client.start();
//
// client.enablePush(registration) wakes the device through Web Push while no
// page is open; herald-sw.js, beside this file, is the service worker it needs.
//
// Loaded with <script type="module" src="herald.js"> it also sets
// window.Herald = { HeraldClient, HeraldError, sortNotifications }.
//
// Wire contract: SPEC.md sections 1, 2, 4 and 5. The client keeps its cursor,
// epoch and a copy of the notifications it may see in localStorage (one entry
// per deviceId), resumes from that cursor on every (re)connect, applies
// catch-up, reset and live frames in seq order and ignores any change whose
// seq is not after its cursor (delivery is at-least-once across reconnects).

const TRANSPORTS = ['websocket', 'sse', 'poll'];
const PAGE_LIMIT = 500;           // SPEC 4: history and sync limit 1-500
const POLL_WAIT = 25;             // seconds a long-poll is held
const TOKEN_MARGIN_MS = 60_000;   // renew a token this long before its exp
const FALLBACK_AFTER = 2;         // failed attempts before 'auto' tries the next transport
const WS_HANDSHAKE_TIMEOUT_MS = 15_000;
const WS_PING_INTERVAL_MS = 25_000;
const WS_PONG_TIMEOUT_MS = 10_000;
const ACTION_TIMEOUT_MS = 15_000;
const WORKER_TIMEOUT_MS = 30_000; // herald-sw.js answers after catching up: a few gateway requests
const STORAGE_VERSION = 1;

/** An error with the gateway's error code (SPEC 6) or a client-side one. */
export class HeraldError extends Error {
  constructor(code, message, status) {
    super(message || code);
    this.name = 'HeraldError';
    this.code = code;          // 'not_found', 'precondition_failed', 'timeout', 'disconnected', ...
    this.status = status;      // HTTP status when it came over HTTP
  }
}

/** Newest createdAt first; ties: higher id first (ids compared as byte strings). */
export function sortNotifications(list) {
  return list.slice().sort((a, b) => {
    const ta = Date.parse(a.createdAt), tb = Date.parse(b.createdAt);
    if (ta !== tb) return (tb || 0) - (ta || 0);
    return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
  });
}

function decodeJwtClaims(token) {
  try {
    const part = String(token).split('.')[1];
    const b64 = part.replace(/-/g, '+').replace(/_/g, '/');
    const bin = atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4));
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    return null;
  }
}

function defaultStorage() {
  try {
    const s = globalThis.localStorage;
    const probe = '__herald_probe__';
    s.setItem(probe, '1');
    s.removeItem(probe);
    return s;
  } catch {
    return null; // private mode, sandboxed iframe, non-browser: keep state in memory only
  }
}

function base64UrlBytes(s) {
  const b64 = String(s).replace(/-/g, '+').replace(/_/g, '/');
  return Uint8Array.from(atob(b64 + '='.repeat((4 - (b64.length % 4)) % 4)), (c) => c.charCodeAt(0));
}

function sameBytes(buffer, bytes) {
  if (!buffer) return false;
  const a = new Uint8Array(buffer);
  return a.length === bytes.length && a.every((x, i) => x === bytes[i]);
}

/** The registration's worker once it is active (a fresh registration is still installing). */
async function activeWorker(registration) {
  const w = registration.active || registration.waiting || registration.installing;
  if (!w) throw new HeraldError('push_unsupported', 'the service worker registration has no worker');
  while (w.state !== 'activated') {
    if (w.state === 'redundant') throw new HeraldError('push_unsupported', 'the service worker failed to install');
    await new Promise((resolve) => w.addEventListener('statechange', resolve, { once: true }));
  }
  return w;
}

/** Posts a message to herald-sw.js and waits for its answer. */
function tellWorker(worker, msg) {
  return new Promise((resolve, reject) => {
    const channel = new MessageChannel();
    const timer = setTimeout(() => reject(new HeraldError('timeout',
      'the service worker did not answer within 30 s: is it herald-sw.js, and can it reach the gateway?')), WORKER_TIMEOUT_MS);
    channel.port1.onmessage = (ev) => {
      clearTimeout(timer);
      if (ev.data?.ok) resolve();
      else reject(new HeraldError('push_worker', `the service worker refused ${msg.type}: ${ev.data?.error}`));
    };
    worker.postMessage(msg, [channel.port2]);
  });
}

/** A time as Herald reads it: RFC 3339 UTC with milliseconds (a string is sent as given). */
function rfc3339(t) {
  return typeof t === 'string' ? t : new Date(t).toISOString();
}

function randomRef() {
  return Math.random().toString(36).slice(2, 10);
}

export class HeraldClient {
  /**
   * @param {object} options
   * @param {string} [options.baseUrl]   gateway origin, default location.origin
   * @param {string} [options.token]     a device token (static)
   * @param {() => Promise<string|{token:string}>} [options.getToken]
   *        called for the first connect, before the token expires and after the
   *        gateway refuses it; may return the token or an object with `token`
   * @param {string} options.deviceId
   * @param {string} [options.platform]  'web' | 'ios' | 'android' | 'windows' | 'other'
   * @param {string[]} [options.tags]
   * @param {'auto'|'websocket'|'sse'|'poll'} [options.transport='auto']
   * @param {string} [options.storagePrefix='herald']
   * @param {Storage|null} [options.storage] defaults to localStorage; null keeps state in memory
   * @param {number} [options.backoffMinMs=500]
   * @param {number} [options.backoffMaxMs=30000]
   */
  constructor(options = {}) {
    if (!options.deviceId) throw new TypeError('HeraldClient: deviceId is required');
    if (!options.token && typeof options.getToken !== 'function') {
      throw new TypeError('HeraldClient: token or getToken is required');
    }
    const pref = options.transport || 'auto';
    if (pref !== 'auto' && !TRANSPORTS.includes(pref)) {
      throw new TypeError(`HeraldClient: unknown transport ${pref}`);
    }
    const origin = typeof location !== 'undefined' ? location.origin : '';
    this.baseUrl = String(options.baseUrl || origin).replace(/\/+$/, '');
    this.deviceId = options.deviceId;
    this.platform = options.platform;
    this.tags = options.tags;
    this.transportPreference = pref;

    this._token = options.token || null;
    this._getTokenFn = typeof options.getToken === 'function' ? options.getToken : null;
    this._tokenPromise = null;
    this._storage = options.storage !== undefined ? options.storage : defaultStorage();
    this._storageKey = `${options.storagePrefix || 'herald'}:${options.deviceId}`;
    this._backoffMin = options.backoffMinMs ?? 500;
    this._backoffMax = options.backoffMaxMs ?? 30_000;
    this._WebSocket = options.WebSocket || globalThis.WebSocket;
    this._EventSource = options.EventSource || globalThis.EventSource;
    this._fetch = options.fetch || globalThis.fetch?.bind(globalThis);

    this._listeners = new Map();
    this._map = new Map();        // id -> notification
    this._deleted = new Set();    // ids deleted by this client (ids are never reused)
    this._cursor = null;
    this._epoch = null;
    this._scope = null;
    this._unread = null;
    this._unseen = null;          // the gateway's unseen count (welcome/counts frames), else the local one
    this._preferences = null;     // the user's preferences (PROTOCOL 16), from a reset or a save
    this._status = 'offline';
    this._transport = null;

    this._running = false;
    this._gen = 0;                // bumps on every connection attempt; stale callbacks compare it
    this._ladder = pref === 'auto' ? TRANSPORTS.filter((t) => this._supports(t)) : [pref];
    this._ladderIdx = 0;
    this._failures = 0;           // consecutive attempts that never became live
    this._attempt = 0;            // backoff exponent
    this._forceToken = false;
    this._liveSince = 0;
    this._timers = new Set();
    this._queue = Promise.resolve();
    this._cacheShown = false;
    this._attempted = false;
    this._registered = false;    // platform/tags PUT done (HTTP transports)
    this._workedOn = new Set(); // transports that reached 'live' in this client
    this._quiet = false;
    this._ws = null;
    this._wsLive = false;
    this._pending = new Map();    // ref -> {resolve, reject, timer}
    this._resetStaging = null;
    this._es = null;
    this._pollAbort = null;
    this._probe = null;
    this._probeCount = 0;
    this._onOnline = () => this._reconnectNow();
    this._onPageHide = () => this._flush();
    this._persistTimer = null;
    this._pushRegistration = null; // set by enablePush

    this._loadState();
  }

  // ------------------------------------------------------------------ public API

  /** Current notifications, newest createdAt first. */
  get notifications() { return sortNotifications([...this._map.values()]); }
  get unread() { return this._unread ?? this._localUnread(); }
  /** Unseen notifications (seenState "unseen"): what a badge counts. */
  get unseen() { return this._unseen ?? this._localCount('seenState', 'unseen'); }
  get status() { return this._status; }
  get transport() { return this._transport; }
  get cursor() { return this._cursor; }
  get epoch() { return this._epoch; }
  /** The user's preferences (PROTOCOL 16) as the last reset or save brought them; null until then. */
  get preferences() { return this._preferences; }

  /**
   * Events: 'notifications' (list), 'change' (change object), 'reset' (list),
   * 'status' (status, transport), 'unread' (count), 'unseen' (count, from the
   * gateway's welcome and counts frames), 'preferences' (the user's, saved on
   * any device or brought by a reset), 'error' (HeraldError).
   * Returns a function that removes the listener.
   */
  on(event, fn) {
    if (!this._listeners.has(event)) this._listeners.set(event, new Set());
    this._listeners.get(event).add(fn);
    return () => this.off(event, fn);
  }

  off(event, fn) { this._listeners.get(event)?.delete(fn); }

  start() {
    if (this._running) return this;
    this._running = true;
    this._ladderIdx = 0;
    this._failures = 0;
    this._attempt = 0;
    globalThis.addEventListener?.('online', this._onOnline);
    globalThis.addEventListener?.('pagehide', this._onPageHide);
    this._connect();
    return this;
  }

  /** Closes the connection; local state stays (and is used by the next start()). */
  stop() {
    if (!this._running) return;
    this._running = false;
    globalThis.removeEventListener?.('online', this._onOnline);
    globalThis.removeEventListener?.('pagehide', this._onPageHide);
    this._gen++;
    this._teardown();
    for (const t of this._timers) clearTimeout(t);
    this._timers.clear();
    this._flush();
    this._setStatus('offline');
  }

  /** Forgets the local state (cursor, epoch, notifications) and, if running, resyncs from a reset. */
  clearLocalState() {
    this._wipe();
    if (this._running) {
      this._gen++;
      this._teardown();
      this._connect();
    }
  }

  _wipe() {
    this._map.clear();
    this._cursor = null;
    this._epoch = null;
    this._unread = null;
    this._unseen = null;
    this._preferences = null;
    clearTimeout(this._persistTimer);
    this._persistTimer = null;
    try { this._storage?.removeItem(this._storageKey); } catch { /* ignore */ }
    this._emitList();
  }

  markRead(id, opts) { return this.update(id, { readState: 'read' }, opts); }
  markUnread(id, opts) { return this.update(id, { readState: 'unread' }, opts); }
  /** Seen (the bell was opened) without reading it; read also makes it seen. */
  markSeen(id, opts) { return this.update(id, { seenState: 'seen' }, opts); }
  /** opts: { ifVersion?: number, markRead?: boolean } */
  dismiss(id, opts) { return this.update(id, { userActionState: 'dismissed' }, opts); }
  activate(id, opts) { return this.update(id, { userActionState: 'activated' }, opts); }
  /**
   * Snoozes until `until` (a Date, an RFC 3339 string or epoch milliseconds;
   * in the future, at most 365 days ahead), when Herald wakes it: back to
   * unread, unseen and untouched on every device. Without `until` it stays
   * snoozed until something changes it.
   */
  snooze(id, until, opts) {
    if (until != null && typeof until === 'object' && !(until instanceof Date)) [until, opts] = [null, until]; // snooze(id, opts)
    return this.update(id, { userActionState: 'snoozed', snoozedUntil: until }, opts);
  }

  /**
   * Changes a notification's state: fields { readState?, seenState?,
   * userActionState?, snoozedUntil? } (read also makes it seen; snoozedUntil
   * alone moves the time of a snoozed one), opts { ifVersion?, markRead? }.
   * Resolves to { notification, seq }.
   */
  async update(id, fields, opts = {}) {
    const body = {};
    if (fields.readState) body.readState = fields.readState;
    if (fields.seenState) body.seenState = fields.seenState;
    if (fields.userActionState) body.userActionState = fields.userActionState;
    if (fields.snoozedUntil != null) body.snoozedUntil = rfc3339(fields.snoozedUntil);
    if (opts.markRead) body.readState = 'read';
    const ifVersion = opts.ifVersion ?? fields.ifVersion;
    let result;
    const overHttp = () => {
      const headers = ifVersion != null ? { 'If-Match': `"${ifVersion}"` } : {};
      return this._http('PATCH', `/v1/me/notifications/${encodeURIComponent(id)}`, { body, headers });
    };
    try {
      if (this._wsUsable()) {
        const frame = { type: 'update', id, ...body };
        if (ifVersion != null) frame.ifVersion = ifVersion;
        try {
          result = await this._wsRequest(frame);
        } catch (e) {
          // Setting a state is idempotent: when the socket died first, say it over HTTP.
          if (e.code !== 'disconnected' && e.code !== 'timeout') throw e;
          result = await overHttp();
        }
      } else {
        result = await overHttp();
      }
    } catch (e) {
      if (e.code === 'not_found') this._applyLocal({ op: 'delete', id }); // gone for this device
      throw e;
    }
    if (result?.notification) this._applyLocal({ op: 'upsert', notification: result.notification });
    return { notification: result?.notification ?? null, seq: result?.seq ?? null };
  }

  /** Deletes a notification for the user (every device). Resolves to { seq }. */
  async remove(id) {
    let result = null;
    const overHttp = () => this._http('DELETE', `/v1/me/notifications/${encodeURIComponent(id)}`);
    try {
      if (this._wsUsable()) {
        try {
          result = await this._wsRequest({ type: 'delete', id });
        } catch (e) {
          if (e.code !== 'disconnected' && e.code !== 'timeout') throw e;
          // The socket died first: the delete may have been done; a 404 now means it was.
          try { await overHttp(); } catch (e2) { if (e2.code !== 'not_found') throw e2; }
        }
      } else {
        await overHttp();
      }
    } catch (e) {
      if (e.code === 'not_found') this._applyLocal({ op: 'delete', id });
      throw e;
    }
    this._applyLocal({ op: 'delete', id });
    return { seq: result?.seq ?? null };
  }

  /** Marks every unread notification this device may see read (HTTP). */
  markAllRead() {
    return this._http('POST', '/v1/me/notifications/read-all', { body: {} });
  }

  /** Marks every unseen notification this device may see seen (HTTP): the bell was opened. */
  seenAll() {
    return this._http('POST', '/v1/me/notifications/seen-all', { body: {} });
  }

  /** Asks the gateway for the user's preferences (PROTOCOL 16). */
  async fetchPreferences() {
    const r = await this._http('GET', '/v1/me/preferences');
    this._takePreferences(r.preferences, true);
    return r.preferences;
  }

  /**
   * Saves preferences for the user on every device: `default` and `groups`
   * replace what is saved when given (`groups: {}` clears them). With
   * `ifVersion`, a save made elsewhere meanwhile rejects (precondition_failed).
   * @param {{default?: {inbox?: boolean, push?: boolean}, groups?: object}} changes
   * @param {{ifVersion?: number}} [opts]
   */
  async savePreferences(changes, opts = {}) {
    const headers = opts.ifVersion != null ? { 'If-Match': `"${opts.ifVersion}"` } : {};
    const r = await this._http('PUT', '/v1/me/preferences', { body: changes, headers });
    this._takePreferences(r.preferences, false);
    return r.preferences;
  }

  /** Whether a notification of `group` reaches `channel` ('inbox' or 'push') under `prefs`. */
  static allows(prefs, channel, group) {
    if (group != null && prefs.critical.includes(group)) return true;
    return prefs.groups[group]?.[channel] ?? prefs.default[channel] ?? true;
  }

  /**
   * `whole`: a reset's or an answer's, taken as they are (a feed that lost
   * its history starts again at version 0); else a save's, taken only when
   * newer, since a reset read after its cursor may already hold it.
   */
  _takePreferences(p, whole) {
    if (!p || typeof p.version !== 'number') return;
    if (!whole && this._preferences && p.version <= this._preferences.version) return;
    if (JSON.stringify(p) === JSON.stringify(this._preferences)) return;
    this._preferences = p;
    this._persist();
    this._emit('preferences', p);
  }

  // ------------------------------------------------------------------ Web Push

  /**
   * Wakes this device through Web Push while no page holds a connection
   * (PROTOCOL 15): subscribes the browser with the app's VAPID key from
   * GET /v1/me/push, registers the subscription on this device and hands
   * the service worker (herald-sw.js) the gateway URL, device id and token.
   * Idempotent: call it on each visit once permission is granted, so the
   * worker gets fresh tokens. Resolves to the device as the gateway lists it.
   * @param {ServiceWorkerRegistration} registration  of herald-sw.js
   * @param {object} [options]
   * @param {string} [options.tokenUrl]  same-origin URL where the worker gets a new token
   *        (GET ?deviceId=..., with the page's cookies; answers the token, or JSON with `token`)
   * @param {string} [options.appUrl]    the page a click opens, default the worker's scope
   */
  async enablePush(registration, options = {}) {
    if (!registration?.pushManager) {
      throw new HeraldError('push_unsupported', 'enablePush needs a ServiceWorkerRegistration with a pushManager (a browser with Web Push, on https or localhost)');
    }
    const worker = await activeWorker(registration);
    const { webPushPublicKey } = await this._http('GET', '/v1/me/push');
    if (!webPushPublicKey) {
      throw new HeraldError('push_unavailable', 'this app has no Web Push on the gateway (GET /v1/me/push gave no webPushPublicKey)');
    }
    if (globalThis.Notification?.permission === 'denied') {
      throw new HeraldError('permission_denied', 'notifications are blocked for this site; the user can allow them in the browser settings');
    }
    const key = base64UrlBytes(webPushPublicKey);
    let sub = await registration.pushManager.getSubscription();
    if (sub && !sameBytes(sub.options?.applicationServerKey, key)) {
      await sub.unsubscribe(); // made under another VAPID key: the gateway could not push to it
      sub = null;
    }
    if (!sub) {
      try {
        sub = await registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
      } catch (e) {
        if (e?.name === 'NotAllowedError') {
          throw new HeraldError('permission_denied', `the browser refused notifications: ${e.message}`);
        }
        throw new HeraldError('push_subscribe_failed', `pushManager.subscribe failed: ${e?.message || e}`);
      }
    }
    const body = { push: { service: 'webpush', subscription: sub.toJSON() } };
    if (this.platform) body.platform = this.platform;
    const { device } = await this._http('PUT', `/v1/me/devices/${encodeURIComponent(this.deviceId)}`, { body });
    await tellWorker(worker, {
      type: 'herald-push-config', baseUrl: this.baseUrl, deviceId: this.deviceId, token: await this._tokenFor(),
      tokenUrl: options.tokenUrl ?? null, appUrl: options.appUrl ?? null,
    });
    this._pushRegistration = registration; // its worker gets every token this client renews from now on
    return device;
  }

  /**
   * Undoes enablePush: the gateway forgets the subscription first ("push": null),
   * then the browser drops it and the worker forgets the device.
   * @param {ServiceWorkerRegistration} [registration] default: enablePush's, or this page's
   */
  async disablePush(registration) {
    const reg = registration ?? this._pushRegistration ?? await globalThis.navigator?.serviceWorker?.getRegistration();
    await this._http('PUT', `/v1/me/devices/${encodeURIComponent(this.deviceId)}`, { body: { push: null } });
    this._pushRegistration = null;
    if (!reg) return;
    await (await reg.pushManager?.getSubscription())?.unsubscribe();
    if (reg.active) await tellWorker(reg.active, { type: 'herald-push-forget' });
  }

  // ------------------------------------------------------------------ events

  _emit(event, ...args) {
    const set = this._listeners.get(event);
    if (!set) return;
    for (const fn of [...set]) {
      try { fn(...args); } catch (e) { console.error(`herald: '${event}' listener failed`, e); }
    }
  }

  _setStatus(status, transport = this._transport) {
    if (status === this._status && transport === this._transport) return;
    this._status = status;
    this._transport = transport;
    this._emit('status', status, transport);
  }

  _emitList() {
    this._emit('notifications', this.notifications);
    this._emitUnreadIfLocal();
  }

  _localUnread() { return this._localCount('readState', 'unread'); }

  _localCount(field, value) {
    let n = 0;
    for (const x of this._map.values()) if (x[field] === value) n++;
    return n;
  }

  _setUnseen(n) {
    if (typeof n !== 'number' || n === this._unseen) return;
    this._unseen = n;
    this._emit('unseen', n);
  }

  _setUnread(n) {
    if (typeof n !== 'number' || n === this._unread) return;
    this._unread = n;
    this._emit('unread', n);
  }

  _emitUnreadIfLocal() {
    // On WebSocket the gateway's welcome/counts frames are authoritative.
    if (this._ladder[this._ladderIdx] === 'websocket' && this._unread != null) return;
    this._setUnread(this._localUnread());
  }

  // ------------------------------------------------------------------ local state

  _loadState() {
    try {
      const raw = this._storage?.getItem(this._storageKey);
      if (!raw) return;
      const s = JSON.parse(raw);
      if (s.v !== STORAGE_VERSION) return;
      this._scope = s.scope ?? null;
      this._cursor = typeof s.cursor === 'number' ? s.cursor : null;
      this._epoch = typeof s.epoch === 'string' ? s.epoch : null;
      this._preferences = s.preferences ?? null;
      for (const n of s.notifications || []) if (n && n.id) this._map.set(n.id, n);
    } catch {
      this._map.clear();
      this._cursor = null;
      this._epoch = null;
    }
  }

  /** Writes are batched (a burst of changes is one write); pagehide and stop() flush. */
  _persist() {
    if (this._persistTimer) return;
    this._persistTimer = setTimeout(() => this._flush(), 200);
  }

  _flush() {
    clearTimeout(this._persistTimer);
    this._persistTimer = null;
    if (!this._storage || !this._scope) return;
    const s = {
      v: STORAGE_VERSION,
      scope: this._scope,
      cursor: this._cursor,
      epoch: this._epoch,
      preferences: this._preferences,
      notifications: [...this._map.values()],
    };
    try {
      this._storage.setItem(this._storageKey, JSON.stringify(s));
    } catch {
      // Quota exceeded: never keep a cursor without the notifications it implies.
      try { this._storage.removeItem(this._storageKey); } catch { /* ignore */ }
    }
  }

  /** The stored state belongs to one gateway, app and user; drop it on a mismatch. */
  _checkScope(token) {
    const c = decodeJwtClaims(token) || {};
    const scope = `${this.baseUrl}|${c.app ?? ''}|${c.sub ?? ''}`;
    if (this._scope !== scope) {
      const hadState = this._map.size > 0 || this._cursor != null;
      this._map.clear();
      this._deleted.clear();
      this._cursor = null;
      this._epoch = null;
      this._unread = null;
      this._unseen = null;
      this._registered = false;
      this._scope = scope;
      if (hadState) this._emitList();
    }
  }

  /** Applies changes from the gateway in order, skipping seqs at or before the cursor. */
  _applyChanges(changes, frameCursor) {
    let changed = false;
    for (const c of changes || []) {
      if (!c || typeof c.seq !== 'number') continue;
      if (this._cursor != null && c.seq <= this._cursor) continue;
      if (this._applyOne(c)) {
        changed = true;
        this._emit('change', c);
      }
      this._cursor = c.seq;
    }
    if (typeof frameCursor === 'number' && (this._cursor == null || frameCursor > this._cursor)) {
      this._cursor = frameCursor;
    }
    this._persist();
    if (changed) this._emitList();
  }

  _applyOne(c) {
    if (c.op === 'upsert' && c.notification && c.notification.id) {
      const n = c.notification;
      if (this._deleted.has(n.id)) return false;
      const old = this._map.get(n.id);
      if (old && typeof old.version === 'number' && old.version > n.version) return false;
      this._map.set(n.id, n);
      return true;
    }
    if (c.op === 'delete' && c.id) {
      return this._map.delete(c.id);
    }
    if (c.op === 'preferences') this._takePreferences(c.preferences, false);
    return false;
  }

  /** Result of this client's own action: apply at once, the change follows from the feed. */
  _applyLocal(c) {
    if (c.op === 'delete') {
      this._deleted.add(c.id);
      if (this._deleted.size > 5000) this._deleted.delete(this._deleted.values().next().value);
    }
    if (this._applyOne(c)) {
      this._persist();
      this._emitList();
    }
  }

  _replaceAll(list, cursor, epoch, preferences) {
    this._takePreferences(preferences, true);
    this._map = new Map();
    for (const n of list) if (n && n.id && !this._deleted.has(n.id)) this._map.set(n.id, n);
    this._cursor = typeof cursor === 'number' ? cursor : null;
    this._epoch = typeof epoch === 'string' ? epoch : this._epoch;
    this._persist();
    this._emit('reset', this.notifications);
    this._emitList();
  }

  /** A sync/SSE reset: the newest page plus the rest of history via before=next. */
  async _applyHttpReset(r, gen) {
    const all = [...(r.notifications || [])];
    let next = r.next;
    while (next) {
      const page = await this._http(
        'GET', `/v1/me/notifications?limit=${PAGE_LIMIT}&before=${encodeURIComponent(next)}`);
      if (gen !== this._gen) return false;
      all.push(...(page.notifications || []));
      next = page.next;
    }
    if (gen !== this._gen) return false;
    this._replaceAll(all, r.cursor, r.epoch, r.preferences);
    return true;
  }

  /** Frames are processed one after the other, also across async reset paging. */
  _enqueue(gen, fn) {
    this._queue = this._queue.then(() => (gen === this._gen ? fn() : undefined)).catch((e) => {
      if (gen !== this._gen) return;
      this._emit('error', e instanceof HeraldError ? e : new HeraldError('client_error', String(e?.message || e)));
      this._down(gen, { authFailed: e?.status === 401 });
    });
  }

  // ------------------------------------------------------------------ tokens

  async _tokenFor(force = false) {
    if (this._getTokenFn) {
      const renewAt = this._tokenRenewAt();
      if (force || !this._token || (renewAt != null && Date.now() >= renewAt)) {
        if (!this._tokenPromise) {
          this._tokenPromise = Promise.resolve()
            .then(() => this._getTokenFn())
            .catch((e) => {
              throw e instanceof HeraldError ? e : new HeraldError('token_unavailable', `getToken() failed: ${e?.message || e}`);
            })
            .then((t) => {
              const tok = typeof t === 'string' ? t : t?.token;
              if (!tok) throw new HeraldError('unauthorized', 'getToken() returned no token');
              this._token = tok;
              this._pushRegistration?.active?.postMessage({ type: 'herald-push-token', token: tok });
              return tok;
            })
            .finally(() => { this._tokenPromise = null; });
        }
        return this._tokenPromise;
      }
    }
    if (!this._token) throw new HeraldError('unauthorized', 'no device token');
    return this._token;
  }

  /** When to get a new token: 60 s before exp, or a quarter of its lifetime for short ones. */
  _tokenRenewAt() {
    const c = this._token ? decodeJwtClaims(this._token) : null;
    if (!c || typeof c.exp !== 'number') return null;
    const life = typeof c.iat === 'number' ? (c.exp - c.iat) * 1000 : Infinity;
    return c.exp * 1000 - Math.min(TOKEN_MARGIN_MS, life / 4);
  }

  // ------------------------------------------------------------------ HTTP

  async _http(method, path, { body, headers = {}, signal, timeoutMs = 20_000, retryAuth = true } = {}) {
    const token = await this._tokenFor();
    const ctl = new AbortController();
    const onAbort = () => ctl.abort();
    signal?.addEventListener('abort', onAbort);
    const timer = setTimeout(() => ctl.abort(), timeoutMs);
    let res;
    try {
      res = await this._fetch(this.baseUrl + path, {
        method,
        headers: {
          Authorization: `Bearer ${token}`,
          'Herald-Device': this.deviceId,
          ...(body !== undefined ? { 'Content-Type': 'application/json' } : {}),
          ...headers,
        },
        body: body !== undefined ? JSON.stringify(body) : undefined,
        signal: ctl.signal,
        cache: 'no-store',
      });
    } catch (e) {
      if (signal?.aborted) throw new HeraldError('aborted', 'request aborted');
      throw new HeraldError(ctl.signal.aborted ? 'timeout' : 'network', `${method} ${path}: ${e?.message || e}`);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    }
    if (res.status === 401 && retryAuth && this._getTokenFn) {
      await this._tokenFor(true);
      return this._http(method, path, { body, headers, signal, timeoutMs, retryAuth: false });
    }
    if (res.status === 204) return null;
    let data = null;
    const text = await res.text();
    if (text) {
      try { data = JSON.parse(text); } catch { data = null; }
    }
    if (!res.ok) {
      const err = new HeraldError(data?.error?.code || `http_${res.status}`,
        data?.error?.message || `${method} ${path}: HTTP ${res.status}`, res.status);
      const ra = Number(res.headers.get('Retry-After'));
      if (ra > 0) err.retryAfterMs = ra * 1000;
      throw err;
    }
    return data;
  }

  // ------------------------------------------------------------------ connection management

  _supports(t) {
    if (t === 'websocket') return typeof (this._WebSocket) === 'function';
    if (t === 'sse') return typeof (this._EventSource) === 'function';
    return typeof this._fetch === 'function';
  }

  _later(ms, fn) {
    const t = setTimeout(() => { this._timers.delete(t); fn(); }, ms);
    this._timers.add(t);
    return t;
  }

  _backoffDelay() {
    const exp = Math.min(this._backoffMax, this._backoffMin * 2 ** this._attempt);
    this._attempt = Math.min(this._attempt + 1, 20);
    return Math.round(exp / 2 + Math.random() * (exp / 2)); // "equal jitter"
  }

  _reconnectNow() {
    if (!this._running || this._status === 'live') return;
    for (const t of this._timers) clearTimeout(t);
    this._timers.clear();
    this._attempt = 0;
    this._gen++;
    this._teardown();
    this._connect();
  }

  async _connect() {
    if (!this._running) return;
    const gen = ++this._gen;
    const transport = this._ladder[this._ladderIdx];
    if (this._quiet) this._quiet = false;
    else this._setStatus(this._attempted ? 'reconnecting' : 'connecting', transport);
    this._attempted = true;
    let token;
    try {
      token = await this._tokenFor(this._forceToken);
      this._forceToken = false;
    } catch (e) {
      if (gen !== this._gen) return;
      this._emit('error', e instanceof HeraldError ? e : new HeraldError('token_unavailable', String(e?.message || e)));
      this._down(gen, { noFallback: true });
      return;
    }
    if (gen !== this._gen || !this._running) return;
    this._checkScope(token);
    if (!this._cacheShown) {
      // Show what was stored at once; the connection brings it up to date.
      this._cacheShown = true;
      this._emitList();
    }
    if (transport === 'websocket') {
      this._openWebSocket(gen, token);
      return;
    }
    // Over HTTP the platform and tags are registered with PUT (a hello does it on WebSocket).
    if (!this._registered && (this.platform || Array.isArray(this.tags))) {
      const body = {};
      if (this.platform) body.platform = this.platform;
      if (Array.isArray(this.tags)) body.tags = this.tags;
      try {
        await this._http('PUT', `/v1/me/devices/${encodeURIComponent(this.deviceId)}`, { body });
        this._registered = true;
      } catch (e) {
        if (gen !== this._gen) return;
        if (e.status >= 400 && e.status < 500 && e.status !== 401 && e.status !== 429) {
          this._registered = true; // refused registration: say so, but still sync
          this._emit('error', e);
        } else {
          this._down(gen, { authFailed: e.status === 401, retryAfterMs: e.retryAfterMs });
          return;
        }
      }
      if (gen !== this._gen || !this._running) return;
    }
    if (transport === 'sse') this._openEventSource(gen, this._token || token);
    else this._pollLoop(gen);
  }

  _becameLive(gen) {
    if (gen !== this._gen) return;
    if (this._ladder[this._ladderIdx] === 'websocket') this._probeCount = 0;
    this._failures = 0;
    this._liveSince = Date.now();
    this._workedOn.add(this._ladder[this._ladderIdx]);
    this._setStatus('live', this._ladder[this._ladderIdx]);
    this._emitUnreadIfLocal();
    if (this.transportPreference === 'auto' && this._ladderIdx > 0) this._scheduleProbe(gen);
  }

  /**
   * The current connection ended. info: { wasLive, authFailed, fatal, retryAfterMs, noFallback }.
   */
  _down(gen, info = {}) {
    if (gen !== this._gen) return;
    this._gen++;
    this._teardown();
    if (!this._running) return;
    if (info.authFailed && !this._getTokenFn) {
      info = { fatal: new HeraldError('unauthorized', 'the gateway refused the device token') };
    }
    if (info.fatal) {
      this._running = false;
      globalThis.removeEventListener?.('online', this._onOnline);
      globalThis.removeEventListener?.('pagehide', this._onPageHide);
      this._emit('error', info.fatal);
      this._setStatus('offline');
      return;
    }
    if (info.authFailed) this._forceToken = true;
    if (info.wasLive) {
      // A connection that lived a while starts the backoff over.
      if (Date.now() - this._liveSince > 10_000) this._attempt = 0;
    } else if (!info.authFailed && !info.noFallback) {
      this._failures++;
      if (this._failures % FALLBACK_AFTER === 0 && this._getTokenFn) this._forceToken = true;
      // Fall back only from a transport that never worked here: once it has, failures are outages.
      const current = this._ladder[this._ladderIdx];
      if (this._failures >= FALLBACK_AFTER && this._ladderIdx < this._ladder.length - 1 &&
          !this._workedOn.has(current)) {
        this._ladderIdx++;
        this._failures = 0;
        this._setStatus('reconnecting', this._ladder[this._ladderIdx]);
        this._later(100, () => this._connect());
        return;
      }
    }
    this._setStatus('reconnecting', this._ladder[this._ladderIdx]);
    // A refused token is retried at once with a new one, then with backoff.
    const delay = info.authFailed && this._attempt === 0 ? (this._attempt++, 0) : this._backoffDelay();
    this._later(Math.max(info.retryAfterMs || 0, delay), () => this._connect());
  }

  _teardown() {
    const ws = this._ws;
    this._ws = null;
    this._wsLive = false;
    this._resetStaging = null;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      try { ws.close(1000); } catch { /* ignore */ }
    }
    for (const [, p] of this._pending) {
      clearTimeout(p.timer);
      p.reject(new HeraldError('disconnected', 'the connection closed before the gateway answered'));
    }
    this._pending.clear();
    if (this._es) { this._es.close(); this._es = null; }
    if (this._pollAbort) { this._pollAbort.abort(); this._pollAbort = null; }
    if (this._probe) {
      this._probe.onopen = this._probe.onerror = this._probe.onclose = null;
      try { this._probe.close(); } catch { /* ignore */ }
      this._probe = null;
    }
    for (const t of this._timers) clearTimeout(t);
    this._timers.clear();
  }

  /** In 'auto' on a fallback transport, check now and then whether WebSocket works again. */
  _scheduleProbe(gen) {
    if (this._ladder[0] !== 'websocket') return;
    const delay = Math.min(600_000, 30_000 * 2 ** Math.min(this._probeCount, 5));
    this._later(delay, () => {
      if (gen !== this._gen) return;
      this._probeCount++;
      let probe;
      try { probe = new this._WebSocket(this._wsUrl()); } catch { this._scheduleProbe(gen); return; }
      this._probe = probe;
      probe.onopen = () => {
        probe.onclose = probe.onerror = null;
        try { probe.close(1000); } catch { /* ignore */ }
        this._probe = null;
        if (gen !== this._gen) return;
        this._gen++;
        this._teardown();
        this._ladderIdx = 0;
        this._failures = 0;
        this._connect();
      };
      probe.onerror = probe.onclose = () => {
        probe.onopen = probe.onerror = probe.onclose = null;
        this._probe = null;
        if (gen === this._gen) this._scheduleProbe(gen);
      };
    });
  }

  // ------------------------------------------------------------------ WebSocket

  _wsUrl() { return this.baseUrl.replace(/^http/i, 'ws') + '/v1/ws'; }

  _wsUsable() {
    return this._transport === 'websocket' && this._wsLive && this._ws && this._ws.readyState === 1;
  }

  _openWebSocket(gen, token) {
    let ws;
    try {
      ws = new this._WebSocket(this._wsUrl());
    } catch (e) {
      this._down(gen, {});
      return;
    }
    this._ws = ws;
    this._wsLive = false;
    this._resetStaging = null;
    let welcomed = false;
    const handshake = this._later(WS_HANDSHAKE_TIMEOUT_MS, () => {
      if (!welcomed) this._down(gen, {});
    });

    ws.onopen = () => {
      const hello = { type: 'hello', token, deviceId: this.deviceId };
      if (this.platform) hello.platform = this.platform;
      if (Array.isArray(this.tags)) hello.tags = this.tags;
      if (this._cursor != null) {
        hello.cursor = this._cursor;
        if (this._epoch) hello.epoch = this._epoch;
      }
      ws.send(JSON.stringify(hello));
    };
    ws.onmessage = (ev) => {
      let msg;
      try { msg = JSON.parse(ev.data); } catch { return; }
      if (msg && msg.type === 'welcome') {
        welcomed = true;
        clearTimeout(handshake);
        this._timers.delete(handshake);
      }
      this._enqueue(gen, () => this._onWsFrame(gen, msg));
    };
    ws.onerror = () => { /* a close event follows */ };
    ws.onclose = (ev) => {
      if (gen !== this._gen) return;
      const code = ev.code;
      if (code === 4003) {
        this._down(gen, { fatal: new HeraldError('forbidden', 'the token is bound to another device, or this device was deleted (4003)') });
      } else if (code === 1008) {
        this._down(gen, { fatal: new HeraldError('bad_request', `the gateway refused the hello: ${ev.reason || 'policy'} (1008)`) });
      } else if (code === 4001) {
        this._down(gen, { authFailed: true, wasLive: welcomed });
      } else if (code === 4008) {
        this._attempt = Math.max(this._attempt, 4);
        this._down(gen, { wasLive: welcomed, noFallback: true });
      } else {
        this._down(gen, { wasLive: welcomed });
      }
    };
  }

  _onWsFrame(gen, msg) {
    switch (msg.type) {
      case 'changes':
        this._applyChanges(msg.changes, msg.cursor);
        break;
      case 'change':
        this._applyChanges([msg.change]);
        break;
      case 'reset': {
        if (!this._resetStaging) this._resetStaging = [];
        this._resetStaging.push(...(msg.notifications || []));
        if (msg.final) {
          const all = this._resetStaging;
          this._resetStaging = null;
          this._replaceAll(all, msg.cursor, msg.epoch, msg.preferences);
        }
        break;
      }
      case 'welcome':
        if (typeof msg.cursor === 'number') this._cursor = msg.cursor;
        if (typeof msg.epoch === 'string') this._epoch = msg.epoch;
        this._persist();
        this._wsLive = true;
        this._becameLive(gen);
        this._setUnread(msg.unread);
        this._setUnseen(msg.unseen);
        this._startPing(gen);
        break;
      case 'counts':
        this._setUnread(msg.unread);
        this._setUnseen(msg.unseen);
        break;
      case 'tokenExpiring':
        this._refreshWsToken(gen);
        break;
      case 'ack':
      case 'pong': {
        const p = this._pending.get(msg.ref);
        if (p) { this._pending.delete(msg.ref); clearTimeout(p.timer); p.resolve(msg); }
        break;
      }
      case 'error': {
        const err = new HeraldError(msg.code || 'error', msg.message);
        const p = msg.ref != null ? this._pending.get(msg.ref) : null;
        if (p) { this._pending.delete(msg.ref); clearTimeout(p.timer); p.reject(err); } else this._emit('error', err);
        break;
      }
      default:
        break; // unknown frames are ignored (forward compatible)
    }
  }

  _wsRequest(frame, timeoutMs = ACTION_TIMEOUT_MS) {
    const ws = this._ws;
    if (!ws || ws.readyState !== 1) {
      return Promise.reject(new HeraldError('disconnected', 'not connected'));
    }
    const ref = `c${randomRef()}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(ref);
        reject(new HeraldError('timeout', `no answer to ${frame.type}`));
      }, timeoutMs);
      this._pending.set(ref, { resolve, reject, timer });
      ws.send(JSON.stringify({ type: frame.type, ref, ...frame }));
    });
  }

  _startPing(gen) {
    const tick = () => {
      if (gen !== this._gen) return;
      this._wsRequest({ type: 'ping' }, WS_PONG_TIMEOUT_MS).then(
        () => { if (gen === this._gen) this._later(WS_PING_INTERVAL_MS, tick); },
        (e) => { if (gen === this._gen && e.code === 'timeout') this._down(gen, { wasLive: true }); },
      );
    };
    this._later(WS_PING_INTERVAL_MS, tick);
  }

  async _refreshWsToken(gen) {
    if (!this._getTokenFn) return; // a static token cannot be renewed: the gateway closes 4001 at exp
    try {
      const old = this._token;
      const token = await this._tokenFor(true);
      if (gen !== this._gen || token === old) return;
      await this._wsRequest({ type: 'refresh', token });
    } catch (e) {
      if (gen === this._gen) this._emit('error', e instanceof HeraldError ? e : new HeraldError('unauthorized', String(e)));
    }
  }

  // ------------------------------------------------------------------ Server-Sent Events

  _openEventSource(gen, token) {
    const q = new URLSearchParams({ token, deviceId: this.deviceId });
    if (this._cursor != null) {
      q.set('cursor', String(this._cursor));
      if (this._epoch) q.set('epoch', this._epoch);
    }
    let es;
    try {
      es = new this._EventSource(`${this.baseUrl}/v1/me/events?${q}`);
    } catch {
      this._down(gen, {});
      return;
    }
    this._es = es;
    let opened = false;
    es.onopen = () => {
      if (gen !== this._gen || opened) return;
      opened = true;
      this._becameLive(gen);
      this._scheduleTokenRenewal(gen);
    };
    es.addEventListener('change', (ev) => {
      let change;
      try { change = JSON.parse(ev.data); } catch { return; }
      this._enqueue(gen, () => this._applyChanges([change]));
    });
    es.addEventListener('reset', (ev) => {
      let r;
      try { r = JSON.parse(ev.data); } catch { return; }
      this._enqueue(gen, () => this._applyHttpReset(r, gen));
    });
    // The EventSource would reconnect by itself with Last-Event-ID, but with the
    // token in its URL; reconnecting here keeps the token fresh and the backoff ours.
    es.onerror = () => {
      if (gen !== this._gen) return;
      this._down(gen, { wasLive: opened });
    };
  }

  /** SSE carries the token in its URL: reconnect with a new one before it expires. */
  _scheduleTokenRenewal(gen) {
    const renewAt = this._tokenRenewAt();
    if (renewAt == null || !this._getTokenFn) return;
    const delay = Math.max(5_000, renewAt - Date.now());
    this._later(delay, () => {
      if (gen !== this._gen) return;
      // Let the queue finish what the stream delivered, then resume from the cursor.
      this._enqueue(gen, () => {
        this._gen++;
        this._teardown();
        this._forceToken = true;
        this._quiet = true; // a planned renewal: stay 'live' unless it fails
        this._connect();
      });
    });
  }

  // ------------------------------------------------------------------ long-poll

  async _pollLoop(gen) {
    const abort = new AbortController();
    this._pollAbort = abort;
    let live = false;
    let hasMore = true; // the first request does not wait
    while (gen === this._gen && this._running) {
      const q = new URLSearchParams({ limit: String(PAGE_LIMIT), wait: String(hasMore ? 0 : POLL_WAIT) });
      if (this._cursor != null) {
        q.set('cursor', String(this._cursor));
        if (this._epoch) q.set('epoch', this._epoch);
      }
      let r;
      try {
        r = await this._http('GET', `/v1/me/sync?${q}`, {
          signal: abort.signal,
          timeoutMs: (hasMore ? 0 : POLL_WAIT) * 1000 + 20_000,
        });
        if (gen !== this._gen) return;
        // Processed through the same queue as other frames, so actions applied meanwhile stay ordered.
        await new Promise((resolve, reject) => {
          this._queue = this._queue.then(async () => {
            if (gen !== this._gen) return;
            if (r.reset) {
              await this._applyHttpReset(r, gen);
            } else {
              if (typeof r.epoch === 'string') this._epoch = r.epoch;
              this._applyChanges(r.changes, r.cursor);
            }
          }).then(resolve, reject);
        });
      } catch (e) {
        if (gen !== this._gen) return;
        if (e.status === 403) {
          this._down(gen, { fatal: e });
        } else if (e.status === 400) {
          // The gateway refused our cursor or epoch: start over with a reset.
          this._wipe();
          this._down(gen, { wasLive: live });
        } else {
          this._down(gen, { wasLive: live, authFailed: e.status === 401, retryAfterMs: e.retryAfterMs });
        }
        return;
      }
      if (gen !== this._gen) return;
      hasMore = !!(r.hasMore || r.reset);
      if (r.reset) hasMore = true; // sync on from the reset's cursor at once
      if (!live) {
        live = true;
        this._becameLive(gen);
      }
    }
  }
}

if (typeof window !== 'undefined') {
  window.Herald = { HeraldClient, HeraldError, sortNotifications };
}
