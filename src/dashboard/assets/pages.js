// hive dashboard: Overview, Agents, one Agent, Jobs and Approvals. Each page follows
// the API's watch streams through hive.collection and re-renders only changed rows.
'use strict';

(() => {
  const { h, $, fill, pill, time, api, collection, keyed, tail, condition, conditionTone, result, agentLink, jobLink, nodeLink, API } = hive;

  // Where an agent stands in one word: the server works it out (status.phase), so the
  // dashboard, the CLI, MCP and kubectl say the same.
  const agentState = (a) => (a.status && a.status.phase) || 'Pending';
  const FAILED = ['CrashLoopBackOff', 'BuildFailed', 'StartFailed', 'StopFailed', 'Lost'];
  // How the agent's process last ended: `exit code 3`, `signal 9`.
  const exitHow = (e) => (e.exitCode != null ? 'exit code ' + e.exitCode : e.signal != null ? 'signal ' + e.signal : 'unknown exit status');
  // Why a failing agent fails, in one short line: its last exit, else the condition that says.
  function failingWhy(a) {
    const s = a.status || {};
    const phase = agentState(a);
    if (phase === 'CrashLoopBackOff' && s.lastExit) {
      const last = (s.lastExit.stderr || []).slice(-1)[0];
      return exitHow(s.lastExit) + (last ? ': ' + last : '');
    }
    const c = phase === 'BuildFailed' ? condition(a, 'Building') : phase === 'Lost' ? condition(a, 'NodeLost') : condition(a, 'Converged');
    return c && c.message ? c.message : '';
  }
  // A Failed Job may still run its AfterAny Reconcile: it is over once it settled (finishedAt).
  const isTerminal = (j) => {
    const phase = j.status && j.status.phase;
    return !['Queued', 'Running', undefined].includes(phase) && (phase !== 'Failed' || !!j.status.finishedAt);
  };
  const created = (o) => Date.parse(o.metadata.creationTimestamp || 0) || 0;
  const countBy = (values) => values.reduce((m, v) => m.set(v, (m.get(v) || 0) + 1), new Map());
  function counts(map) {
    if (!map.size) return h('p', { class: 'empty' }, 'None.');
    return h('ul', { class: 'counts' }, [...map.entries()].sort().map(([k, n]) => h('li', {}, pill(k), h('b', {}, n))));
  }
  // The fleet Node an agent is placed on; none: the daemon's own host.
  const placedOn = (a) => (a.spec && a.spec.placement && a.spec.placement.node) || null;
  function conditionsCell(a) {
    const cs = (a.status && a.status.conditions) || [];
    return cs.map((c) => {
      const tone = conditionTone(c);
      // The glyph says good or bad, not True or False: a True Crashed is no ✓.
      return h('span', { class: 'cond ' + (tone === 'good' ? 'on' : tone), 'data-condition': c.type, title: c.status + ' · ' + (c.reason || '') + (c.message ? ': ' + c.message : '') },
        (tone === 'good' ? '✓ ' : '✗ ') + c.type);
    });
  }

  // ---- Job cards (Jobs page and the agent page) -----------------------------------
  const NODE_GLYPH = { Queued: '○', Running: '▶', Done: '✓', Failed: '✖', Cancelled: '⊘' };
  // A node's label: its id without the `<agent>/` prefix its lane already says.
  const nodeLabel = (n) => (n.agent && n.id.startsWith(n.agent + '/') ? n.id.slice(n.agent.length + 1) : n.id);
  // A Job's nodes per agent, in node order; the agent-less ones (a MetaLock) first.
  function lanes(job) {
    const status = new Map(((job.status && job.status.nodes) || []).map((n) => [n.id, n]));
    const specNodes = (job.spec.nodes && job.spec.nodes.length ? job.spec.nodes : [...status.values()]);
    const groups = new Map();
    for (const n of specNodes) {
      const key = n.agent || '';
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(n);
    }
    return [...groups.entries()].sort(([a], [b]) => (a === '' ? -1 : b === '' ? 1 : 0));
  }
  // One chain per agent, so one agent's last node never reads as the next one's
  // dependency; /jobs/NAME draws the whole graph.
  function nodeChain(job, onPick) {
    const status = new Map(((job.status && job.status.nodes) || []).map((n) => [n.id, n]));
    return h('div', { class: 'chains' }, lanes(job).map(([agent, nodes]) => h('ol', { class: 'chain', 'data-lane': agent },
      agent ? h('li', { class: 'lane-agent' }, agent) : null,
      nodes.map((n, i) => {
        const st = status.get(n.id) || { state: 'Queued' };
        const state = st.state || 'Queued';
        const chip = h('li', { class: 'node n-' + state.toLowerCase(), title: [n.id, n.kind, state, st.error].filter(Boolean).join(' · '), 'data-node': n.id },
          i > 0 ? h('span', { class: 'arrow', 'aria-hidden': 'true' }, '→') : null,
          h('span', { class: 'glyph' }, NODE_GLYPH[state] || '?'), ' ', h('span', { class: 'nid' }, nodeLabel(n)),
          h('span', { class: 'nstate' }, ' ' + state),
          state === 'Running' && st.step ? h('span', { class: 'step' }, ' · ' + st.step) : null,
          // Tries above the first: the node retried (spec.nodes[].retry).
          (st.attempt || 0) > 1 ? h('span', { class: 'attempt', title: 'attempt (status.nodes[].attempt)' }, ' · attempt ' + st.attempt) : null,
          st.retryAt ? h('span', { class: 'attempt muted' }, ' · retries at ', time(st.retryAt)) : null,
          st.error ? h('span', { class: 'nerr' }, ' — ' + st.error) : null);
        if (onPick) chip.addEventListener('click', () => onPick(job.metadata.name, n.id));
        return chip;
      }))));
  }
  // A Job's card; `withChain` false leaves out the node chains (the Job's page draws
  // its graph beside it).
  function jobCard(job, onPick, withChain = true) {
    const s = job.status || {};
    const phase = s.phase || 'Queued';
    const nodes = s.nodes || [];
    const cancellable = hive.canWrite && phase === 'Queued' && nodes.every((n) => (n.state || 'Queued') === 'Queued');
    const card = h('article', { class: 'card job p-' + phase.toLowerCase(), id: 'job-' + job.metadata.name, 'data-job': job.metadata.name, 'data-phase': phase },
      h('header', {},
        pill(phase, phase === 'Running' ? 'run' : undefined), ' ',
        h('a', { href: '/jobs/' + encodeURIComponent(job.metadata.name), class: 'jlink', title: 'The Job\'s page: its graph and log' }, h('b', { class: 'jname' }, job.metadata.name)), ' ',
        h('span', { class: 'tag' }, job.spec.template || 'Custom'),
        (job.spec.agents || []).length ? h('span', { class: 'agents' }, ' ', job.spec.agents.map((a, i) => [i ? ', ' : '', agentLink(a)])) : null,
        h('span', { class: 'muted small' }, ' via ' + (job.spec.source || 'Api')),
        cancellable ? h('button', { type: 'button', class: 'small danger', 'data-cancel': job.metadata.name, onclick: (e) => cancelJob(e, job.metadata.name) }, 'Cancel') : null),
      job.spec.reason ? h('p', { class: 'reason' }, '“' + job.spec.reason + '”') : null,
      withChain ? nodeChain(job, onPick) : null,
      h('p', { class: 'meta small' },
        'submitted ', time(s.submittedAt || job.metadata.creationTimestamp),
        s.startedAt ? [' · started ', time(s.startedAt)] : null,
        s.finishedAt ? [' · finished ', time(s.finishedAt)] : null,
        job.spec.parent ? [' · parent ', jobLink(job.spec.parent)] : null,
        (s.children || []).length ? [' · children ', s.children.map((c, i) => [i ? ', ' : '', jobLink(c)])] : null,
        job.spec.approval ? [' · approval ', h('a', { href: '/approvals' }, job.spec.approval)] : null,
        job.spec.priority ? [' · priority ', String(job.spec.priority)] : null,
        job.spec.activeDeadlineSeconds ? [' · deadline ', job.spec.activeDeadlineSeconds + 's'] : null),
      s.message ? h('p', { class: phase === 'Failed' ? 'error small' : 'muted small' }, s.message) : null);
    return card;
  }
  async function cancelJob(e, name) {
    e.target.disabled = true;
    try {
      await api('POST', `${API}/jobs/${encodeURIComponent(name)}/cancel`, {});
    } catch (err) {
      e.target.disabled = false;
      e.target.after(h('span', { class: 'error small' }, ' Cancel refused: ' + err.message));
    }
  }

  // ---- Overview -------------------------------------------------------------------
  function overview() {
    const all = {};
    const render = () => {
      if (all.agents) {
        const agents = [...all.agents.values()];
        fill('#ov-agents', h('p', { class: 'big' }, agents.length + (agents.length === 1 ? ' agent' : ' agents')), counts(countBy(agents.map(agentState))));
        const failing = agents.filter((a) => FAILED.includes(agentState(a)));
        fill('#ov-failing', failing.length ? h('ul', { class: 'plain' }, failing.map((a) => {
          const why = failingWhy(a);
          return h('li', {}, pill(agentState(a)), ' ', agentLink(a.metadata.name), why ? h('span', { class: 'muted small' }, ' ' + why) : null);
        })) : h('p', { class: 'empty' }, '✓ Nothing failing.'));
      }
      if (all.jobs) {
        const live = [...all.jobs.values()].filter((j) => !isTerminal(j)).sort((a, b) => created(b) - created(a));
        fill('#ov-jobs', live.length ? h('ul', { class: 'plain' }, live.slice(0, 12).map((j) => {
          const running = ((j.status && j.status.nodes) || []).find((n) => n.state === 'Running');
          return h('li', {}, pill(j.status && j.status.phase || 'Queued'), ' ', jobLink(j.metadata.name), ' ', h('span', { class: 'tag' }, j.spec.template || ''),
            running ? h('span', { class: 'muted small' }, ' ' + running.id + (running.step ? ' · ' + running.step : '')) : null);
        }), live.length > 12 ? h('li', {}, h('a', { href: '/jobs' }, `and ${live.length - 12} more…`)) : null) : h('p', { class: 'empty' }, 'The queue is empty.'));
      }
      if (all.approvals) {
        const pending = [...all.approvals.values()].filter((a) => !a.status || !a.status.phase || a.status.phase === 'Pending');
        fill('#ov-approvals', pending.length ? h('ul', { class: 'plain' }, pending.map((a) => h('li', {}, pill('Pending'), ' ', h('a', { href: '/approvals' }, a.metadata.name), ' ',
          h('span', { class: 'muted small' }, (a.spec.kind || '') + (a.spec.target ? ' → ' + a.spec.target : ''))))) : h('p', { class: 'empty' }, 'Nothing waiting for a decision.'));
      }
      if (all.nodes) {
        const nodes = [...all.nodes.values()];
        const phases = countBy(nodes.map((n) => (n.status && n.status.phase) || 'Pending'));
        fill('#ov-fleet', h('p', { class: 'big' }, `${phases.get('Running') || 0} / ${nodes.length} nodes running`), counts(phases), h('a', { href: '/fleet' }, 'Open the fleet →'));
      }
      if (all.providers) {
        const ps = [...all.providers.values()];
        fill('#ov-providers', ps.length ? h('ul', { class: 'plain' }, ps.map((p) => h('li', {}, pill((p.status && p.status.state) || 'Unconfigured'), ' ', h('b', {}, p.metadata.name), ' ',
          h('span', { class: 'muted small' }, p.spec.type + (p.status && p.status.message ? ' — ' + p.status.message : ''))))) : h('p', { class: 'empty' }, 'No Provider objects.'));
      }
    };
    // Five streams at most, with the Events (events.js): a browser gives one host six
    // connections, and a page holding all six leaves none for the next navigation, which
    // then waits for a watch to end. Providers change rarely (ConfigureProvider), so
    // the overview re-lists them every 30 s instead of watching them.
    for (const plural of ['agents', 'jobs', 'approvals', 'nodes']) {
      all[plural] = null;
      const items = collection(plural, () => render());
      all[plural] = items;
    }
    const providers = async () => {
      try {
        const l = await api('GET', `${API}/providers`);
        all.providers = new Map((l.items || []).map((p) => [p.metadata.name, p]));
        render();
      } catch (_) {
        // The next round tries again; the watches' indicator shows a server that is down.
      }
    };
    providers();
    setInterval(() => document.hidden || providers(), 30000);
  }

  // ---- Agents ---------------------------------------------------------------------
  function agents() {
    const filter = $('#filter');
    // A name matches by substring, a status only exactly: "running" is not "Running…".
    const matches = (a, q) => !q || a.metadata.name.includes(q) || agentState(a).toLowerCase() === q;
    const row = (a) => {
      const s = a.status || {};
      const tr = h('tr', { 'data-agent': a.metadata.name },
        h('td', {}, agentLink(a.metadata.name)),
        h('td', {}, pill(agentState(a))),
        h('td', {}, a.spec.wanted || 'Up'),
        h('td', {}, s.power || 'Unknown'),
        h('td', { class: 'mono' }, s.appliedRev ? s.appliedRev.slice(0, 12) : '—'),
        h('td', {}, conditionsCell(a)),
        h('td', {}, s.activeJob ? jobLink(s.activeJob) : '—'),
        h('td', { 'data-node': placedOn(a) || '' }, placedOn(a) ? nodeLink(placedOn(a)) : '—'),
        h('td', {}, time(a.metadata.creationTimestamp)));
      tr.hidden = !matches(a, filter.value.trim().toLowerCase());
      return tr;
    };
    const list = keyed($('#agents-rows'), row);
    const items = collection('agents', (items, changed, reset) => {
      list.update(items, changed, reset);
      $('#agents-empty').hidden = items.size > 0;
      $('#agents-count').textContent = items.size + (items.size === 1 ? ' agent' : ' agents');
    });
    filter.addEventListener('input', () => {
      const q = filter.value.trim().toLowerCase();
      for (const [name, tr] of list.rows) tr.hidden = !matches(items.get(name), q);
    });
  }

  // ---- one Agent ------------------------------------------------------------------
  function agent() {
    const name = $('#agent').dataset.agent;
    const sel = 'fieldSelector=' + encodeURIComponent('metadata.name=' + name);
    const more = hive.agentPage; // detail.js: Jobs, Events, YAML, Kill and Delete
    more.start(name);
    collection('agents', (items) => {
      const a = items.get(name);
      if (!a) {
        more.missing(name);
        return;
      }
      more.show(a);
      const s = a.status || {};
      fill('#agent-summary', pill(agentState(a)), ' ',
        h('span', {}, 'wanted ', h('b', {}, a.spec.wanted || 'Up'), ' · observed ', h('b', {}, s.power || 'Unknown')),
        h('span', { id: 'agent-node', 'data-node': placedOn(a) || '' }, ' · ',
          placedOn(a) ? ['on node ', nodeLink(placedOn(a))] : h('span', { class: 'muted' }, "on the daemon's host")),
        h('span', { class: 'muted' }, ' · runtime ' + ((a.spec.runtime && a.spec.runtime.type) || '?') + ' · config ' + a.spec.config.repo + (a.spec.config.rev ? '@' + a.spec.config.rev : '')),
        s.activeJob ? [' · job ', jobLink(s.activeJob)] : null);
      const exit = s.lastExit;
      const lastExit = $('#agent-last-exit');
      lastExit.hidden = !exit;
      if (exit) {
        fill(lastExit, h('div', {}, h('b', {}, 'Last exit: '), exitHow(exit), ' · ', time(exit.finishedAt),
          s.restarts ? h('span', { class: 'muted' }, ` · ${s.restarts} crash restart${s.restarts === 1 ? '' : 's'}`) : null),
          (exit.stderr || []).length ? h('pre', { class: 'stderr', 'aria-label': 'last lines of stderr' }, exit.stderr.join('\n')) : h('p', { class: 'muted small' }, 'It wrote nothing to stderr.'));
      }
      const cs = s.conditions || [];
      fill('#agent-conditions', cs.length ? h('table', { class: 'rows' }, h('tbody', {}, cs.map((c) => h('tr', { 'data-condition': c.type },
        h('td', {}, h('b', {}, c.type)), h('td', {}, pill(c.status === 'True' ? 'True' : 'False', conditionTone(c))),
        h('td', {}, c.reason || ''), h('td', { class: 'small' }, c.message || ''), h('td', {}, time(c.lastTransitionTime)))))) : h('p', { class: 'empty' }, 'No conditions reported yet.'));
      fill('#agent-generations', h('dl', { class: 'facts' },
        h('dt', {}, 'Spec generation'), h('dd', {}, String(a.metadata.generation || 1)),
        h('dt', {}, 'Observed generation'), h('dd', {}, s.observedGeneration != null ? String(s.observedGeneration) : '—'),
        h('dt', {}, 'Applied rev'), h('dd', { class: 'mono' }, s.appliedRev || '—'),
        h('dt', {}, 'Resource version'), h('dd', { class: 'mono' }, a.metadata.resourceVersion),
        h('dt', {}, 'Created'), h('dd', {}, time(a.metadata.creationTimestamp))));
    }, sel);
    tail(`${API}/agents/${encodeURIComponent(name)}/log?follow=true&tail=200`, $('#agent-log'), $('#agent-log-state'));
    const power = $('#power');
    let submitted = null;
    const jobs = collection('jobs', (items) => {
      more.jobs(items, name);
      if (submitted && jobs.get(submitted)) fill('#power-job', jobCard(jobs.get(submitted)));
    });
    if (!power) return;
    power.addEventListener('click', async (e) => {
      const template = e.target.dataset && e.target.dataset.template;
      if (!template) return;
      const reason = $('#power-reason').value.trim();
      const spec = { template, agents: [name], source: 'Dashboard' };
      if (reason) spec.reason = reason;
      for (const b of power.querySelectorAll('button')) b.disabled = true;
      try {
        const job = await api('POST', `${API}/jobs`, { apiVersion: 'hive.dev/v1', kind: 'Job', metadata: {}, spec });
        submitted = job.metadata.name;
        fill('#power-job', jobCard(jobs.get(submitted) || job));
      } catch (err) {
        fill('#power-job', h('p', { class: 'result error' }, `${template} refused: ${err.message}`));
      } finally {
        for (const b of power.querySelectorAll('button')) b.disabled = false;
      }
    });
  }

  // ---- Jobs -----------------------------------------------------------------------
  // The log pane (#job-log, its title and hint) of the Jobs page and of one Job's page.
  // A node with a build log (logRef) streams it; a node without one (signal, drain,
  // stop, start…) shows its agent's own output instead, which is what changed. It
  // follows the running node of the newest running Job (else the last node that ran)
  // until a node is clicked (`pick`), which pins it.
  function jobLogPane() {
    let followed = null;
    let pinned = false;
    let stop = null;
    let all = new Map();
    const follow = (job, node, live) => {
      const key = job + '\u0000' + node;
      if (followed === key) return;
      followed = key;
      if (stop) stop();
      const j = all.get(job);
      const st = j && ((j.status && j.status.nodes) || []).find((n) => n.id === node);
      const spec = j && (j.spec.nodes || []).find((n) => n.id === node);
      const agent = (spec && spec.agent) || (node.includes('/') ? node.split('/')[0] : null);
      const title = $('#job-log-title');
      const agentOutput = () => {
        title.textContent = `${job} · ${node} wrote no log; ${agent}'s output` + (pinned ? ' (pinned)' : '');
        title.dataset.source = 'agent';
        stop = tail(`${API}/agents/${encodeURIComponent(agent)}/log?follow=true&tail=100`, $('#job-log'), $('#job-log-hint'));
      };
      if ((st && st.logRef) || !agent) {
        title.textContent = `${job} · ${node}` + (pinned ? ' (pinned)' : '');
        title.dataset.source = 'node';
        const url = `${API}/jobs/${encodeURIComponent(job)}/log?node=${encodeURIComponent(node)}&follow=${live}`;
        stop = tail(url, $('#job-log'), $('#job-log-hint'), agent ? () => { if (followed === key) agentOutput(); } : null);
      } else {
        agentOutput();
      }
    };
    return {
      pick(job, node) {
        pinned = true;
        followed = null;
        follow(job, node, true);
      },
      // The Jobs as the watch has them now.
      update(items) {
        all = items;
        if (pinned) return;
        // Follow the running node of the newest running Job; else the last node that ran.
        const newest = [...items.values()].sort((a, b) => created(b) - created(a));
        for (const j of newest) {
          const n = ((j.status && j.status.nodes) || []).find((x) => x.state === 'Running');
          if (n) return follow(j.metadata.name, n.id, true);
        }
        if (followed) return;
        for (const j of newest) {
          // The node that ran last (ties: the later in the chain), preferring build logs.
          const ran = ((j.status && j.status.nodes) || []).map((x, i) => [x, i]).filter(([x]) => x.startedAt);
          const rank = ([x, i]) => [x.logRef ? 1 : 0, Date.parse(x.finishedAt || x.startedAt) || 0, i];
          ran.sort((a, b) => { const [p, q] = [rank(a), rank(b)]; return q[0] - p[0] || q[1] - p[1] || q[2] - p[2]; });
          if (ran.length) return follow(j.metadata.name, ran[0][0].id, !ran[0][0].logRef);
        }
      },
    };
  }

  function jobs() {
    const pane = jobLogPane();
    const pick = (job, node) => pane.pick(job, node);
    const stamp = new Map();
    const byNewest = (a, b) => (stamp.get(b) || 0) - (stamp.get(a) || 0) || (a < b ? -1 : 1);
    const active = keyed($('#jobs-active'), (j) => jobCard(j, pick), byNewest);
    const history = keyed($('#jobs-history'), (j) => jobCard(j, pick), byNewest);
    collection('jobs', (items, changed, reset) => {
      for (const [k, j] of items) stamp.set(k, created(j));
      const live = new Map();
      const done = new Map();
      for (const [k, j] of items) (isTerminal(j) ? done : live).set(k, j);
      active.update(live, changed, reset);
      history.update(done, changed, reset);
      for (const k of [...stamp.keys()]) if (!items.has(k)) stamp.delete(k); // DELETED ones
      $('#jobs-active-empty').hidden = live.size > 0;
      $('#jobs-history-empty').hidden = done.size > 0;
      pane.update(items);
    });
    if (location.hash) setTimeout(() => { const el = document.getElementById(decodeURIComponent(location.hash.slice(1))); if (el) el.scrollIntoView(); }, 500);
  }

  // ---- Approvals ------------------------------------------------------------------
  function approvals() {
    const isPending = (a) => !a.status || !a.status.phase || a.status.phase === 'Pending';
    const decide = async (name, state, reasonEl, out) => {
      const reason = reasonEl.value.trim();
      if (state === 'Denied' && !reason) return result(out, false, 'A denial needs a reason.');
      const decision = { state };
      if (reason) decision.reason = reason;
      try {
        await api('PATCH', `${API}/approvals/${encodeURIComponent(name)}`, { spec: { decision } }, 'application/merge-patch+json');
        result(out, true, state + ' — the controller takes it from here.');
      } catch (err) {
        result(out, false, err.message);
      }
    };
    // What an ApplyCommit / MergeConfigPr would change, from the server's mirror.
    const changes = (a) => {
      const box = h('div', { class: 'diff muted small' }, 'Comparing with the applied commit…');
      if (!['ApplyCommit', 'MergeConfigPr'].includes(a.spec.kind)) return null;
      api('GET', `/hive/v1/approvals/${encodeURIComponent(a.metadata.name)}/diff`).then((d) => {
        if (!d.base) return fill(box, d.message || 'Nothing applied yet.');
        const more = d.commitCount > d.commits.length ? ` (newest ${d.commits.length} shown)` : '';
        fill(box,
          h('b', {}, `${d.commitCount} commit${d.commitCount === 1 ? '' : 's'} · ${d.filesChanged} file${d.filesChanged === 1 ? '' : 's'} · +${d.insertions} −${d.deletions}`),
          ` from ${d.base.slice(0, 12)} to ${d.head.slice(0, 12)}${more}`,
          h('details', {}, h('summary', {}, 'Commits and files'),
            h('pre', { class: 'mono' }, [...d.commits, '', ...d.stat].join('\n'))));
      }).catch((err) => fill(box, h('span', { class: 'error' }, 'Cannot show the change: ' + err.message)));
      return box;
    };
    // What was typed into each card's reason, so a re-rendered card keeps it.
    const typed = new Map();
    const card = (a) => {
      const p = a.spec.payload || {};
      const name = a.metadata.name;
      const out = h('p', { class: 'result', role: 'status' });
      const reason = h('input', { type: 'text', placeholder: 'Reason (required to deny)', class: 'reason-input',
        oninput: (e) => typed.set(name, e.target.value) });
      reason.value = typed.get(name) || '';
      return h('article', { class: 'card approval', 'data-approval': a.metadata.name },
        h('header', {}, pill((a.status && a.status.phase) || 'Pending'), ' ', h('b', {}, a.metadata.name), ' ', h('span', { class: 'tag' }, a.spec.kind),
          a.spec.target ? [' → ', agentLink(a.spec.target)] : null, h('span', { class: 'muted small' }, ' requested by ' + (a.spec.requestedBy || 'an operator'), ' ', time(a.metadata.creationTimestamp))),
        a.spec.summary ? h('p', {}, a.spec.summary) : null,
        h('dl', { class: 'facts' },
          p.commit ? [h('dt', {}, 'Commit'), h('dd', { class: 'mono' }, p.commit)] : null,
          p.pullRequest ? [h('dt', {}, 'Pull request'), h('dd', {}, p.pullRequest)] : null,
          (p.inputs || []).length ? [h('dt', {}, 'Inputs'), h('dd', { class: 'mono' }, p.inputs.join(', '))] : null,
          p.agent ? [h('dt', {}, 'New agent'), h('dd', { class: 'mono' }, (p.agent.config && p.agent.config.repo) || JSON.stringify(p.agent))] : null),
        changes(a),
        hive.canWrite ? h('div', { class: 'actions' }, reason,
          h('button', { type: 'button', class: 'primary', 'data-approve': a.metadata.name, onclick: () => decide(a.metadata.name, 'Approved', reason, out) }, 'Approve'),
          h('button', { type: 'button', class: 'danger', 'data-deny': a.metadata.name, onclick: () => decide(a.metadata.name, 'Denied', reason, out) }, 'Deny')) : null,
        out);
    };
    const row = (a) => {
      const s = a.status || {};
      return h('tr', { 'data-approval': a.metadata.name },
        h('td', {}, h('b', {}, a.metadata.name)), h('td', {}, a.spec.kind), h('td', {}, a.spec.target ? agentLink(a.spec.target) : '—'),
        h('td', {}, a.spec.requestedBy || '—'), h('td', {}, pill(s.phase || 'Pending'), s.job ? [' ', jobLink(s.job)] : null, s.message ? h('div', { class: 'muted small' }, s.message) : null),
        h('td', {}, s.decidedBy || (a.metadata.annotations && a.metadata.annotations['hive.dev/decided-by']) || '—'),
        h('td', {}, (a.spec.decision && a.spec.decision.reason) || '—'), h('td', {}, time(s.decidedAt || (a.metadata.annotations && a.metadata.annotations['hive.dev/decided-at']))));
    };
    const pending = keyed($('#approvals-pending'), card);
    const history = keyed($('#approvals-history'), row);
    collection('approvals', (items, changed, reset) => {
      const p = new Map();
      const d = new Map();
      for (const [k, a] of items) (isPending(a) ? p : d).set(k, a);
      for (const k of [...typed.keys()]) if (!p.has(k)) typed.delete(k);
      // A pending card keeps its typed reason: re-render only when it leaves.
      pending.update(p, reset ? changed : new Set([...changed].filter((k) => !p.has(k) || !pending.rows.has(k))), reset);
      history.update(d, changed, reset);
      $('#approvals-pending-empty').hidden = p.size > 0;
      $('#approvals-history-empty').hidden = d.size > 0;
    });
  }

  const pages = { overview, agents, agent, jobs, approvals };
  hive.jobCard = jobCard;
  hive.jobLogPane = jobLogPane;
  hive.jobLanes = lanes;
  hive.nodeLabel = nodeLabel;
  hive.NODE_GLYPH = NODE_GLYPH;
  hive.agentState = agentState;
  const page = pages[document.body.dataset.page];
  if (page) page();
})();
