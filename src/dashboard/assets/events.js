// hive dashboard: core Events (/api/v1/events), live, newest first — the overview's
// recent events across every object, and one object's events on its own page
// (selected by involvedObject, as kubectl describe asks).
'use strict';

(() => {
  const { h, fill, pill, time, collection, agentLink } = hive;
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

  // A live table of events in `container`: all of them, or those about one object
  // (`about`: {kind, name}), newest first, at most `limit` rows.
  function eventsTable(container, about, limit) {
    if (typeof container === 'string') container = hive.$(container);
    if (!container) return null;
    const withObject = !about;
    const cols = ['Type', 'Reason', ...(withObject ? ['Object'] : []), 'Message', 'Count', 'Last seen'];
    const tbody = h('tbody', {});
    const table = h('table', { class: 'rows events' }, h('thead', {}, h('tr', {}, cols.map((c) => h('th', {}, c)))), tbody);
    const empty = h('p', { class: 'empty' }, about ? `No events about this ${about.kind.toLowerCase()}.` : 'No events yet.');
    const more = h('p', { class: 'muted small', hidden: true });
    let mounted = false; // "Loading…" stays until the first list answered
    const row = (e) => h('tr', { 'data-event': e.metadata.name, 'data-type': e.type || 'Normal' },
      h('td', {}, pill(e.type || 'Normal', e.type === 'Warning' ? 'bad' : 'off')),
      h('td', {}, h('b', {}, e.reason || '')),
      withObject ? h('td', {}, objectLink(e.involvedObject || {})) : null,
      h('td', { class: 'small' }, e.message || ''),
      h('td', {}, String(e.count || 1)),
      h('td', {}, time(when(e))));
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
    return table;
  }

  hive.eventsTable = eventsTable;
  if (document.body.dataset.page === 'overview') eventsTable('#ov-events', null, 25);
})();
