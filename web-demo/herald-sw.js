// herald-sw.js: the service worker of a Herald web app, to copy beside your pages.
//
//   const reg = await navigator.serviceWorker.register('/herald-sw.js');
//   await client.enablePush(reg);            // herald.js: subscribes and hands this worker its token
//
// What it does (docs/PROTOCOL.md 15, web-demo/README.md "Push"):
// - on a push, shows the notification (tag = the notification id) unless the
//   push's change says it is already handled;
// - whenever it runs (a push, a click, a message from a page), closes every
//   notification it shows that the gateway no longer lists as unread and
//   untouched. Web Push has no silent pushes (userVisibleOnly), so a dismiss
//   on another device leaves this tray when the worker next runs, not at once;
// - on a click, focuses or opens the app and marks the notification
//   activated and read;
// - when the browser replaces the subscription, registers the new one.
//
// A classic script (module service workers are not everywhere yet). Its
// state, in IndexedDB `herald-sw`: the gateway URL, device id, device token,
// optional token URL and app URL a page gave it, and the clicks not yet told
// to the gateway.

const DB_NAME = 'herald-sw';
const TOKEN_MARGIN_MS = 30_000; // a token this close to its exp is renewed first
const PAGE_LIMIT = 100;
const REQUEST_TIMEOUT_MS = 10_000; // a hung gateway must not hold the worker (or enablePush) for long
const FALLBACK_TITLE = 'New notification';

// ------------------------------------------------------------------ IndexedDB

let dbPromise = null;

function db() {
  dbPromise ??= new Promise((resolve, reject) => {
    const req = indexedDB.open(DB_NAME, 1);
    req.onupgradeneeded = () => req.result.createObjectStore('kv');
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => { dbPromise = null; reject(req.error); };
  });
  return dbPromise;
}

/** Reads `key` and, with `change`, writes change(value) in the same transaction (undefined deletes). */
async function kv(key, change) {
  const tx = (await db()).transaction('kv', change ? 'readwrite' : 'readonly');
  const store = tx.objectStore('kv');
  let value;
  store.get(key).onsuccess = (ev) => {
    value = ev.target.result;
    if (!change) return;
    value = change(value);
    if (value === undefined) store.delete(key); else store.put(value, key);
  };
  await new Promise((resolve, reject) => {
    tx.oncomplete = resolve;
    tx.onerror = tx.onabort = () => reject(tx.error);
  });
  return value;
}

const readConfig = () => kv('config');

// ------------------------------------------------------------------ tokens and HTTP

function tokenExpiry(token) {
  try {
    const b64 = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    return JSON.parse(atob(b64)).exp * 1000;
  } catch {
    return 0;
  }
}

/**
 * The stored token while it has more than TOKEN_MARGIN_MS left; else one
 * from the app's token URL (same origin: the app's session cookie goes
 * along); else an error, and the caller does without the gateway.
 */
async function deviceToken(cfg, renew = false) {
  if (!renew && cfg.token && tokenExpiry(cfg.token) - Date.now() > TOKEN_MARGIN_MS) return cfg.token;
  if (!cfg.tokenUrl) throw new Error('the device token has expired and no tokenUrl is set: waiting for a page to hand a new one');
  const url = new URL(cfg.tokenUrl, self.registration.scope);
  url.searchParams.set('deviceId', cfg.deviceId);
  const res = await fetch(url, { credentials: 'same-origin', cache: 'no-store', signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
  if (!res.ok) throw new Error(`tokenUrl answered HTTP ${res.status}`);
  const text = (await res.text()).trim();
  const token = text.startsWith('{') ? JSON.parse(text).token : text;
  if (typeof token !== 'string' || !token) throw new Error('tokenUrl gave no token');
  await kv('config', (c) => (c ? { ...c, token } : c));
  cfg.token = token;
  return token;
}

/** A device API call; a refused token is renewed once through the token URL. */
async function api(cfg, method, path, body) {
  for (const renew of [false, true]) {
    const token = await deviceToken(cfg, renew);
    const res = await fetch(cfg.baseUrl + path, {
      method,
      headers: {
        Authorization: `Bearer ${token}`,
        'Herald-Device': cfg.deviceId,
        ...(body ? { 'Content-Type': 'application/json' } : {}),
      },
      body: body ? JSON.stringify(body) : undefined,
      cache: 'no-store',
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    if (res.status === 401 && !renew && cfg.tokenUrl) continue;
    if (!res.ok) {
      const err = new Error(`${method} ${path}: HTTP ${res.status}`);
      err.status = res.status;
      throw err;
    }
    return res.status === 204 ? null : res.json();
  }
}

// ------------------------------------------------------------------ the tray

/** Ours: every notification this worker shows carries the notification id in data. */
async function shownNotifications() {
  return (await self.registration.getNotifications()).filter((n) => n.data?.heraldId);
}

/** A change that leaves nothing to show: deleted, or no longer unread and untouched. */
function handled(change) {
  if (!change || typeof change !== 'object') return false;
  if (change.op === 'delete') return true;
  const n = change.notification;
  return change.op === 'upsert' && !!n && (n.readState !== 'unread' || n.userActionState !== 'noInteraction');
}

/**
 * Closes the notifications shown that the gateway no longer lists as unread
 * and untouched (or at all). The tray is read before asking, so one shown
 * meanwhile by another push is never judged by an older answer.
 */
async function cleanTray(cfg) {
  const shown = await shownNotifications();
  if (shown.length === 0) return;
  const missing = new Set(shown.map((n) => n.data.heraldId));
  const live = new Set();
  let before = null;
  do {
    const q = new URLSearchParams({ readState: 'unread', userActionState: 'noInteraction', limit: String(PAGE_LIMIT) });
    if (before) q.set('before', before);
    const page = await api(cfg, 'GET', `/v1/me/notifications?${q}`);
    for (const n of page.notifications) {
      live.add(n.id);
      missing.delete(n.id);
    }
    before = page.next;
  } while (before && missing.size > 0);
  for (const n of shown) if (!live.has(n.data.heraldId)) n.close();
}

/** Sends the clicks kept in IndexedDB; a 404 (deleted meanwhile) is done too. */
async function sendActivations(cfg) {
  for (const id of (await kv('activations')) || []) {
    try {
      await api(cfg, 'PATCH', `/v1/me/notifications/${encodeURIComponent(id)}`,
        { userActionState: 'activated', readState: 'read' });
    } catch (e) {
      if (e.status !== 404) throw e;
    }
    await kv('activations', (ids) => (ids || []).filter((x) => x !== id));
  }
}

/** What the worker does whenever it runs. Without a token or network it leaves things as they are. */
async function catchUp() {
  const cfg = await readConfig();
  if (!cfg) return;
  try {
    await sendActivations(cfg);
    await cleanTray(cfg);
  } catch (e) {
    console.warn('herald-sw: could not reach the gateway; the tray is cleaned next time', e);
  }
}

// ------------------------------------------------------------------ events

/** The decrypted body Herald sends (PROTOCOL 15.3), or null for anything else. */
function heraldPush(data) {
  let body;
  try { body = data?.json(); } catch { return null; }
  const h = body?.herald;
  return h && typeof h === 'object' && typeof h.id === 'string' && h.id ? body : null;
}

async function onPush(data) {
  const push = heraldPush(data);
  if (!push) {
    // Not Herald's. A subscription made with userVisibleOnly promises a
    // notification for every push (Safari ends it after a few without), so show one.
    await self.registration.showNotification(FALLBACK_TITLE, { tag: 'herald-unknown' });
  } else if (handled(push.change)) {
    for (const n of await self.registration.getNotifications({ tag: push.herald.id })) n.close();
  } else {
    await self.registration.showNotification(typeof push.title === 'string' && push.title ? push.title : FALLBACK_TITLE, {
      body: typeof push.body === 'string' ? push.body : '',
      tag: push.herald.id,
      data: { heraldId: push.herald.id },
    });
  }
  await catchUp();
}

/** Focuses a window of the app (the app URL's path, default the worker's scope) or opens one. */
async function openApp(cfg) {
  const appUrl = new URL(cfg?.appUrl || self.registration.scope, self.registration.scope).href;
  const windows = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
  const open = windows.find((w) => w.url.startsWith(appUrl));
  if (open) await open.focus();
  else await self.clients.openWindow(appUrl);
}

async function onClick(notification) {
  notification.close();
  const id = notification.data?.heraldId;
  const cfg = await readConfig();
  // Kept first, so a click without a token or network is told to the gateway later.
  if (id && cfg) await kv('activations', (ids) => [...new Set([...(ids || []), id])]);
  // A browser may refuse to open or focus a window (no user activation left): the click still counts.
  await Promise.all([openApp(cfg).catch((e) => console.warn('herald-sw: could not show the app', e)), catchUp()]);
}

/**
 * The browser replaced the subscription (it expired, or the push service
 * rotated it; Firefox does): register the new one, or the gateway would push
 * into the void. Some browsers hand no new subscription: subscribe again.
 */
async function onSubscriptionChange(newSubscription) {
  const cfg = await readConfig();
  if (!cfg) return;
  let sub = newSubscription;
  if (!sub) {
    const { webPushPublicKey } = await api(cfg, 'GET', '/v1/me/push');
    if (!webPushPublicKey) return;
    sub = await self.registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: webPushPublicKey });
  }
  await api(cfg, 'PUT', `/v1/me/devices/${encodeURIComponent(cfg.deviceId)}`,
    { push: { service: 'webpush', subscription: sub.toJSON() } });
}

/**
 * Messages from herald.js in the app's pages; answered on the port they
 * bring once the worker has also caught up (sent kept clicks, cleaned the tray).
 */
async function onMessage(msg) {
  switch (msg?.type) {
    case 'herald-push-config': {
      const { baseUrl, deviceId, token, tokenUrl = null, appUrl = null } = msg;
      if (typeof baseUrl !== 'string' || typeof deviceId !== 'string' || typeof token !== 'string') {
        throw new Error('herald-push-config needs baseUrl, deviceId and token');
      }
      // Another device or gateway: the clicks kept were for the old one.
      const old = await kv('config', () => ({ baseUrl, deviceId, token, tokenUrl, appUrl }));
      if (old && (old.baseUrl !== baseUrl || old.deviceId !== deviceId)) await kv('activations', () => undefined);
      return;
    }
    case 'herald-push-token':
      if (typeof msg.token !== 'string') throw new Error('herald-push-token needs a token');
      await kv('config', (c) => (c ? { ...c, token: msg.token } : c));
      return;
    case 'herald-push-sync': // a page saw a change: clean the tray now rather than at the next push
      return;
    case 'herald-push-forget':
      await kv('config', () => undefined);
      await kv('activations', () => undefined);
      for (const n of await shownNotifications()) n.close();
      return;
    default:
      throw new Error(`unknown message ${JSON.stringify(msg?.type)}`);
  }
}

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

self.addEventListener('push', (event) => event.waitUntil(onPush(event.data)));

self.addEventListener('pushsubscriptionchange', (event) => event.waitUntil(onSubscriptionChange(event.newSubscription)));

self.addEventListener('notificationclick', (event) => event.waitUntil(onClick(event.notification)));

self.addEventListener('message', (event) => {
  const port = event.ports[0];
  event.waitUntil(onMessage(event.data).then(catchUp).then(
    () => port?.postMessage({ ok: true }),
    (e) => port?.postMessage({ ok: false, error: String(e?.message || e) }),
  ));
});
