// hive dashboard: log views. Defines hive.tail (loaded after app.js, before the pages)
// with a view that keeps the followed text as lines and gives each log <pre> a toolbar:
// a search box that shows only matching lines with each match wrapped in a <mark>
// (text nodes only, never markup), a timestamps toggle (agent logs: the API's
// timestamps=true) and a download of what is shown (a Blob behind an object URL).
'use strict';

(() => {
  const { h } = hive;
  const MAX = 256 * 1024; // characters kept per view, as the plain tail did
  const views = new WeakMap(); // <pre> -> its view

  // What the view of one <pre> holds across re-follows (another node, the toggle).
  function view(pre) {
    let v = views.get(pre);
    if (v) return v;
    v = { text: '', query: '', timestamps: false, url: null, stateEl: null, onEmpty: null, stop: null, name: 'log' };
    const search = h('input', { type: 'search', class: 'log-search', placeholder: 'Search the log', 'aria-label': 'Search the log' });
    const count = h('span', { class: 'muted small log-count', role: 'status' });
    const stamps = h('input', { type: 'checkbox', class: 'log-timestamps' });
    const stampsLabel = h('label', { class: 'small log-timestamps-label' }, stamps, ' timestamps');
    const download = h('button', { type: 'button', class: 'small log-download' }, 'Download');
    const bar = h('div', { class: 'log-toolbar' }, search, count, stampsLabel, download);
    pre.before(bar);
    search.addEventListener('input', () => {
      v.query = search.value;
      render(pre, v);
    });
    stamps.addEventListener('change', () => {
      v.timestamps = stamps.checked;
      if (v.url) follow(v.url, pre, v.stateEl, v.onEmpty);
    });
    download.addEventListener('click', () => {
      const blob = new Blob([shown(v).join('')], { type: 'text/plain;charset=utf-8' });
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: v.name + '.log', hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    });
    Object.assign(v, { search, count, stamps, stampsLabel });
    views.set(pre, v);
    return v;
  }

  // Agent logs carry times; a node's build log is sent whole, without them.
  const isAgentLog = (url) => /\/agents\/[^/]+\/log/.test(url);
  function nameOf(url) {
    const u = new URL(url, location.href);
    const parts = u.pathname.split('/').map(decodeURIComponent);
    const node = u.searchParams.get('node');
    const base = parts[parts.length - 2] + (node ? '-' + node.replace(/\//g, '-') : '');
    return base.replace(/[^A-Za-z0-9._-]/g, '_');
  }

  // The lines shown: all, or those containing the query (case-insensitive).
  function shown(v) {
    const lines = v.text.split(/(?<=\n)/);
    if (!v.query) return lines;
    const q = v.query.toLowerCase();
    return lines.filter((l) => l.toLowerCase().includes(q));
  }

  function render(pre, v) {
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    if (!v.query) {
      pre.replaceChildren(document.createTextNode(v.text));
      v.count.textContent = '';
    } else {
      const q = v.query.toLowerCase();
      const lines = shown(v);
      const nodes = [];
      let matches = 0;
      for (const line of lines) {
        const lower = line.toLowerCase();
        let at = 0;
        for (let i = lower.indexOf(q); i >= 0; i = lower.indexOf(q, i + q.length)) {
          if (i > at) nodes.push(document.createTextNode(line.slice(at, i)));
          nodes.push(h('mark', {}, line.slice(i, i + q.length)));
          matches += 1;
          at = i + q.length;
        }
        nodes.push(document.createTextNode(line.slice(at)));
      }
      pre.replaceChildren(...nodes);
      v.count.textContent = `${lines.length} line${lines.length === 1 ? '' : 's'}, ${matches} match${matches === 1 ? '' : 'es'}`;
    }
    if (stick) pre.scrollTop = pre.scrollHeight;
  }

  function follow(url, pre, stateEl, onEmpty) {
    const v = view(pre);
    if (v.stop) v.stop();
    Object.assign(v, { url, stateEl, onEmpty, text: '', name: nameOf(url) });
    const agent = isAgentLog(url);
    v.stamps.disabled = !agent;
    v.stampsLabel.title = agent ? 'Prefix each line with the time it was written' : "A node's build log has no times";
    if (!agent) v.stamps.checked = false;
    const ctrl = new AbortController();
    v.stop = () => ctrl.abort();
    const say = (t) => stateEl && (stateEl.textContent = t);
    const full = agent && v.stamps.checked ? url + (url.includes('?') ? '&' : '?') + 'timestamps=true' : url;
    pre.dataset.timestamps = String(agent && v.stamps.checked);
    render(pre, v);
    say('connecting…');
    (async () => {
      try {
        const resp = await fetch(full, { credentials: 'same-origin', signal: ctrl.signal });
        if (!resp.ok) {
          let msg = resp.statusText;
          try {
            msg = (await resp.json()).message || msg;
          } catch (_) {}
          say('');
          pre.replaceChildren(h('span', { class: 'error' }, `${resp.status}: ${msg}`));
          return;
        }
        say('following');
        const reader = resp.body.getReader();
        const dec = new TextDecoder();
        let bytes = 0;
        try {
          for (;;) {
            const { done, value } = await reader.read();
            if (done) break;
            bytes += value.length;
            v.text += dec.decode(value, { stream: true });
            if (v.text.length > MAX) v.text = v.text.slice(v.text.indexOf('\n', v.text.length - MAX) + 1);
            render(pre, v);
          }
        } catch (e) {
          ctrl.abort(); // a failed read never leaves the stream holding a connection
          throw e;
        }
        say('ended');
        if (bytes === 0 && onEmpty && !ctrl.signal.aborted) onEmpty();
      } catch (e) {
        if (e.name !== 'AbortError') say('disconnected: ' + e.message);
      }
    })();
    return v.stop;
  }

  hive.tail = follow;
})();
