// hive dashboard: a Job drawn as its DAG on /jobs/NAME. One lane per agent subgraph
// (the agent-less nodes, a MetaLock, first), columns by depth (the longest path of
// edges from a node without deps), and every edge of spec.nodes[].deps as it is, drawn
// in an SVG laid over the grid once the browser placed the nodes; an AfterAny edge is
// dashed and labelled. Each node shows its state, step, attempt and error; a click
// pins its log in the page's log pane.
'use strict';

(() => {
  const { h, fill, time } = hive;
  const SVG = 'http://www.w3.org/2000/svg';
  const svg = (tag, attrs) => {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    return el;
  };

  // Each node's column: the longest chain of deps above it (0 for a root). The API
  // refuses cycles; a dep that names no node is skipped.
  function depths(nodes) {
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const depth = new Map();
    const visit = (n, seen) => {
      if (depth.has(n.id)) return depth.get(n.id);
      if (seen.has(n.id)) return 0;
      seen.add(n.id);
      let d = 0;
      for (const dep of n.deps || []) {
        const up = byId.get(dep.node);
        if (up) d = Math.max(d, visit(up, seen) + 1);
      }
      depth.set(n.id, d);
      return d;
    };
    for (const n of nodes) visit(n, new Set());
    return depth;
  }

  // The graph of `job` as an element; `onPick(job, node)` on a node's click.
  function jobDag(job, onPick) {
    const status = new Map(((job.status && job.status.nodes) || []).map((n) => [n.id, n]));
    const nodes = job.spec.nodes || [];
    const depth = depths(nodes);
    const columns = Math.max(0, ...depth.values()) + 1;
    const grid = h('div', { class: 'dag-grid' });
    grid.style.gridTemplateColumns = `minmax(5.5em, max-content) repeat(${columns}, minmax(9em, max-content))`;
    const boxes = new Map();
    hive.jobLanes(job).forEach(([agent, laneNodes], row) => {
      const label = h('div', { class: 'lane-name', 'data-lane': agent }, agent || 'job');
      label.style.gridRow = String(row + 1);
      label.style.gridColumn = '1';
      grid.append(label);
      // Two nodes of one lane at one depth (a fan-in, rare) share the cell.
      const cells = new Map();
      for (const n of laneNodes) {
        const d = depth.get(n.id) || 0;
        if (!cells.has(d)) {
          const cell = h('div', { class: 'dag-cell', 'data-lane': agent });
          cell.style.gridRow = String(row + 1);
          cell.style.gridColumn = String(d + 2);
          cells.set(d, cell);
          grid.append(cell);
        }
        const st = status.get(n.id) || {};
        const state = st.state || 'Queued';
        const box = h('button', { type: 'button', class: 'dag-node n-' + state.toLowerCase(), 'data-node': n.id, 'data-lane': agent, 'data-state': state,
          title: [n.id, n.kind, state, st.error].filter(Boolean).join(' · ') },
          h('span', { class: 'dag-head' }, h('span', { class: 'glyph' }, hive.NODE_GLYPH[state] || '?'), ' ', h('span', { class: 'nid' }, hive.nodeLabel(n))),
          h('span', { class: 'dag-kind muted small' }, n.kind + ' · ' + state),
          state === 'Running' && st.step ? h('span', { class: 'step small' }, st.step) : null,
          (st.attempt || 0) > 1 ? h('span', { class: 'attempt small' }, 'attempt ' + st.attempt) : null,
          st.retryAt ? h('span', { class: 'attempt muted small' }, 'retries ', time(st.retryAt)) : null,
          st.startedAt ? h('span', { class: 'muted small' }, 'started ', time(st.startedAt)) : null,
          st.error ? h('span', { class: 'nerr small' }, st.error) : null);
        if (onPick) box.addEventListener('click', () => onPick(job.metadata.name, n.id));
        cells.get(d).append(box);
        boxes.set(n.id, box);
      }
    });
    const edges = svg('svg', { class: 'dag-edges', 'aria-hidden': 'true' });
    const defs = svg('defs', {});
    const marker = svg('marker', { id: 'dag-arrow', viewBox: '0 0 8 8', refX: 8, refY: 4, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' });
    marker.append(svg('path', { d: 'M0,0 L8,4 L0,8 z', class: 'dag-arrowhead' }));
    defs.append(marker);
    const root = h('div', { class: 'dag', 'data-job': job.metadata.name, 'data-lanes': String(hive.jobLanes(job).length) }, grid);
    root.append(edges);
    const wires = [];
    for (const n of nodes) {
      for (const dep of n.deps || []) {
        if (!boxes.has(dep.node)) continue;
        wires.push({ from: dep.node, to: n.id, any: dep.edge === 'AfterAny' });
      }
    }
    // Draws the edges between where the browser put the boxes: again on every resize.
    const draw = () => {
      const base = grid.getBoundingClientRect();
      edges.setAttribute('width', String(grid.scrollWidth));
      edges.setAttribute('height', String(grid.scrollHeight));
      edges.replaceChildren(defs);
      for (const w of wires) {
        const a = boxes.get(w.from).getBoundingClientRect();
        const b = boxes.get(w.to).getBoundingClientRect();
        const x1 = a.right - base.left;
        const y1 = a.top + a.height / 2 - base.top;
        const x2 = b.left - base.left;
        const y2 = b.top + b.height / 2 - base.top;
        const bend = Math.max(16, (x2 - x1) / 2);
        const path = svg('path', {
          d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
          class: 'edge' + (w.any ? ' after-any' : ''), 'data-from': w.from, 'data-to': w.to, 'marker-end': 'url(#dag-arrow)',
        });
        const title = svg('title', {});
        title.textContent = `${w.from} → ${w.to}` + (w.any ? ' (AfterAny: runs whatever the outcome)' : ' (AfterOk)');
        path.append(title);
        edges.append(path);
        if (w.any) {
          const label = svg('text', { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 5, class: 'edge-label', 'text-anchor': 'middle' });
          label.textContent = 'any';
          edges.append(label);
        }
      }
      root.dataset.edges = String(wires.length);
    };
    const watcher = new ResizeObserver(draw);
    watcher.observe(grid);
    // The page replaces the graph on every change of the Job: the old one stops here.
    root.hiveStop = () => watcher.disconnect();
    return root;
  }

  hive.jobDag = jobDag;
  hive.jobDag.depths = depths;
})();
