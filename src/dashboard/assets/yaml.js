// hive dashboard: JSON → YAML for reading an object's spec. A pure function (no DOM):
// the page puts its result into a text node, so escaping for HTML is the browser's;
// escaping for YAML is here — a string that YAML would read as anything but itself
// (a number, a bool, null, a key, a comment, an indicator) is double-quoted as JSON,
// which is valid YAML.
'use strict';

(() => {
  // Plain scalars YAML 1.1 or 1.2 would read as another type.
  const SPECIAL = /^(?:~|null|Null|NULL|true|True|TRUE|false|False|FALSE|y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)|<<|=)$/;
  // Anything that starts like a number: YAML reads many as numbers, dates or times.
  const NUMBERISH = /^[-+.]?[0-9]/;

  function plainOk(s) {
    if (s === '' || s !== s.trim()) return false;
    if (SPECIAL.test(s) || NUMBERISH.test(s)) return false;
    if (/^[-?:,[\]{}#&*!|>'"%@`]/.test(s)) return false; // an indicator first
    if (/[\u0000-\u001f\u007f\u0085\u2028\u2029\ufeff]/.test(s)) return false; // control, line breaks
    if (s.includes(': ') || s.includes(' #') || s.endsWith(':')) return false;
    return true;
  }
  function scalar(v) {
    if (v === null || v === undefined) return 'null';
    if (typeof v === 'boolean') return v ? 'true' : 'false';
    if (typeof v === 'number') return Number.isFinite(v) ? String(v) : 'null';
    const s = String(v);
    if (plainOk(s)) return s;
    // JSON's escapes are YAML's; these characters JSON leaves raw, YAML may not.
    return JSON.stringify(s).replace(/[\u007f\u0085\u2028\u2029\ufeff]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
  }
  const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
  const empty = (v) => (Array.isArray(v) ? v.length === 0 : isObject(v) && Object.keys(v).length === 0);

  // The lines of `v` at indentation `pad`, as a block.
  function block(v, pad, out) {
    if (Array.isArray(v)) {
      for (const item of v) {
        if ((Array.isArray(item) || isObject(item)) && !empty(item)) {
          const inner = [];
          block(item, pad + '  ', inner);
          // The first line of the item goes after the dash.
          out.push(pad + '- ' + inner[0].slice(pad.length + 2), ...inner.slice(1));
        } else {
          out.push(pad + '- ' + inline(item));
        }
      }
      return;
    }
    for (const [k, val] of Object.entries(v)) {
      const key = scalar(k);
      if ((Array.isArray(val) || isObject(val)) && !empty(val)) {
        out.push(pad + key + ':');
        block(val, Array.isArray(val) ? pad : pad + '  ', out);
      } else {
        out.push(pad + key + ': ' + inline(val));
      }
    }
  }
  function inline(v) {
    if (Array.isArray(v)) return '[]';
    if (isObject(v)) return '{}';
    return scalar(v);
  }

  // YAML text for any JSON value, ending with a newline.
  function toYaml(value) {
    if (!Array.isArray(value) && !isObject(value)) return scalar(value) + '\n';
    if (empty(value)) return inline(value) + '\n';
    const out = [];
    block(value, '', out);
    return out.join('\n') + '\n';
  }

  hive.toYaml = toYaml;
})();
