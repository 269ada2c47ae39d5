// hive dashboard: sortable tables. A click on a header sorts the rows by that column,
// ascending, then descending; the header shows which (aria-sort and an arrow). The sort
// is stable — ties keep the rows' own order (their keys, as the page lists them) — and
// it holds under live updates: the live views keep inserting and replacing rows, and
// every change to the rows re-applies the chosen order.
'use strict';

(() => {
  const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: 'base' });

  // A cell's sort value: its `data-sort`, else a time's age (so ascending Age is newest
  // first), else a number when the text is one, else the text.
  function value(td) {
    if (!td) return '';
    if (td.dataset.sort !== undefined) return td.dataset.sort;
    const t = td.querySelector('time[datetime]');
    if (t) return -(Date.parse(t.getAttribute('datetime')) || 0);
    const text = td.textContent.trim();
    const n = Number(text.replace(/[%,]/g, ''));
    return text !== '' && Number.isFinite(n) ? n : text;
  }
  function compare(a, b) {
    if (typeof a === 'number' && typeof b === 'number') return a - b;
    if (typeof a === 'number') return -1; // numbers before words ('—')
    if (typeof b === 'number') return 1;
    return collator.compare(String(a), String(b));
  }
  // A row's own key, for ties: the data-* attribute the page keys it by.
  function key(tr) {
    for (const [k, v] of Object.entries(tr.dataset)) if (k !== 'sort') return v;
    return '';
  }

  // Makes `table` sortable; returns it. Idempotent.
  function sortable(table) {
    if (!table || table.dataset.sortable === 'on') return table;
    const head = table.tHead && table.tHead.rows[0];
    const body = table.tBodies[0];
    if (!head || !body) return table;
    table.dataset.sortable = 'on';
    let column = -1;
    let dir = 1;
    let applying = false;
    const headers = [...head.cells];
    const apply = () => {
      if (column < 0) return;
      applying = true;
      const rows = [...body.rows];
      const sorted = rows
        .map((tr) => ({ tr, v: value(tr.cells[column]), k: key(tr) }))
        .sort((a, b) => dir * compare(a.v, b.v) || collator.compare(a.k, b.k));
      if (sorted.some((s, i) => s.tr !== rows[i])) body.append(...sorted.map((s) => s.tr));
      observer.takeRecords();
      applying = false;
    };
    const observer = new MutationObserver(() => {
      if (!applying) apply();
    });
    observer.observe(body, { childList: true, subtree: true, characterData: true });
    headers.forEach((th, i) => {
      const label = th.textContent;
      const button = hive.h('button', { type: 'button', class: 'sort', title: 'Sort by ' + label }, label);
      th.replaceChildren(button);
      button.addEventListener('click', () => {
        dir = column === i ? -dir : 1;
        column = i;
        for (const other of headers) other.removeAttribute('aria-sort');
        th.setAttribute('aria-sort', dir > 0 ? 'ascending' : 'descending');
        apply();
      });
    });
    return table;
  }

  hive.sortable = sortable;
  // Every table the server rendered with a header; live tables built in script call
  // hive.sortable themselves.
  for (const table of document.querySelectorAll('table.rows')) sortable(table);
})();
