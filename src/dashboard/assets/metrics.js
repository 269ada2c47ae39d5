// hive dashboard: the /status page. Reads the API's /metrics with the signed-in session
// every few seconds, parses the Prometheus text format (our own small parser: samples,
// labels with their escapes, HELP and TYPE lines skipped), and shows the key numbers;
// rates and latencies come from the difference between two scrapes.
'use strict';

(() => {
  const { h, fill } = hive;
  const EVERY = 5000;

  // `text` in the Prometheus text format 0.0.4 as [{name, labels: {}, value}].
  function parse(text) {
    const samples = [];
    for (const raw of text.split('\n')) {
      const line = raw.trim();
      if (!line || line.startsWith('#')) continue;
      let i = 0;
      while (i < line.length && /[A-Za-z0-9_:]/.test(line[i])) i += 1;
      const name = line.slice(0, i);
      const labels = {};
      if (line[i] === '{') {
        i += 1;
        for (;;) {
          while (line[i] === ' ' || line[i] === ',') i += 1;
          if (line[i] === '}') { i += 1; break; }
          const eq = line.indexOf('=', i);
          if (eq < 0) throw new Error('bad label in ' + line);
          const key = line.slice(i, eq).trim();
          i = eq + 1;
          if (line[i] !== '"') throw new Error('bad label value in ' + line);
          i += 1;
          let value = '';
          while (i < line.length && line[i] !== '"') {
            if (line[i] === '\\') {
              i += 1;
              value += line[i] === 'n' ? '\n' : line[i];
            } else value += line[i];
            i += 1;
          }
          i += 1; // the closing quote
          labels[key] = value;
        }
      }
      const rest = line.slice(i).trim().split(/\s+/);
      const v = rest[0];
      const value = v === '+Inf' ? Infinity : v === '-Inf' ? -Infinity : Number(v);
      if (name) samples.push({ name, labels, value });
    }
    return samples;
  }

  // Helpers over one scrape.
  function view(samples) {
    const of = (name, where) => samples.filter((s) => s.name === name && (!where || where(s.labels)));
    const sum = (name, where) => of(name, where).reduce((a, s) => a + s.value, 0);
    const by = (name, label, where) => {
      const m = new Map();
      for (const s of of(name, where)) m.set(s.labels[label], (m.get(s.labels[label]) || 0) + s.value);
      return m;
    };
    // A histogram's buckets summed over its other labels: [[le, count]] by le.
    const buckets = (name, where) => {
      const m = new Map();
      for (const s of of(name + '_bucket', where)) m.set(s.labels.le, (m.get(s.labels.le) || 0) + s.value);
      return [...m.entries()].map(([le, n]) => [le === '+Inf' ? Infinity : Number(le), n]).sort((a, b) => a[0] - b[0]);
    };
    return { of, sum, by, buckets, has: (name) => samples.some((s) => s.name === name) };
  }

  // The q-quantile of the observations between two scrapes' buckets, as Prometheus'
  // histogram_quantile estimates it (linear within the bucket).
  function quantile(q, now, before) {
    const prev = new Map(before);
    const deltas = now.map(([le, n]) => [le, n - (prev.get(le) || 0)]);
    const total = deltas.length ? deltas[deltas.length - 1][1] : 0;
    if (total <= 0) return null;
    const rank = q * total;
    let lower = 0;
    let below = 0;
    for (const [le, n] of deltas) {
      if (n >= rank) {
        if (le === Infinity) return lower;
        return lower + (le - lower) * ((rank - below) / Math.max(n - below, 1e-9));
      }
      lower = le;
      below = n;
    }
    return lower;
  }

  const ms = (s) => (s == null ? '—' : s < 0.001 ? (s * 1e6).toFixed(0) + ' µs' : s < 1 ? (s * 1000).toFixed(1) + ' ms' : s.toFixed(2) + ' s');
  const num = (n) => (n == null ? '—' : Number.isInteger(n) ? String(n) : n.toFixed(2));
  const stat = (key, label, value, note) => h('div', { class: 'stat', 'data-metric': key }, h('div', { class: 'stat-value' }, value), h('div', { class: 'stat-label' }, label), note ? h('div', { class: 'muted small' }, note) : null);
  const table = (map, empty) => (map.size ? h('table', { class: 'rows small' }, h('tbody', {}, [...map.entries()].sort((a, b) => b[1] - a[1]).map(([k, v]) => h('tr', {}, h('td', {}, k || '—'), h('td', { class: 'num' }, num(v)))))) : h('p', { class: 'empty' }, empty));

  function render(now, before, dt) {
    const rate = (name, where) => (before ? Math.max(0, now.sum(name, where) - before.sum(name, where)) / dt : null);
    const mean = (name) => {
      if (!before) return null;
      const n = now.sum(name + '_count') - before.sum(name + '_count');
      return n > 0 ? (now.sum(name + '_sum') - before.sum(name + '_sum')) / n : null;
    };
    const q = (name, p) => (before ? quantile(p, now.buckets(name), before.buckets(name)) : null);
    const lat = 'apiserver_request_duration_seconds';
    const commit = 'hive_store_commit_duration_seconds';
    const errors = rate('apiserver_request_total', (l) => Number(l.code) >= 500);
    fill('#mx-api', h('div', { class: 'stats' },
      stat('request-rate', 'requests / s', num(rate('apiserver_request_total')), errors ? `${num(errors)} / s answered 5xx` : null),
      stat('request-latency', 'request latency p50 / p99', `${ms(q(lat, 0.5))} / ${ms(q(lat, 0.99))}`, 'mean ' + ms(mean(lat))),
      stat('inflight', 'requests in flight', num(now.sum('apiserver_current_inflight_requests'))),
      stat('watches', 'open watches', num(now.sum('apiserver_longrunning_requests', (l) => l.verb === 'WATCH')),
        `${num(now.sum('apiserver_longrunning_requests'))} open streams in all`)),
      h('h3', {}, 'Requests by verb (per second)'), before ? table(new Map([...now.by('apiserver_request_total', 'verb')].map(([k, v]) => [k, Math.max(0, v - (before.by('apiserver_request_total', 'verb').get(k) || 0)) / dt]).filter(([, v]) => v > 0)), 'No requests in the last interval.') : h('p', { class: 'muted' }, 'Rates appear after the second reading.'));
    fill('#mx-store', h('div', { class: 'stats' },
      stat('objects', 'objects', num(now.sum('apiserver_storage_objects'))),
      stat('revision', 'revision', num(now.sum('hive_store_revision'))),
      stat('commit-latency', 'commit latency p50 / p99', `${ms(q(commit, 0.5))} / ${ms(q(commit, 0.99))}`, 'mean ' + ms(mean(commit))),
      stat('events', 'events retained', num(now.sum('hive_store_events')))),
      h('h3', {}, 'Objects by resource'), table(now.by('apiserver_storage_objects', 'resource'), 'No objects.'));
    fill('#mx-scheduler', h('div', { class: 'stats' },
      stat('queue', 'queued nodes', num(now.sum('hive_scheduler_queued_nodes'))),
      stat('running-nodes', 'running nodes', num(now.sum('hive_scheduler_running_nodes'))),
      stat('lease-waits', 'lease waits', num(now.sum('hive_scheduler_lease_waits'))),
      stat('build-slots', 'build slots in use', `${num(now.sum('hive_scheduler_build_slots_in_use'))} / ${num(now.sum('hive_scheduler_build_slots'))}`)),
      h('h3', {}, 'Running nodes by kind'), table(now.by('hive_scheduler_running_nodes', 'kind'), 'Nothing running.'));
    const restarts = now.by('hive_agent_restarts', 'agent');
    fill('#mx-fleet', h('div', { class: 'stats' },
      stat('fleet-nodes', 'fleet nodes', num(now.sum('hive_fleet_nodes')), `${num(now.sum('hive_fleet_nodes', (l) => l.phase === 'Running'))} running`),
      stat('agent-restarts', 'agent restarts', num(now.sum('hive_agent_restarts')))),
      h('h3', {}, 'Fleet nodes by phase'), table(now.by('hive_fleet_nodes', 'phase'), 'No fleet nodes.'),
      h('h3', {}, 'Restarts by agent'), table(new Map([...restarts].filter(([, v]) => v > 0)), 'No agent has crashed.'));
  }

  async function status() {
    const state = document.getElementById('metrics-state');
    let before = null;
    let at = 0;
    let readings = 0;
    for (;;) {
      try {
        const resp = await fetch('/metrics', { credentials: 'same-origin', headers: { Accept: 'text/plain' } });
        if (resp.status === 401) { location.href = '/login'; return; }
        if (!resp.ok) throw new Error('/metrics answered ' + resp.status);
        const now = view(parse(await resp.text()));
        const t = performance.now();
        render(now, before, before ? (t - at) / 1000 : 1);
        before = now;
        at = t;
        readings += 1;
        state.textContent = 'Updated ' + new Date().toLocaleTimeString() + '.';
        state.className = '';
        document.body.dataset.metricsReadings = String(readings);
        hive.streamUp('metrics');
      } catch (e) {
        state.textContent = 'Cannot read the metrics: ' + e.message;
        state.className = 'error';
        hive.streamDown('metrics', e.message);
      }
      await hive.sleep(EVERY);
    }
  }

  hive.parseMetrics = parse;
  if (document.body.dataset.page === 'status') {
    hive.addStream('metrics');
    status();
  }
})();
