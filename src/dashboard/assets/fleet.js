// hive dashboard: the read-only Fleet view (nodes, small live charts, the telemetry
// explorer) and the /provision page (providers, configure, offers, provision, kill).
'use strict';

(() => {
  const { h, $, fill, pill, time, api, collection, keyed, result, options, API } = hive;
  const SVG = 'http://www.w3.org/2000/svg';

  // A small line chart of `values` (numbers) scaled to [0, max]; plain SVG, no library.
  function chart(values, { width = 90, height = 22, max = null, label = '' } = {}) {
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
    svg.setAttribute('width', width);
    svg.setAttribute('height', height);
    svg.setAttribute('class', 'spark');
    svg.setAttribute('preserveAspectRatio', 'none'); // stretch to the cell or panel width
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', label);
    if (values.length === 1) {
      // One sample so far: a level bar until there is a line to draw.
      const top = max || Math.max(values[0], 1);
      const bar = document.createElementNS(SVG, 'rect');
      bar.setAttribute('x', 0);
      bar.setAttribute('y', height - 4);
      bar.setAttribute('height', 4);
      bar.setAttribute('width', ((Math.min(values[0], top) / top) * width).toFixed(1));
      svg.append(bar);
    }
    if (values.length > 1) {
      const top = max || Math.max(...values, 1);
      const step = width / (values.length - 1);
      const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 1 - (Math.min(v, top) / top) * (height - 2)).toFixed(1)}`);
      const line = document.createElementNS(SVG, 'polyline');
      line.setAttribute('points', pts.join(' '));
      line.setAttribute('vector-effect', 'non-scaling-stroke');
      svg.append(line);
    }
    return svg;
  }
  const gib = (b) => (b / 1073741824).toFixed(1);
  // What a sparkline spans: its samples, since when, their range.
  function sparkTitle(what, hst, values) {
    if (!values.length) return what + ': no samples yet';
    const since = hst.first ? ' since ' + new Date(hst.first).toLocaleTimeString() : '';
    return `${what}: ${values.length} samples${since} · min ${Math.min(...values).toFixed(0)}% · max ${Math.max(...values).toFixed(0)}%`;
  }
  const pct = (v) => (v == null ? '—' : v.toFixed(0) + '%');

  function nodePhase(n) {
    return (n.status && n.status.phase) || 'Pending';
  }
  function providerRef(n) {
    const r = (n.status && n.status.providerRef) || {};
    if (r.pid) return 'pid ' + r.pid;
    if (r.containerId) return 'container ' + r.containerId.slice(0, 12);
    if (r.instanceId) return 'instance ' + r.instanceId;
    return '—';
  }

  // ---- Fleet ----------------------------------------------------------------------
  function fleet() {
    const history = new Map(); // node -> {at, cpu: [], mem: [], gpu: []}
    const record = (n) => {
      const t = n.status && n.status.telemetry;
      if (!t || !t.updatedAt) return;
      const hst = history.get(n.metadata.name) || { at: null, cpu: [], mem: [], gpu: [] };
      if (hst.at !== t.updatedAt) {
        hst.at = t.updatedAt;
        hst.first = hst.first || t.updatedAt;
        const push = (arr, v) => { if (v != null) { arr.push(v); if (arr.length > 40) arr.shift(); } };
        push(hst.cpu, t.cpuPercent);
        push(hst.mem, t.memoryTotalBytes ? (100 * t.memoryUsedBytes) / t.memoryTotalBytes : null);
        push(hst.gpu, t.gpuUtilizationPercent);
      }
      history.set(n.metadata.name, hst);
    };
    const row = (n) => {
      const s = n.status || {};
      const t = s.telemetry || {};
      const hst = history.get(n.metadata.name) || { cpu: [], mem: [], gpu: [] };
      const phase = nodePhase(n);
      const facts = [
        (s.addresses || []).join(', '),
        (s.gpus || []).map((g) => g.name + (g.memoryMib ? ` (${Math.round(g.memoryMib / 1024)} GiB)` : '')).join(', '),
        s.endpointId ? 'iroh ' + s.endpointId.slice(0, 10) + '…' : '',
      ].filter(Boolean);
      // A node that is gone keeps its last report, shown dimmed as such.
      const stale = ['Killed', 'Failed', 'Stopped'].includes(phase);
      const cls = [phase === 'Orphaned' ? 'orphan' : '', stale ? 'stale' : ''].join(' ').trim();
      return h('tr', { 'data-node': n.metadata.name, class: cls || null, title: stale && t.updatedAt ? 'telemetry last reported ' + t.updatedAt : null, 'data-seeded': hst.seeded ? 'true' : null },
        h('td', {}, h('b', {}, hive.nodeLink(n.metadata.name)), h('div', { class: 'muted small' }, '#' + n.spec.logicalId)),
        h('td', {}, pill(phase), phase === 'Orphaned' ? h('div', { class: 'error small' }, '⚠ found at the provider without a record; left untouched') : null),
        h('td', {}, n.spec.provider), h('td', { class: 'mono small' }, providerRef(n)),
        h('td', { class: 'small' }, facts.length ? facts.join(' · ') : '—'),
        h('td', { class: 'metric', title: sparkTitle('CPU, 100% = one core', hst, hst.cpu) }, chart(hst.cpu, { max: Math.max(100, ...hst.cpu), label: 'CPU (100% = one core)' }), h('span', { 'data-metric': 'cpu' }, pct(t.cpuPercent))),
        h('td', { class: 'metric', title: sparkTitle('memory used', hst, hst.mem) }, chart(hst.mem, { max: 100, label: 'memory' }), h('span', {}, t.memoryTotalBytes ? `${gib(t.memoryUsedBytes || 0)}/${gib(t.memoryTotalBytes)} GiB` : '—')),
        h('td', { class: 'metric', title: sparkTitle('GPU', hst, hst.gpu) }, chart(hst.gpu, { max: 100, label: 'GPU' }), h('span', {}, pct(t.gpuUtilizationPercent))),
        h('td', { class: 'error small' }, s.error || ''),
        h('td', {}, time(n.metadata.creationTimestamp)));
    };
    const rows = keyed($('#nodes-rows'), row, (a, b) => a.localeCompare(b, undefined, { numeric: true }));
    const select = $('#explorer-node');
    // Each live node's sparklines start from the hub's recent frames, once.
    const seeded = new Set();
    const seed = (name) => {
      seeded.add(name);
      hive.seedNode(name).then((recent) => {
        const n = items.get(name);
        if (!n) return;
        const hst = history.get(name) || { at: null, cpu: [], mem: [], gpu: [] };
        const before = hst.first ? Date.parse(hst.first) : Infinity;
        let oldest = hst.first;
        for (const key of ['cpu', 'mem', 'gpu']) {
          const older = recent[key].filter((f) => Date.parse(f.at) < before);
          if (older.length && (!oldest || Date.parse(older[0].at) < Date.parse(oldest))) oldest = older[0].at;
          hst[key] = older.map((f) => f.value).concat(hst[key]).slice(-40);
        }
        hst.first = oldest;
        hst.seeded = true;
        history.set(name, hst);
        const old = rows.rows.get(name);
        if (!old) return;
        const fresh = row(n);
        old.replaceWith(fresh);
        rows.rows.set(name, fresh);
      }).catch(() => {});
    };
    const items = collection('nodes', (items, changed, reset) => {
      for (const k of reset ? items.keys() : changed) if (items.has(k)) record(items.get(k));
      for (const [k, n] of items) if (!seeded.has(k) && !['Killed', 'Failed', 'Stopped'].includes(nodePhase(n)) && seeded.size < 24) seed(k);
      // A deleted node's chart history goes with it.
      for (const k of reset ? [...history.keys()] : changed) if (!items.has(k)) history.delete(k);
      rows.update(items, changed, reset);
      $('#nodes-empty').hidden = items.size > 0;
      const phases = [...items.values()].map(nodePhase);
      $('#fleet-summary').textContent = `${phases.filter((p) => p === 'Running').length} of ${items.size} nodes running` +
        (phases.includes('Orphaned') ? ` · ${phases.filter((p) => p === 'Orphaned').length} orphaned` : '');
      const names = [...items.keys()].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
      // Rebuilt only when the names changed: rebuilding closes an open dropdown.
      const have = [...select.options].map((o) => o.value).slice(1);
      if (select.options.length === 0 || have.join('\n') !== names.join('\n')) {
        const current = select.value;
        fill(select, h('option', { value: '' }, '— choose —'), names.map((n) => h('option', { value: n }, n)));
        select.value = names.includes(current) ? current : '';
      }
    });
    explorer(select, items);
  }

  // The telemetry explorer: one NDJSON stream per chosen node; its first line lists the
  // channels, then frames (recent history first, then live) feed the chosen channel.
  function explorer(select) {
    let ctrl = null;
    let channel = null;
    let frames = new Map();
    let units = new Map();
    const status = $('#explorer-status');
    let received = 0; // frames of this stream, any channel (the suite sees it grow)
    const draw = () => {
      for (const b of document.querySelectorAll('#explorer-channels button')) b.classList.toggle('chosen', b.dataset.channel === channel);
      const values = (frames.get(channel) || []).map((f) => f.value);
      const last = values[values.length - 1];
      fill('#explorer-chart', channel ? [h('div', { class: 'chart-title' }, h('b', {}, channel), ' ', last != null ? `${last.toFixed(2)} ${units.get(channel) || ''}` : 'no frames yet'),
        hive.timeChart(frames.get(channel) || [], { unit: units.get(channel), label: channel }),
        values.length ? h('div', { class: 'muted small' }, `${values.length} frames · min ${Math.min(...values).toFixed(2)} · max ${Math.max(...values).toFixed(2)} ${units.get(channel) || ''}`) : null]
        : h('p', { class: 'muted' }, 'Pick a channel.'));
    };
    select.addEventListener('change', async () => {
      if (ctrl) ctrl.abort();
      frames = new Map();
      units = new Map();
      channel = null;
      fill('#explorer-channels');
      fill('#explorer-chart');
      const node = select.value;
      if (!node) return;
      ctrl = new AbortController();
      const mine = ctrl;
      received = 0;
      status.className = 'muted';
      status.textContent = 'Connecting to ' + node + '…';
      try {
        const resp = await fetch(`/hive/v1/fleet/nodes/${encodeURIComponent(node)}/telemetry`, { credentials: 'same-origin', signal: mine.signal });
        if (!resp.ok) {
          let msg = resp.statusText;
          try { msg = (await resp.json()).message || msg; } catch (_) {}
          status.className = 'error';
          status.textContent = `Telemetry stream unavailable (${resp.status}): ${msg}`;
          return;
        }
        status.textContent = 'Following ' + node + '.';
        let pendingDraw = false;
        try {
          await hive.readLines(resp, (line) => {
          const m = JSON.parse(line);
          if (m.type === 'descriptors') {
            fill('#explorer-channels', (m.channels || []).map((c) => {
              units.set(c.channel, c.unit || '');
              return h('li', {}, h('button', { type: 'button', class: 'link', 'data-channel': c.channel, title: c.description || '',
                onclick: () => { channel = c.channel; draw(); } }, c.channel), h('span', { class: 'muted small' }, ' ' + (c.unit || '')));
            }));
            if (!channel && m.channels && m.channels.length) channel = m.channels[0].channel;
          } else if (m.type === 'frame') {
            received += 1;
            status.dataset.frames = String(received);
            const arr = frames.get(m.channel) || [];
            arr.push(m);
            if (arr.length > 300) arr.shift();
            frames.set(m.channel, arr);
            if (m.channel === channel && !pendingDraw) {
              pendingDraw = true;
              requestAnimationFrame(() => { pendingDraw = false; draw(); });
            }
          }
          });
        } finally {
          mine.abort(); // never leave a half-read stream holding a connection
        }
        if (ctrl === mine) status.textContent = 'The stream ended.';
      } catch (e) {
        if (e.name !== 'AbortError') {
          status.className = 'error';
          status.textContent = 'Telemetry stream failed: ' + e.message;
        }
      }
    });
  }

  // ---- Provision ------------------------------------------------------------------
  function freshId(verb) {
    const b = new Uint8Array(5);
    crypto.getRandomValues(b);
    return verb + '-' + [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  }
  function provision() {
    collection('providers', (items) => {
      const ps = [...items.values()];
      fill('#providers', ps.length ? h('table', { class: 'rows' }, h('tbody', {}, ps.map((p) => h('tr', { 'data-provider': p.metadata.name },
        h('td', {}, h('b', {}, p.metadata.name)), h('td', {}, p.spec.type), h('td', {}, pill((p.status && p.status.state) || 'Unconfigured')),
        h('td', { class: 'small' }, (p.status && p.status.message) || ''))))) : h('p', { class: 'empty' }, 'No Provider objects; the built-in process provider needs none.'));
      const names = [...new Set(['process', ...ps.map((p) => p.metadata.name)])];
      // ConfigureProvider and offers are Vast.ai's; provisioning takes any provider.
      const vast = ps.filter((p) => p.spec.type === 'vastai').map((p) => p.metadata.name);
      const choices = { '#configure-provider': vast.length ? vast : ['vastai'], '#offers-provider': vast, '#provision-provider': names };
      for (const [id, list] of Object.entries(choices)) {
        const sel = $(id);
        if (sel) options(sel, list, '(no Vast.ai provider)');
      }
    });
    const nodes = collection('nodes', (items) => {
      const sel = $('#kill-node');
      if (!sel) return;
      const live = [...items.values()].filter((n) => !['Killed', 'Killing'].includes(nodePhase(n))).map((n) => n.metadata.name).sort();
      options(sel, live, '(no live nodes)');
      $('#kill-form button[type=submit]').disabled = live.length === 0;
      // A confirmation names one node; once that node is no longer live it is void.
      const box = $('#kill-confirm');
      if (box && !box.hidden && !live.includes(box.dataset.node)) {
        box.hidden = true;
        result('#kill-result', false, `${box.dataset.node} is no longer live; nothing was killed.`);
        delete box.dataset.node;
      }
    });
    const commandRow = (c) => {
      const s = c.status || {};
      const action = c.spec.provision ? `provision ${c.spec.provision.count} × ${c.spec.provision.provider}` : c.spec.kill ? `kill ${c.spec.kill.node}` : '?';
      return h('tr', { 'data-command': c.metadata.name }, h('td', { class: 'mono' }, c.metadata.name), h('td', {}, action), h('td', {}, pill(s.phase || 'Pending')),
        h('td', {}, (s.nodes || []).join(', ') || '—'), h('td', { class: 'error small' }, s.error || ''), h('td', {}, time(s.startedAt || c.metadata.creationTimestamp)), h('td', {}, time(s.finishedAt)));
    };
    const stamp = new Map();
    const cmds = keyed($('#commands-rows'), commandRow, (a, b) => (stamp.get(b) || 0) - (stamp.get(a) || 0) || (a < b ? -1 : 1));
    collection('fleetcommands', (items, changed, reset) => {
      for (const [k, c] of items) stamp.set(k, Date.parse(c.metadata.creationTimestamp) || 0);
      cmds.update(items, changed, reset);
      for (const k of [...stamp.keys()]) if (!items.has(k)) stamp.delete(k); // DELETED ones
      $('#commands-empty').hidden = items.size > 0;
    });

    // Submit buttons are rendered disabled, so a native submit (the key in a request
    // before this handler exists) cannot happen; each is enabled once its handler is on.
    const ready = (form) => { const b = form.querySelector('button[type=submit]'); if (b) b.disabled = false; };
    const configure = $('#configure-form');
    if (configure) configure.addEventListener('submit', async (e) => {
      e.preventDefault();
      const f = new FormData(configure);
      const body = { apiKey: f.get('apiKey') };
      if (f.get('baseUrl')) body.baseUrl = f.get('baseUrl');
      configure.elements.apiKey.value = ''; // write-only: never kept in the page
      try {
        const p = await api('POST', `/hive/v1/fleet/providers/${encodeURIComponent(f.get('provider'))}/configure`, body);
        result('#configure-result', true, `Configured: ${(p.status && p.status.state) || 'saved'}${p.status && p.status.message ? ' — ' + p.status.message : ''}`);
      } catch (err) {
        result('#configure-result', false, err.message);
      }
    });
    if (configure) ready(configure);

    const selected = new Set();
    const offersForm = $('#offers-form');
    if (offersForm) offersForm.addEventListener('submit', async (e) => {
      e.preventDefault();
      const q = new URLSearchParams();
      for (const [k, v] of new FormData(offersForm)) if (v) q.set(k, v);
      fill('#offers', h('p', { class: 'muted' }, 'Searching…'));
      try {
        const res = await api('GET', '/hive/v1/fleet/offers?' + q);
        const offers = res.offers || [];
        selected.clear();
        showSelected();
        fill('#offers', offers.length ? h('table', { class: 'rows' },
          h('thead', {}, h('tr', {}, ['', 'Offer', 'GPU', 'GPUs', 'GPU RAM', '$/h', 'Reliability', 'Where', 'Verified'].map((c) => h('th', {}, c)))),
          h('tbody', {}, offers.map((o) => h('tr', {},
            h('td', {}, h('input', { type: 'checkbox', 'data-offer': o.id, onchange: (ev) => { ev.target.checked ? selected.add(o.id) : selected.delete(o.id); showSelected(); } })),
            h('td', { class: 'mono' }, o.id), h('td', {}, o.gpuName), h('td', {}, o.numGpus), h('td', {}, o.gpuRamGb + ' GB'),
            h('td', {}, '$' + Number(o.dollarsPerHour).toFixed(3)), h('td', {}, (100 * o.reliability).toFixed(1) + '%'), h('td', {}, o.geolocation || '—'),
            h('td', {}, o.verified ? '✓ yes' : '— no'))))) : h('p', { class: 'empty' }, 'No offers match these filters.'));
      } catch (err) {
        fill('#offers', h('p', { class: 'error' }, 'Offer search failed: ' + err.message));
      }
    });
    if (offersForm) ready(offersForm);
    function showSelected() {
      const el = $('#provision-selected');
      if (el) el.textContent = selected.size ? `Selected offers: ${[...selected].join(', ')}` : 'No offers selected.';
    }

    const prov = $('#provision-form');
    if (prov) prov.addEventListener('submit', async (e) => {
      e.preventDefault();
      const f = new FormData(prov);
      const name = prov.dataset.command;
      const spec = { provision: { provider: f.get('provider'), count: Number(f.get('count') || 1) } };
      if (selected.size) spec.provision.selectedOfferIds = [...selected];
      try {
        const reply = await hive.send('POST', `${API}/fleetcommands`, { apiVersion: 'hive.dev/v1', kind: 'FleetCommand', metadata: { name }, spec });
        // 200 is the server replaying the stored command: this id was submitted before.
        if (reply.status === 200) result('#provision-result', true, `Already submitted as ${name}: the command runs once.`);
        else result('#provision-result', true, `Submitted as ${name}.`);
      } catch (err) {
        return result('#provision-result', false, err.message);
      }
      const again = h('button', { type: 'button', class: 'small', onclick: () => {
        prov.dataset.command = freshId('provision');
        $('#provision-command').textContent = prov.dataset.command;
        again.remove();
        result('#provision-result', true, 'New command id ready.');
      } }, 'Prepare another');
      $('#provision-result').append(' ', again);
    });
    if (prov) ready(prov);

    // Kill: the confirmation remembers the node it asked about (the select may change
    // under it), and a command id is only ever retried for the node it was first sent
    // for; another node gets a fresh id, or the server would replay the first kill.
    const kill = $('#kill-form');
    if (kill) {
      const confirmBox = $('#kill-confirm');
      const hideConfirm = () => { confirmBox.hidden = true; delete confirmBox.dataset.node; };
      kill.addEventListener('submit', (e) => {
        e.preventDefault();
        const node = kill.elements.node.value;
        if (!node) return result('#kill-result', false, 'Choose a node.');
        confirmBox.dataset.node = node;
        $('#kill-question').textContent = `Kill ${node}? Its workload stops and the provider releases it.`;
        confirmBox.hidden = false;
      });
      $('#kill-no').addEventListener('click', hideConfirm);
      $('#kill-yes').addEventListener('click', async () => {
        const node = confirmBox.dataset.node;
        hideConfirm();
        if (!node) return;
        if (kill.dataset.commandNode && kill.dataset.commandNode !== node) kill.dataset.command = freshId('kill');
        kill.dataset.commandNode = node;
        const name = kill.dataset.command;
        try {
          await api('POST', `${API}/fleetcommands`, { apiVersion: 'hive.dev/v1', kind: 'FleetCommand', metadata: { name }, spec: { kill: { node } } });
          result('#kill-result', true, `Kill of ${node} submitted as ${name}.`);
          kill.dataset.command = freshId('kill');
          delete kill.dataset.commandNode;
        } catch (err) {
          result('#kill-result', false, err.message);
        }
      });
    }
    return nodes;
  }

  hive.explorer = explorer; // the node page follows one node's telemetry with it
  const pages = { fleet, provision };
  const page = pages[document.body.dataset.page];
  if (page) page();
})();
