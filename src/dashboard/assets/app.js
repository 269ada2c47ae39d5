// hive dashboard: the shared core. DOM building (data only ever becomes text nodes or
// attribute values, never markup), the API client (session cookie + CSRF header), watch
// streams with resume and re-list, keyed incremental lists, relative times (the log view is logs.js).
'use strict';

const hive = (() => {
  const API = '/apis/hive.dev/v1';
  const body = document.body;
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || '';
  const canWrite = body.dataset.canWrite === 'true';
  const canAdmin = body.dataset.canAdmin === 'true';

  // ---- DOM ----------------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    append(el, children);
    return el;
  }
  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c == null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }
  const $ = (sel) => document.querySelector(sel);
  function fill(el, ...children) {
    if (typeof el === 'string') el = $(el);
    if (!el) return;
    el.replaceChildren();
    append(el, children);
  }
  const link = (href, text) => h('a', { href }, text);
  const agentLink = (name) => link('/agents/' + encodeURIComponent(name), name);
  const jobLink = (name) => link('/jobs#job-' + encodeURIComponent(name), name);
  const nodeLink = (name) => link('/nodes/' + encodeURIComponent(name), name);

  // State words with a glyph, so state reads without color too.
  const STATES = {
    good: ['Ready', 'Running', 'Done', 'Deployed', 'Approved', 'Succeeded', 'True', 'Up', 'Converged'],
    busy: ['Starting', 'Stopping', 'Queued', 'Provisioning', 'Deploying', 'Pending', 'Killing', 'Requested', 'Building', 'Terminating'],
    bad: ['Failed', 'Crashed', 'CrashLooping', 'ConfigurationError', 'Orphaned', 'Interrupted', 'Denied', 'NotReady',
      'CrashLoopBackOff', 'BuildFailed', 'StartFailed', 'StopFailed', 'Lost'],
  };
  const GLYPH = { good: '●', busy: '◐', bad: '✖', off: '○', run: '▶' };
  function tone(word) {
    for (const [t, words] of Object.entries(STATES)) if (words.includes(word)) return t;
    return 'off';
  }
  // Conditions whose True is the bad news (hive_api::agent::bad_when_true): red when
  // True, as the others are off when False; never a green check for a crash.
  const BAD_WHEN_TRUE = ['Crashed', 'NodeLost'];
  const conditionTone = (c) => (BAD_WHEN_TRUE.includes(c.type) ? (c.status === 'True' ? 'bad' : 'good') : (c.status === 'True' ? 'good' : 'off'));
  function pill(word, toneOverride) {
    const w = word || 'Unknown';
    const t = toneOverride || tone(w);
    return h('span', { class: 'st st-' + t, title: w }, GLYPH[t] + ' ' + w);
  }

  // ---- time ---------------------------------------------------------------------
  function ageText(iso) {
    const then = Date.parse(iso);
    if (Number.isNaN(then)) return '';
    let s = Math.max(0, Math.round((Date.now() - then) / 1000));
    if (s < 60) return s + 's ago';
    // Seconds too under ten minutes, as kubectl's ages: a fresh Job's times visibly tick.
    if (s < 600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's ago';
    if (s < 3600) return Math.floor(s / 60) + 'm ago';
    if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm ago';
    return Math.floor(s / 86400) + 'd ago';
  }
  function time(iso) {
    if (!iso) return h('span', { class: 'muted' }, '—');
    const exact = new Date(iso);
    return h('time', { datetime: iso, title: exact.toLocaleString() + ' (' + iso + ')', 'data-rel': '' }, ageText(iso));
  }
  // Every relative time ticks, each second (only the texts that changed are written).
  setInterval(() => {
    for (const t of document.querySelectorAll('time[data-rel]')) {
      const text = ageText(t.getAttribute('datetime'));
      if (t.textContent !== text) t.textContent = text;
    }
  }, 1000);

  // ---- API ----------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message, reason) {
      super(message);
      this.status = status;
      this.reason = reason;
    }
  }
  async function api(method, path, payload, contentType) {
    return (await send(method, path, payload, contentType)).json;
  }
  // The same, also returning the HTTP status (201 created vs 200 replayed).
  async function send(method, path, payload, contentType) {
    const headers = { Accept: 'application/json' };
    if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = csrf;
    const init = { method, headers, credentials: 'same-origin' };
    if (payload !== undefined) {
      headers['Content-Type'] = contentType || 'application/json';
      init.body = JSON.stringify(payload);
    }
    const resp = await fetch(path, init);
    const text = await resp.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch (_) {
      json = null;
    }
    if (resp.status === 401) signedOut();
    if (!resp.ok) {
      const message = (json && json.message) || text || resp.statusText;
      throw new ApiError(resp.status, `${resp.status} ${(json && json.reason) || ''}: ${message}`, json && json.reason);
    }
    return { status: resp.status, json };
  }
  function signedOut() {
    if (body.dataset.page !== 'login') location.href = '/login';
  }

  // ---- live indicator -----------------------------------------------------------
  const down = new Map(); // stream name -> reason
  let streams = 0;
  function renderLive() {
    const el = $('#live');
    if (!el) return;
    if (down.size === 0 && streams > 0) {
      el.className = 'live up';
      el.textContent = '● live';
      el.title = 'live: following ' + streams + ' stream(s)';
    } else {
      el.className = 'live down';
      el.textContent = down.size ? '○ reconnecting…' : '○ connecting';
      el.title = [...down.entries()].map(([k, v]) => k + ': ' + v).join('\n') || 'connecting';
    }
  }

  async function readLines(resp, onLine) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i).trim();
        buf = buf.slice(i + 1);
        if (line) onLine(line);
      }
    }
  }
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  // Resolves when the tab is visible. Hidden tabs close their watches: browsers allow
  // only six HTTP/1.1 connections per host across all tabs, and a watch holds one.
  function visible() {
    if (!document.hidden) return Promise.resolve();
    return new Promise((resolve) => {
      const check = () => {
        if (document.hidden) return;
        document.removeEventListener('visibilitychange', check);
        resolve();
      };
      document.addEventListener('visibilitychange', check);
    });
  }
  class Expired extends Error {}

  // A live collection: list, then watch from the list's resourceVersion; after a drop
  // resume from the last resourceVersion seen (events or bookmarks); after 410 re-list.
  // Changes are batched into one render per animation frame. `plural` names a
  // hive.dev/v1 resource, or is a whole collection path such as '/api/v1/events'.
  function collection(plural, onChange, query) {
    const base = plural.startsWith('/') ? plural : `${API}/${plural}`;
    const extra = query ? '&' + query : '';
    const items = new Map();
    let rv = null;
    let pending = new Set();
    let reset = false;
    let scheduled = false;
    const name = plural + (query ? ' ' + query : '');
    streams += 1;
    down.set(name, 'connecting');
    function schedule() {
      if (scheduled) return;
      scheduled = true;
      requestAnimationFrame(() => {
        scheduled = false;
        const changed = pending;
        const wasReset = reset;
        pending = new Set();
        reset = false;
        const t0 = performance.now();
        onChange(items, changed, wasReset);
        window.hiveRenderMs = (window.hiveRenderMs || []).concat([performance.now() - t0]).slice(-50);
      });
    }
    async function list() {
      const l = await api('GET', `${base}?${query || ''}`);
      items.clear();
      for (const o of l.items || []) items.set(o.metadata.name, o);
      rv = l.metadata.resourceVersion;
      reset = true;
      schedule();
    }
    let ctrl = null;
    document.addEventListener('visibilitychange', () => {
      if (document.hidden && ctrl) ctrl.abort();
    });
    (async () => {
      // Reconnect backoff: reset only once a watch proved healthy (an event arrived, or
      // it stayed open ~10 s), so a server that accepts and then drops is not hammered.
      let backoff = 500;
      let relistBackoff = 250;
      for (;;) {
        await visible();
        let opened = 0;
        try {
          if (rv === null) await list();
          // The server ends each watch cleanly after timeoutSeconds (spread so tabs do
          // not reconnect in step); that end is a normal resume, not a failure.
          const timeout = 240 + Math.floor(Math.random() * 121);
          const url = `${base}?watch=true&resourceVersion=${encodeURIComponent(rv)}&allowWatchBookmarks=true&timeoutSeconds=${timeout}${extra}`;
          ctrl = new AbortController();
          const mine = ctrl;
          try {
            const resp = await fetch(url, { credentials: 'same-origin', headers: { Accept: 'application/json' }, signal: mine.signal });
            if (resp.status === 401) return signedOut();
            if (resp.status === 410) throw new Expired();
            if (!resp.ok) throw new Error('watch answered ' + resp.status);
            opened = performance.now();
            down.delete(name);
            renderLive();
            await readLines(resp, (line) => {
              const ev = JSON.parse(line);
              const obj = ev.object || {};
              if (ev.type === 'ERROR') {
                if (obj.code === 410) throw new Expired();
                throw new Error(obj.message || 'watch error');
              }
              backoff = 500;
              relistBackoff = 250;
              const v = obj.metadata && obj.metadata.resourceVersion;
              if (v) rv = v;
              if (ev.type === 'BOOKMARK') return;
              const key = obj.metadata.name;
              if (ev.type === 'DELETED') items.delete(key);
              else items.set(key, obj);
              pending.add(key);
              schedule();
            });
          } finally {
            mine.abort(); // never leave a half-read stream holding a connection
          }
          // A clean end (timeoutSeconds, or the session ended: the next request says
          // 401): resume at once, without the reconnecting flash. An end right after
          // opening counts as a failure, so a misbehaving server gets the backoff.
          if (performance.now() - opened < 2000) throw new Error('stream ended at once');
        } catch (e) {
          if (opened && performance.now() - opened > 10000) backoff = 500;
          if (e instanceof Expired) {
            rv = null; // re-list: our resourceVersion is older than the server's history
            await sleep(relistBackoff + Math.random() * relistBackoff);
            relistBackoff = Math.min(relistBackoff * 2, 5000);
            continue;
          }
          if (document.hidden) continue; // paused, not failed: resume from rv when visible
          down.set(name, e.message || String(e));
          renderLive();
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 10000);
        }
      }
    })();
    return items;
  }

  // Keyed rows in a container, kept sorted by key: only changed keys are re-rendered,
  // and a key whose object is the same version as its row's (a re-list) is left alone,
  // so what a user typed or opened in it survives.
  function keyed(container, render, compare) {
    const rows = new Map();
    const versions = new Map();
    const version = (obj) => (obj.metadata && obj.metadata.resourceVersion) || null;
    const cmp = compare || ((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    let order = [];
    function place(key, el) {
      let lo = 0;
      let hi = order.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (cmp(order[mid], key) < 0) lo = mid + 1;
        else hi = mid;
      }
      const before = order[lo] !== undefined ? rows.get(order[lo]) : null;
      container.insertBefore(el, before || null);
      order.splice(lo, 0, key);
    }
    return {
      update(items, changed, reset) {
        const keys = reset ? new Set([...rows.keys(), ...items.keys()]) : changed;
        for (const key of keys) {
          const obj = items.get(key);
          const old = rows.get(key);
          if (!obj) {
            if (old) {
              old.remove();
              rows.delete(key);
              versions.delete(key);
              order = order.filter((k) => k !== key);
            }
            continue;
          }
          if (old && version(obj) !== null && versions.get(key) === version(obj)) continue;
          const el = render(obj);
          if (old) old.replaceWith(el);
          else place(key, el);
          rows.set(key, el);
          versions.set(key, version(obj));
        }
      },
      size: () => rows.size,
      rows,
    };
  }

  function condition(obj, type) {
    return ((obj.status && obj.status.conditions) || []).find((c) => c.type === type);
  }

  function result(el, ok, text) {
    if (typeof el === 'string') el = $(el);
    if (!el) return;
    el.className = 'result ' + (ok ? 'ok' : 'error');
    el.textContent = text;
  }

  renderLive();
  // Replaces a <select>'s options only when its list of values changed: rebuilding
  // closes a dropdown the user has open. `list` empty: one disabled-looking placeholder.
  function options(sel, list, placeholder) {
    const want = list.length ? list : [''];
    const have = [...sel.options].map((o) => o.value);
    if (have.length === want.length && have.every((v, i) => v === want[i])) return false;
    const cur = sel.value;
    fill(sel, list.length ? list.map((n) => h('option', { value: n }, n)) : h('option', { value: '' }, placeholder));
    if (list.includes(cur)) sel.value = cur;
    return true;
  }

  return {
    API, h, $, fill, options, append, link, agentLink, jobLink, nodeLink, pill, tone, time, api, send, ApiError, collection, keyed,
    condition, conditionTone, result, canWrite, canAdmin, readLines, sleep, renderLive, down,
    addStream(name) { streams += 1; down.set(name, 'connecting'); renderLive(); },
    streamUp(name) { down.delete(name); renderLive(); },
    streamDown(name, why) { down.set(name, why); renderLive(); },
  };
})();
