// hive dashboard: the pages of one object beyond what pages.js draws. The agent page's
// Jobs, Events, spec as YAML, Kill and Delete (pages.js's agent() calls these); the node
// page; the Job page (its card, its graph from dag.js, its log pane); and the not-found state of each, for an object the API says does
// not exist (or no longer does): no controls, no "Loading…" left behind.
'use strict';

(() => {
  const { h, $, fill, pill, time, api, collection, keyed, result, agentLink, API } = hive;

  const jobHref = (name) => '/jobs/' + encodeURIComponent(name);

  // Shows that `kind` `name` does not exist: the summary says so with a way back, the
  // controls are hidden and every placeholder still loading is cleared.
  function missing(summary, kind, name, back) {
    fill(summary, h('div', { class: 'not-found', 'data-missing': kind },
      h('p', { class: 'error' }, `There is no ${kind.toLowerCase()} named ${name}: the API answers 404 (never created, or deleted).`),
      h('p', {}, h('a', { href: back[0] }, back[1]))));
    for (const el of document.querySelectorAll('[data-control]')) el.hidden = true;
    for (const p of document.querySelectorAll('main p.muted')) if (p.textContent === 'Loading…') p.textContent = '—';
    for (const pre of document.querySelectorAll('main pre')) if (pre.textContent === 'Loading…') pre.textContent = '';
  }
  function present() {
    for (const el of document.querySelectorAll('[data-control]')) el.hidden = false;
  }

  // ---- the agent page's parts ---------------------------------------------------
  const touches = (j, name) => (j.spec.agents || []).includes(name) || (j.spec.nodes || []).some((n) => n.agent === name);
  const created = (o) => Date.parse((o.status && o.status.submittedAt) || o.metadata.creationTimestamp || 0) || 0;

  const agentPage = {
    // Marks the page's controls, starts its Events and wires Kill and Delete.
    start(name) {
      for (const id of ['#power', '#power-job', '#agent-danger']) {
        const el = $(id);
        if (el) el.dataset.control = '';
      }
      hive.eventsTable('#agent-events', { kind: 'Agent', name }, 50);
      dangerControls(name);
    },
    // The agent as the API has it now.
    show(a) {
      present();
      for (const b of document.querySelectorAll('#agent-danger > button')) b.disabled = false;
      const m = a.metadata || {};
      const meta = { name: m.name };
      if (m.labels && Object.keys(m.labels).length) meta.labels = m.labels;
      if (m.annotations && Object.keys(m.annotations).length) meta.annotations = m.annotations;
      const doc = { apiVersion: a.apiVersion || 'hive.dev/v1', kind: a.kind || 'Agent', metadata: meta, spec: a.spec };
      const pre = $('#agent-yaml');
      if (pre) pre.textContent = hive.toYaml(doc);
    },
    missing(name) {
      missing('#agent-summary', 'Agent', name, ['/agents', '← All agents']);
      const box = $('#agent-confirm');
      if (box) box.hidden = true;
    },
    // The Jobs that touch the agent, newest first.
    jobs(items, name) {
      const el = $('#agent-jobs');
      if (!el) return;
      const mine = [...items.values()].filter((j) => touches(j, name)).sort((a, b) => created(b) - created(a) || (a.metadata.name < b.metadata.name ? 1 : -1));
      let table = el.querySelector('table');
      if (!table) {
        table = h('table', { class: 'rows', id: 'agent-jobs-table' },
          h('thead', {}, h('tr', {}, ['Job', 'Template', 'Phase', 'Submitted', 'Finished', 'Message'].map((c) => h('th', {}, c)))), h('tbody', {}));
        fill(el, h('div', { class: 'scroll' }, table), h('p', { class: 'empty', id: 'agent-jobs-empty' }, 'No Jobs have touched this agent (the server keeps the last 5 finished per template).'));
        hive.sortable(table);
      }
      fill(table.tBodies[0], mine.map((j) => {
        const s = j.status || {};
        return h('tr', { 'data-job': j.metadata.name, 'data-phase': s.phase || 'Queued' },
          h('td', {}, h('a', { href: jobHref(j.metadata.name) }, j.metadata.name)),
          h('td', {}, j.spec.template || 'Custom'),
          h('td', {}, pill(s.phase || 'Queued', s.phase === 'Running' ? 'run' : undefined)),
          h('td', {}, time(s.submittedAt || j.metadata.creationTimestamp)),
          h('td', {}, time(s.finishedAt)),
          h('td', { class: s.phase === 'Failed' ? 'error small' : 'muted small' }, s.message || ''));
      }));
      table.hidden = mine.length === 0;
      $('#agent-jobs-empty').hidden = mine.length > 0;
    },
  };
  hive.agentPage = agentPage;

  // Kill (a Kill Job: wanted Offline, stopped without a graceful drain) and Delete (the
  // Agent object; its runtime is cleaned up before it goes), each after a confirmation
  // that names the agent and what will happen.
  function dangerControls(name) {
    const box = $('#agent-confirm');
    if (!box) return;
    const question = $('#agent-confirm-question');
    const hide = () => { box.hidden = true; delete box.dataset.action; };
    const ask = (action, text) => {
      box.dataset.action = action;
      question.textContent = text;
      $('#agent-confirm-yes').textContent = action === 'kill' ? 'Yes, kill it' : 'Yes, delete it';
      box.hidden = false;
    };
    $('#agent-kill').addEventListener('click', () =>
      ask('kill', `Kill ${name}? It is stopped at once, without a graceful drain, and stays stopped (wanted Offline) until it is started again.`));
    $('#agent-delete').addEventListener('click', () =>
      ask('delete', `Delete ${name}? Its runtime is removed and the Agent is gone; this cannot be undone.`));
    $('#agent-confirm-no').addEventListener('click', hide);
    $('#agent-confirm-yes').addEventListener('click', async () => {
      const action = box.dataset.action;
      hide();
      const out = $('#agent-danger-result');
      try {
        if (action === 'kill') {
          const job = await api('POST', `${API}/jobs`, { apiVersion: 'hive.dev/v1', kind: 'Job', metadata: {}, spec: { template: 'Kill', agents: [name], source: 'Dashboard' } });
          result(out, true, 'Kill submitted as ');
          out.append(h('a', { href: jobHref(job.metadata.name) }, job.metadata.name), '.');
        } else if (action === 'delete') {
          await api('DELETE', `${API}/agents/${encodeURIComponent(name)}`);
          result(out, true, `Deleted ${name}.`);
          location.href = '/agents';
        }
      } catch (err) {
        result(out, false, `${action === 'kill' ? 'Kill' : 'Delete'} refused: ${err.message}`);
      }
    });
  }

  // ---- a Node -------------------------------------------------------------------
  const gib = (b) => (b / 1073741824).toFixed(1) + ' GiB';
  function conditionsTable(cs) {
    return cs.length ? h('table', { class: 'rows' }, h('tbody', {}, cs.map((c) => h('tr', { 'data-condition': c.type },
      h('td', {}, h('b', {}, c.type)), h('td', {}, pill(c.status === 'True' ? 'True' : 'False', hive.conditionTone(c))),
      h('td', {}, c.reason || ''), h('td', { class: 'small' }, c.message || ''), h('td', {}, time(c.lastTransitionTime))))))
      : h('p', { class: 'empty' }, 'No conditions reported yet.');
  }
  function facts(pairs) {
    return h('dl', { class: 'facts' }, pairs.filter(([, v]) => v != null && v !== '').map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
  }
  function node() {
    const name = $('#node').dataset.node;
    let started = false;
    collection('nodes', (items) => {
      const n = items.get(name);
      if (!n) return missing('#node-summary', 'Node', name, ['/fleet', '← The fleet']);
      const s = n.status || {};
      const r = s.providerRef || {};
      const ref = r.pid ? 'pid ' + r.pid : r.containerId ? 'container ' + r.containerId.slice(0, 12) : r.instanceId ? 'instance ' + r.instanceId : '—';
      fill('#node-summary', pill(s.phase || 'Pending'), ' ',
        h('span', {}, 'provider ', h('b', {}, n.spec.provider), ' · ', ref, ' · logical id #' + n.spec.logicalId),
        s.error ? h('p', { class: 'error' }, s.error) : null);
      fill('#node-conditions', conditionsTable(s.conditions || []));
      const rt = s.runtime || {};
      const t = s.telemetry || {};
      fill('#node-facts', facts([
        ['Hostname', rt.hostname], ['CPUs', rt.cpus != null ? String(rt.cpus) : null],
        ['Memory', rt.memoryTotalBytes ? gib(rt.memoryTotalBytes) : null],
        ['GPUs', (s.gpus || []).map((g) => g.name + (g.memoryMib ? ` (${Math.round(g.memoryMib / 1024)} GiB)` : '')).join(', ')],
        ['Addresses', (s.addresses || []).join(', ')], ['Endpoint', s.endpointId ? h('span', { class: 'mono' }, s.endpointId) : null],
        ['Joined by', rt.joinedBy], ['Joined', rt.joinedAt ? time(rt.joinedAt) : null],
        ['CPU now', t.cpuPercent != null ? t.cpuPercent.toFixed(0) + '%' : null],
        ['Memory now', t.memoryTotalBytes ? `${gib(t.memoryUsedBytes || 0)} of ${gib(t.memoryTotalBytes)}` : null],
        ['Telemetry at', t.updatedAt ? time(t.updatedAt) : null],
        ['Provisioned', s.provisionedAt ? time(s.provisionedAt) : null], ['Ready', s.readyAt ? time(s.readyAt) : null],
        ['Finished', s.finishedAt ? time(s.finishedAt) : null],
        ['Created', time(n.metadata.creationTimestamp)],
        // The worker's mode (Myelin's agent-only worker), not hive Agents: the ones
        // placed on this node are listed under Agents.
        ['Worker mode', rt.agentOnly ? 'agent-only: membership, readiness and telemetry, and the hive agents placed here (no other payload)' : null],
      ]));
      if (!started) {
        // The Fleet page's telemetry explorer, for this node alone.
        started = true;
        const select = $('#explorer-node');
        hive.explorer(select);
        select.dispatchEvent(new Event('change'));
      }
    }, 'fieldSelector=' + encodeURIComponent('metadata.name=' + name));
    nodeAgents(name);
    hive.eventsTable('#node-events', { kind: 'Node', name }, 50);
  }

  // The agents placed on the node (spec.placement.node), live from the agents' watch:
  // a placement is a spec field the API cannot select on, so every agent is watched
  // and those of this node kept.
  function nodeAgents(name) {
    const box = $('#node-agents');
    const table = h('table', { class: 'rows', id: 'node-agents-table' },
      h('thead', {}, h('tr', {}, ['Agent', 'Status', 'Wanted', 'Observed', 'Ready'].map((c) => h('th', {}, c)))), h('tbody', {}));
    const empty = h('p', { class: 'empty', id: 'node-agents-empty' }, 'No agent is placed on this node (spec.placement.node).');
    fill(box, h('div', { class: 'scroll' }, table), empty);
    hive.sortable(table);
    const row = (a) => {
      const ready = hive.condition(a, 'Ready');
      return h('tr', { 'data-agent': a.metadata.name },
        h('td', {}, agentLink(a.metadata.name)),
        h('td', {}, pill(hive.agentState(a))),
        h('td', {}, a.spec.wanted || 'Up'),
        h('td', {}, (a.status && a.status.power) || 'Unknown'),
        h('td', {}, ready ? pill(ready.status, ready.status === 'True' ? 'good' : 'off') : '—'));
    };
    const rows = keyed(table.tBodies[0], row);
    const onNode = (a) => a.spec && a.spec.placement && a.spec.placement.node === name;
    collection('agents', (items, changed, reset) => {
      const mine = new Map([...items].filter(([, a]) => onNode(a)));
      rows.update(mine, changed, reset);
      table.hidden = mine.size === 0;
      empty.hidden = mine.size > 0;
    });
  }

  // ---- a Job --------------------------------------------------------------------
  function job() {
    const name = $('#job').dataset.job;
    const pane = hive.jobLogPane();
    const pick = (job, node) => pane.pick(job, node);
    let graph = null;
    collection('jobs', (items) => {
      const j = items.get(name);
      if (!j) {
        if (graph) graph.hiveStop();
        graph = null;
        return missing('#job-card', 'Job', name, ['/jobs', '← All Jobs']);
      }
      fill('#job-card', hive.jobCard(j, pick, false));
      if (graph) graph.hiveStop();
      graph = hive.jobDag(j, pick);
      fill('#job-dag', h('div', { class: 'dag-scroll' }, graph));
      pane.update(items);
    }, 'fieldSelector=' + encodeURIComponent('metadata.name=' + name));
    hive.eventsTable('#job-events', { kind: 'Job', name }, 50);
  }

  // After every script: these pages use what fleet.js and pages.js add to `hive`.
  const pages = { node, job };
  const page = pages[document.body.dataset.page];
  if (page) document.addEventListener('DOMContentLoaded', page);
})();
