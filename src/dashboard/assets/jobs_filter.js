// hive dashboard: the Jobs page's filter (template, agent, phase) and the pages of its
// history (20 a page, or `limit`), all kept in the page's URL
// (/jobs?template=Restart&agent=alpha&page=2) so a filtered view can be linked. It works on the cards pages.js keeps live: the page
// follows every Job through one watch (a paged list could not be watched as one), so
// filtering and paging are done here, over that list, hiding what is not shown.
'use strict';

(() => {
  if (document.body.dataset.page !== 'jobs') return;
  const { h, $, fill } = hive;
  const PAGE = 20;
  const PHASES = ['Queued', 'Running', 'Done', 'Failed', 'Cancelled'];
  const KEYS = ['template', 'agent', 'phase'];
  const selects = { template: $('#jobs-filter-template'), agent: $('#jobs-filter-agent'), phase: $('#jobs-filter-phase') };

  function wanted() {
    const q = new URLSearchParams(location.search);
    const w = {};
    for (const k of KEYS) w[k] = q.get(k) || '';
    w.page = Math.max(1, parseInt(q.get('page') || '1', 10) || 1);
    w.limit = Math.max(1, parseInt(q.get('limit') || String(PAGE), 10) || PAGE);
    return w;
  }
  function href(w, page) {
    const q = new URLSearchParams();
    for (const k of KEYS) if (w[k]) q.set(k, w[k]);
    if (w.limit !== PAGE) q.set('limit', String(w.limit));
    if (page > 1) q.set('page', String(page));
    const s = q.toString();
    return '/jobs' + (s ? '?' + s : '');
  }

  const facts = (card) => ({
    template: (card.querySelector('header .tag') || {}).textContent || '',
    agents: [...card.querySelectorAll('header .agents a')].map((a) => a.textContent),
    phase: card.dataset.phase || 'Queued',
  });
  const matches = (f, w) => (!w.template || f.template === w.template) && (!w.agent || f.agents.includes(w.agent)) && (!w.phase || f.phase === w.phase);

  // A select's choices: "any", then `values`; rebuilt only when they changed, so an
  // open dropdown is not closed under the user.
  function choices(sel, values, current) {
    const want = ['', ...[...new Set([...values, current].filter(Boolean))].sort()];
    const have = [...sel.options].map((o) => o.value);
    if (have.join('\n') !== want.join('\n')) fill(sel, want.map((v) => h('option', { value: v }, v || 'any')));
    sel.value = current;
  }

  let scheduled = false;
  function apply() {
    scheduled = false;
    const w = wanted();
    const active = [...document.querySelectorAll('#jobs-active > .job')];
    const history = [...document.querySelectorAll('#jobs-history > .job')];
    const all = [...active, ...history].map((card) => [card, facts(card)]);
    choices(selects.template, all.map(([, f]) => f.template), w.template);
    choices(selects.agent, all.flatMap(([, f]) => f.agents), w.agent);
    choices(selects.phase, [...PHASES, ...all.map(([, f]) => f.phase)], w.phase);
    let shownActive = 0;
    for (const card of active) {
      card.hidden = !matches(facts(card), w);
      if (!card.hidden) shownActive += 1;
    }
    const matching = history.filter((card) => matches(facts(card), w));
    const pages = Math.max(1, Math.ceil(matching.length / w.limit));
    const page = Math.min(w.page, pages);
    const first = (page - 1) * w.limit;
    for (const card of history) card.hidden = true;
    matching.slice(first, first + w.limit).forEach((card) => { card.hidden = false; });
    const filtered = KEYS.some((k) => w[k]);
    $('#jobs-filter-count').textContent = filtered ? `${shownActive + matching.length} of ${all.length} Jobs match` : '';
    const pager = $('#jobs-pages');
    pager.dataset.page = String(page);
    pager.dataset.pages = String(pages);
    fill(pager, pages > 1 || page > 1 ? [
      page > 1 ? h('a', { href: href(w, page - 1), 'data-page': page - 1, rel: 'prev' }, '‹ Newer') : h('span', { class: 'muted' }, '‹ Newer'),
      h('span', { class: 'muted small' }, ` Page ${page} of ${pages} · ${matching.length} finished Job${matching.length === 1 ? '' : 's'} `),
      page < pages ? h('a', { href: href(w, page + 1), 'data-page': page + 1, rel: 'next' }, 'Older ›') : h('span', { class: 'muted' }, 'Older ›'),
    ] : []);
    const empty = $('#jobs-history-empty');
    empty.dataset.text = empty.dataset.text || empty.textContent;
    empty.textContent = history.length ? 'No finished Job matches the filter.' : empty.dataset.text;
    if (history.length) empty.hidden = matching.length > 0;
  }
  const schedule = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(apply);
  };

  for (const k of KEYS) {
    selects[k].addEventListener('change', () => {
      const w = wanted();
      w[k] = selects[k].value;
      history.replaceState(null, '', href(w, 1));
      apply();
    });
  }
  $('#jobs-filter').addEventListener('submit', (e) => e.preventDefault());
  $('#jobs-pages').addEventListener('click', (e) => {
    const a = e.target.closest('a[data-page]');
    if (!a) return;
    e.preventDefault();
    history.pushState(null, '', a.getAttribute('href'));
    apply();
    $('#jobs-history').scrollIntoView({ block: 'nearest' });
  });
  window.addEventListener('popstate', apply);
  const observer = new MutationObserver(schedule);
  for (const id of ['#jobs-active', '#jobs-history']) observer.observe($(id), { childList: true });
  apply();
})();
