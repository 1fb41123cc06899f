// The helpers forkd's web view's modules share: elements built from text (never markup), and
// the few ways it writes numbers, times and states.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG = 'http://www.w3.org/2000/svg';
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children.flat()) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

export const short = (id) => (id || '').slice(-8);

// The trace a batch's or agent's work is in (OpenTelemetry): its id, linked to a trace UI when the
// daemon has a trace_url_template.
export const traceView = (trace) => !trace ? '' : h('p', { id: 'trace', class: 'muted' }, 'Trace ',
  trace.url ? h('a', { href: trace.url, target: '_blank', rel: 'noopener noreferrer', class: 'mono' }, trace.trace_id)
    : h('span', { class: 'mono' }, trace.trace_id));
export const usd = (x) => '$' + (x || 0).toFixed(x >= 100 ? 0 : x >= 1 ? 2 : 4);
export const pct = (x) => ((x || 0) * 100).toFixed(1) + '%';
export const num = (x) => (x || 0).toLocaleString('en-US');
export function ago(ms) {
  if (!ms) return '';
  const d = Math.max(0, (Date.now() - ms) / 1000);
  if (d < 60) return Math.floor(d) + ' s ago';
  if (d < 3600) return Math.floor(d / 60) + ' min ago';
  if (d < 86400) return Math.floor(d / 3600) + ' h ago';
  return new Date(ms).toISOString().slice(0, 16).replace('T', ' ');
}
// A child's states, in lifecycle order: the batch page's filter and counts. `timed_out` (past one
// of its limits) ends it like `failed` and `killed`, each shown in its own colour.
export const CHILD_STATES = ['pending', 'running', 'completed', 'failed', 'killed', 'timed_out'];
// A duration as people write it, as forkd's own messages do: 90s, 10m, 1h30m, 1.5s.
export function dur(ms) {
  if (ms % 1000) return ms / 1000 + 's';
  const t = ms / 1000, hh = Math.floor(t / 3600), mm = Math.floor(t / 60) % 60, ss = t % 60;
  return (hh ? hh + 'h' : '') + (mm ? mm + 'm' : '') + (ss || (!hh && !mm) ? ss + 's' : '');
}
// An agent's limits, the fields set: `timeout 10m · idle 2m · 30 turns`.
export const limitsText = (l) => !l ? '' : [
  l.timeout_ms && 'timeout ' + dur(l.timeout_ms) + (l.timeout_excludes_throttle ? ' (less throttled time)' : ''),
  l.idle_timeout_ms && 'idle ' + dur(l.idle_timeout_ms),
  l.max_turns && num(l.max_turns) + (l.max_turns === 1 ? ' turn' : ' turns'),
  l.max_output_tokens && num(l.max_output_tokens) + ' output tokens',
].filter(Boolean).join(' · ');
export const stateCell = (state, label) => h('td', { class: 'state state-' + state, 'data-state': state }, label || state);
// An agent's state as people read it: `running (throttled)` while the provider's limits hold its
// request back (it stays running).
export const agentState = (a) => (a.state === 'running' && a.throttled_since_ms ? 'running (throttled)' : a.state);


export function crumbs(...parts) {
  const nav = document.getElementById('crumbs');
  nav.replaceChildren(...parts.flatMap((p, i) => [i ? ' / ' : '', p]));
}
