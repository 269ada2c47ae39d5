// hive dashboard: time charts (plain SVG, no library) with a value axis in the channel's
// unit and a time axis, and the seeding of a node's charts from the telemetry hub's
// recent frames (`/hive/v1/fleet/nodes/NAME/telemetry?follow=false`), so a chart opened
// after the fact does not start empty.
'use strict';

(() => {
  const SVG = 'http://www.w3.org/2000/svg';
  function el(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text != null) e.textContent = text;
    return e;
  }

  // A value in `unit` for an axis label: bytes in binary multiples, percent and seconds
  // with their sign, anything else as a plain number with its unit.
  function format(value, unit) {
    if (value == null || Number.isNaN(value)) return '—';
    const u = (unit || '').toLowerCase();
    if (u === 'bytes') {
      const steps = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
      let v = value;
      let i = 0;
      while (Math.abs(v) >= 1024 && i < steps.length - 1) {
        v /= 1024;
        i += 1;
      }
      return (v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + steps[i];
    }
    const n = value === 0 ? '0' : Math.abs(value) >= 100 ? value.toFixed(0) : Math.abs(value) >= 10 ? value.toFixed(1) : value.toFixed(2);
    if (u === 'percent' || u === '%') return n + '%';
    if (u === 'seconds' || u === 's') return n + ' s';
    return unit ? n + ' ' + unit : n;
  }
  const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
  function span(ms) {
    const s = Math.round(ms / 1000);
    if (s < 120) return s + ' s';
    if (s < 7200) return Math.round(s / 60) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }

  // A line chart of `points` ({at: RFC 3339, value}) against time: a value axis from 0
  // (or the minimum, when negative) to a rounded maximum, labelled in `unit`, and a time
  // axis with the clock time at its ends and middle, and the span shown.
  function timeChart(points, { width = 600, height = 160, unit = '', label = '', max = null } = {}) {
    const pad = { left: 64, right: 12, top: 10, bottom: 30 };
    const w = width - pad.left - pad.right;
    const ht = height - pad.top - pad.bottom;
    const svg = el('svg', { viewBox: `0 0 ${width} ${height}`, width, height, class: 'timechart', role: 'img', 'aria-label': label || 'chart' });
    const pts = points.map((p) => ({ t: Date.parse(p.at), v: p.value })).filter((p) => !Number.isNaN(p.t) && p.v != null).sort((a, b) => a.t - b.t);
    const values = pts.map((p) => p.v);
    const lo = Math.min(0, ...values);
    let hi = max != null ? max : Math.max(...values, lo + 1e-9);
    if (hi <= lo) hi = lo + 1;
    const t0 = pts.length ? pts[0].t : Date.now();
    const t1 = pts.length > 1 ? pts[pts.length - 1].t : t0 + 1000;
    const x = (t) => pad.left + ((t - t0) / (t1 - t0)) * w;
    const y = (v) => pad.top + ht - ((Math.min(v, hi) - lo) / (hi - lo)) * ht;
    const axes = el('g', { class: 'axes' });
    axes.append(el('line', { x1: pad.left, y1: pad.top, x2: pad.left, y2: pad.top + ht, class: 'axis' }));
    axes.append(el('line', { x1: pad.left, y1: pad.top + ht, x2: pad.left + w, y2: pad.top + ht, class: 'axis' }));
    for (const f of [0, 0.5, 1]) {
      const v = lo + f * (hi - lo);
      const yy = y(v);
      if (f > 0) axes.append(el('line', { x1: pad.left, y1: yy, x2: pad.left + w, y2: yy, class: 'grid' }));
      axes.append(el('text', { x: pad.left - 6, y: yy + 4, 'text-anchor': 'end', class: 'tick y-tick' }, format(v, unit)));
    }
    if (pts.length) {
      for (const [f, anchor] of [[0, 'start'], [0.5, 'middle'], [1, 'end']]) {
        const t = t0 + f * (t1 - t0);
        axes.append(el('line', { x1: x(t), y1: pad.top + ht, x2: x(t), y2: pad.top + ht + 4, class: 'axis' }));
        axes.append(el('text', { x: x(t), y: pad.top + ht + 16, 'text-anchor': anchor, class: 'tick x-tick' }, clock(t)));
      }
      axes.append(el('text', { x: pad.left + w, y: height - 2, 'text-anchor': 'end', class: 'tick span' }, 'time · last ' + span(t1 - t0)));
    }
    svg.append(axes);
    if (pts.length > 1) {
      svg.append(el('polyline', { points: pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' '), class: 'series' }));
    } else if (pts.length === 1) {
      svg.append(el('circle', { cx: pad.left, cy: y(pts[0].v), r: 3, class: 'series-dot' }));
    } else {
      svg.append(el('text', { x: pad.left + w / 2, y: pad.top + ht / 2, 'text-anchor': 'middle', class: 'tick' }, 'no frames yet'));
    }
    return svg;
  }

  // The recent frames the hub holds for `node`, by channel: {channel: [{at, value}]},
  // and the channels' units. Ends with the recent frames (follow=false).
  async function recentFrames(node) {
    const resp = await fetch(`/hive/v1/fleet/nodes/${encodeURIComponent(node)}/telemetry?follow=false`, { credentials: 'same-origin' });
    const frames = new Map();
    const units = new Map();
    if (!resp.ok) return { frames, units };
    await hive.readLines(resp, (line) => {
      const m = JSON.parse(line);
      if (m.type === 'descriptors') for (const c of m.channels || []) units.set(c.channel, c.unit || '');
      if (m.type === 'frame') {
        const arr = frames.get(m.channel) || [];
        arr.push({ at: m.at, value: m.value });
        frames.set(m.channel, arr);
      }
    });
    return { frames, units };
  }

  // The node table's three series from recent frames: CPU %, memory % (used / total at
  // the same instant), GPU %; each [{at, value}] oldest first.
  async function seedNode(node) {
    const { frames } = await recentFrames(node);
    const total = new Map((frames.get('memory.total_bytes') || []).map((f) => [f.at, f.value]));
    const mem = (frames.get('memory.used_bytes') || []).filter((f) => total.get(f.at)).map((f) => ({ at: f.at, value: (100 * f.value) / total.get(f.at) }));
    return { cpu: frames.get('cpu.percent') || [], mem, gpu: frames.get('gpu.utilization_percent') || [] };
  }

  Object.assign(hive, { timeChart, formatValue: format, recentFrames, seedNode, spanText: span });
})();
