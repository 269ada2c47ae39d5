// hive dashboard: core Events (/api/v1/events), live, newest first — the overview's
// recent events across every object, one object's events on its own page (selected by
// involvedObject, as kubectl describe asks), and the Events page with its filter.
'use strict';

(() => {
  const { h, $, fill, pill, time, collection, agentLink } = hive;
  const EVENTS = '/api/v1/events';

  // When an event last happened: repeats fold into one event whose lastTimestamp moves.
  const when = (e) => e.lastTimestamp || (e.series && e.series.lastObservedTime) || e.eventTime || e.firstTimestamp || (e.metadata && e.metadata.creationTimestamp) || '';
  // The order: hive's microsecond time (a repeat's last one, else the first); an event
  // with whole seconds only (another client's) counts as the end of its second. Then the
  // later write (higher resourceVersion).
  const micro = (e) => Date.parse((e.series && e.series.lastObservedTime) || e.eventTime || '') || 0;
  const stamp = (e) => micro(e) || (Math.floor((Date.parse(when(e)) || 0) / 1000) * 1000 + 999);
  const rv = (e) => Number((e.metadata && e.metadata.resourceVersion) || 0);
  const newestFirst = (a, b) => stamp(b) - stamp(a) || rv(b) - rv(a) || (a.metadata.name < b.metadata.name ? -1 : 1);

  // A link to the page of the object an event is about, where there is one.
  function objectLink(ref) {
    const name = ref.name || '';
    const page = { Agent: '/agents/', Node: '/nodes/', Job: '/jobs/' }[ref.kind];
    const label = (ref.kind || '?') + '/' + name;
    if (ref.kind === 'Agent') return agentLink(name);
    return page ? h('a', { href: page + encodeURIComponent(name) }, label) : label;
  }

  // One event's row: type, reason, the object (`withObject`), message, count, when.
  const eventRow = (e, withObject) => h('tr', { 'data-event': e.metadata.name, 'data-type': e.type || 'Normal', 'data-reason': e.reason || '',
    'data-object': ((e.involvedObject || {}).kind || '') + '/' + ((e.involvedObject || {}).name || '') },
    h('td', {}, pill(e.type || 'Normal', e.type === 'Warning' ? 'bad' : 'off')),
    h('td', {}, h('b', {}, e.reason || '')),
    withObject ? h('td', {}, objectLink(e.involvedObject || {})) : null,
    h('td', { class: 'small' }, e.message || ''),
    h('td', {}, String(e.count || 1)),
    h('td', {}, time(when(e))));
  const COLUMNS = ['Type', 'Reason', 'Object', 'Message', 'Count', 'Last seen'];

  // A live table of events in `container`: all of them, or those about one object
  // (`about`: {kind, name}), newest first, at most `limit` rows.
  function eventsTable(container, about, limit) {
    if (typeof container === 'string') container = hive.$(container);
    if (!container) return null;
    const withObject = !about;
    const cols = COLUMNS.filter((c) => withObject || c !== 'Object');
    const tbody = h('tbody', {});
    const table = h('table', { class: 'rows events' }, h('thead', {}, h('tr', {}, cols.map((c) => h('th', {}, c)))), tbody);
    const empty = h('p', { class: 'empty' }, about ? `No events about this ${about.kind.toLowerCase()}.` : 'No events yet.');
    const more = h('p', { class: 'muted small', hidden: true });
    let mounted = false; // "Loading…" stays until the first list answered
    const row = (e) => eventRow(e, withObject);
    const query = about
      ? 'fieldSelector=' + encodeURIComponent(`involvedObject.kind=${about.kind},involvedObject.name=${about.name}`)
      : '';
    // At most `limit` rows, re-rendered together: a folded repeat moves its event up.
    collection(EVENTS, (items) => {
      const newest = [...items.values()].sort(newestFirst);
      const shown = newest.slice(0, limit);
      if (!mounted) {
        mounted = true;
        fill(container, h('div', { class: 'scroll' }, table), empty, more);
        hive.sortable(table);
      }
      fill(tbody, shown.map(row));
      empty.hidden = shown.length > 0;
      table.hidden = shown.length === 0;
      more.hidden = items.size <= limit;
      more.textContent = `Newest ${limit} of ${items.size} events.`;
    }, query);
    // Every event, or this object's, on the Events page, where they can be filtered.
    const all = about ? `/events?kind=${encodeURIComponent(about.kind)}&object=${encodeURIComponent(about.name)}` : '/events';
    container.after(h('p', { class: 'small' }, h('a', { href: all, class: 'all-events' }, 'All events' + (about ? ` about this ${about.kind.toLowerCase()}` : '') + ' →')));
    return table;
  }

  // ---- the Events page ----------------------------------------------------------
  // Every event through one watch, filtered here by the URL's query (kind, object,
  // type, reason, since), newest first, at most SHOWN rows. A paged or selected list
  // could not hold "since" (the API selects no times) nor fill the choices, so the
  // filter works on the watched list, as the Jobs page's does.
  const SHOWN = 500;
  const KEYS = ['kind', 'object', 'type', 'reason', 'since'];
  const AGES = { '5m': 300, '15m': 900, '1h': 3600, '6h': 21600, '24h': 86400 };
  function wanted() {
    const q = new URLSearchParams(location.search);
    return Object.fromEntries(KEYS.map((k) => [k, (q.get(k) || '').trim()]));
  }
  function href(w) {
    const q = new URLSearchParams();
    for (const k of KEYS) if (w[k]) q.set(k, w[k]);
    const s = q.toString();
    return '/events' + (s ? '?' + s : '');
  }
  // `object` is a name, or kind/name (`agent/crashy`); a name matches as a part of the
  // involved object's name, case aside, as a search box does.
  function matches(e, w, now) {
    const ref = e.involvedObject || {};
    if (w.kind && ref.kind !== w.kind) return false;
    if (w.type && (e.type || 'Normal') !== w.type) return false;
    if (w.reason && e.reason !== w.reason) return false;
    if (w.object) {
      const [k, n] = w.object.includes('/') ? w.object.split('/', 2) : ['', w.object];
      if (k && (ref.kind || '').toLowerCase() !== k.toLowerCase()) return false;
      if (!(ref.name || '').toLowerCase().includes(n.toLowerCase())) return false;
    }
    const age = AGES[w.since];
    if (age && stamp(e) < now - age * 1000) return false;
    return true;
  }
  function eventsPage() {
    const box = $('#events-list');
    const form = $('#events-filter');
    const field = (k) => $('#events-filter-' + k);
    const tbody = h('tbody', { id: 'events-rows' });
    const table = h('table', { class: 'rows events', id: 'events-table' }, h('thead', {}, h('tr', {}, COLUMNS.map((c) => h('th', {}, c)))), tbody);
    const empty = h('p', { class: 'empty', id: 'events-empty', hidden: true });
    const more = h('p', { class: 'muted small', id: 'events-more', hidden: true });
    let items = null;
    let mounted = false;
    const choices = (sel, values, current) => {
      const want = ['', ...[...new Set([...values, current].filter(Boolean))].sort()];
      const have = [...sel.options].map((o) => o.value);
      if (have.join('\n') !== want.join('\n')) fill(sel, want.map((v) => h('option', { value: v }, v || 'any')));
      sel.value = current;
    };
    function render() {
      if (!items) return;
      const w = wanted();
      const all = [...items.values()];
      choices(field('kind'), all.map((e) => (e.involvedObject || {}).kind), w.kind);
      choices(field('reason'), all.map((e) => e.reason), w.reason);
      for (const k of ['type', 'since']) field(k).value = w[k];
      if (document.activeElement !== field('object')) field('object').value = w.object;
      const now = Date.now();
      const shown = all.filter((e) => matches(e, w, now)).sort(newestFirst);
      if (!mounted) {
        mounted = true;
        fill(box, h('div', { class: 'scroll' }, table), empty, more);
        hive.sortable(table);
      }
      fill(tbody, shown.slice(0, SHOWN).map((e) => eventRow(e, true)));
      table.hidden = shown.length === 0;
      empty.hidden = shown.length > 0;
      empty.textContent = all.length ? 'No event matches the filter.' : 'No events yet.';
      more.hidden = shown.length <= SHOWN;
      more.textContent = `Newest ${SHOWN} of ${shown.length} matching events.`;
      const filtered = KEYS.some((k) => w[k]);
      $('#events-filter-count').textContent = filtered ? `${shown.length} of ${all.length} events match` : `${all.length} events`;
    }
    const change = () => {
      const w = {};
      for (const k of KEYS) w[k] = field(k).value.trim();
      history.replaceState(null, '', href(w));
      render();
    };
    for (const k of ['kind', 'type', 'reason', 'since']) field(k).addEventListener('change', change);
    field('object').addEventListener('input', change);
    form.addEventListener('submit', (e) => { e.preventDefault(); change(); });
    window.addEventListener('popstate', render);
    collection(EVENTS, (all) => { items = all; render(); });
    // "since" moves with the clock: events age out of the window without a watch event.
    setInterval(() => { if (wanted().since) render(); }, 15000);
  }

  hive.eventsTable = eventsTable;
  if (document.body.dataset.page === 'overview') eventsTable('#ov-events', null, 25);
  if (document.body.dataset.page === 'events') eventsPage();
})();
