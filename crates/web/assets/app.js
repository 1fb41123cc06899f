// forkd's web view: a plain ES module, no build step. Every string from the daemon — transcripts
// are model output — reaches the page through text nodes (textContent), never as markup.

import {
  h, s, short, traceView, usd, pct, num, ago, dur, CHILD_STATES, limitsText, stateCell, agentState,
  crumbs,
} from './ui.js';
import { automationsView } from './automations.js';

const app = document.getElementById('app');
let me = null;          // { tenant, csrf, signed_in }
let streams = [];       // the open EventSources of the current page

class Unauthenticated extends Error {}

async function api(path, opts = {}) {
  const init = { credentials: 'same-origin', headers: {} };
  if (opts.method) {
    init.method = opts.method;
    init.headers['content-type'] = 'application/json';
    init.headers['x-forkd-csrf'] = me ? me.csrf : '';
    init.body = JSON.stringify(opts.body || {});
  }
  const res = await fetch(path, init);
  const body = await res.json().catch(() => ({}));
  if (res.status === 401) throw new Unauthenticated(body.error || 'sign in');
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function live(url, handlers, indicator) {
  const es = new EventSource(url);
  for (const [name, fn] of Object.entries(handlers)) {
    es.addEventListener(name, (ev) => fn(JSON.parse(ev.data), ev));
  }
  // The token of the sign-in was revoked: the server ends the stream with this event.
  es.addEventListener('unauthorized', (ev) => {
    for (const s of streams) s.close();
    streams = [];
    signInView(JSON.parse(ev.data).error);
  });
  if (indicator) {
    es.onopen = () => { indicator.textContent = '● live'; indicator.className = 'live'; };
    es.onerror = () => { indicator.textContent = '● reconnecting'; indicator.className = 'live off'; };
  }
  streams.push(es);
  return es;
}


function whoami() {
  const el = document.getElementById('whoami');
  if (!me) { el.replaceChildren(); return; }
  el.replaceChildren(
    'tenant ', h('b', { id: 'tenant' }, me.tenant), ' ',
    me.signed_in ? h('button', { id: 'signout', onclick: signOut }, 'Sign out') : '',
  );
}

async function act(button, path, body) {
  button.disabled = true;
  try {
    await api(path, { method: 'POST', body });
    return true;
  } catch (e) {
    alert(e.message);
    button.disabled = false;
    return false;
  }
}

// ---------- sign-in ----------

function signInView(message) {
  crumbs();
  me = null;
  whoami();
  const input = h('input', { id: 'token', type: 'password', placeholder: 'fkd_…', autocomplete: 'off' });
  const error = h('p', { id: 'signin-error', class: 'error' }, message || '');
  const form = h('form', {
    class: 'panel signin',
    onsubmit: async (ev) => {
      ev.preventDefault();
      error.textContent = '';
      try {
        const res = await fetch('/api/signin', {
          method: 'POST', credentials: 'same-origin',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ token: input.value }),
        });
        const body = await res.json().catch(() => ({}));
        input.value = '';
        if (!res.ok) { error.textContent = body.error || 'refused'; return; }
        me = body;
        whoami();
        route();
      } catch (e) { error.textContent = e.message; }
    },
  },
    h('h1', {}, 'Sign in to forkd'),
    h('p', { class: 'muted' }, 'Paste a token made with ', h('code', {}, 'forkd token create NAME'),
      '. It is checked by the daemon and kept there; the page holds only a session cookie. ',
      'On the daemon\'s machine, ', h('code', {}, 'forkctl ui'), ' prints a one-time link that signs you in as its own user.'),
    input,
    h('button', { id: 'signin', class: 'primary', type: 'submit' }, 'Sign in'),
    error);
  app.replaceChildren(form);
  input.focus();
}

async function signOut() {
  try { await api('/api/signout', { method: 'POST' }); } catch (e) { /* signed out anyway */ }
  signInView('Signed out.');
}

// ---------- sessions ----------

function sessionsView() {
  crumbs(h('span', {}, 'sessions'));
  const indicator = h('span', { class: 'live off' }, '● connecting');
  const body = h('tbody', {});
  const empty = h('p', { class: 'muted', id: 'no-sessions' }, 'No sessions yet. Create one with forkctl session create.');
  const table = h('table', { id: 'sessions' },
    h('thead', {}, h('tr', {}, ['session', 'model', 'state', 'turns', 'batches', 'agents', 'running', 'cost', 'last activity']
      .map((t, i) => h('th', { class: i >= 3 && i <= 7 ? 'num' : '' }, t)))),
    body);
  const automations = h('a', { href: '#/automations', id: 'automations-link' }, 'webhooks & schedules');
  app.replaceChildren(h('div', { class: 'toolbar' }, h('h1', {}, 'Sessions'), indicator, automations), empty, table);
  live('/api/live/sessions', {
    sessions: ({ sessions }) => {
      table.dataset.loaded = 'true';
      empty.hidden = sessions.length > 0;
      body.replaceChildren(...sessions.map((x) => h('tr', { 'data-session-id': x.id },
        h('td', { class: 'mono' }, h('a', { href: '#/session/' + x.id }, x.id)),
        h('td', {}, x.model),
        stateCell(x.state),
        h('td', { class: 'num' }, num(x.turns)),
        h('td', { class: 'num' }, num(x.batches)),
        h('td', { class: 'num' }, num(x.agents)),
        h('td', { class: 'num' }, num(x.running)),
        h('td', { class: 'num' }, usd(x.cost_usd)),
        h('td', { class: 'muted' }, ago(x.last_activity_ms)))));
    },
    failure: (e) => { empty.hidden = false; empty.textContent = e.error; },
  }, indicator);
}

// ---------- transcript rendering ----------

// A block of message `m`: a task notification is drawn as one only when forkd wrote it (the
// message's `note` mark), never because a text begins with the tag.
function blockView(b, m) {
  if (!b || typeof b !== 'object') return h('pre', {}, JSON.stringify(b));
  switch (b.type) {
    case 'text': {
      const text = b.text || '';
      if (m && m.note && text.startsWith('<task-notification>')) {
        const status = (text.match(/<status>([^<]*)<\/status>/) || [])[1] || '';
        const agent = (text.match(/<agent-id>([^<]*)<\/agent-id>/) || [])[1] || '';
        return h('details', { class: 'notification' },
          h('summary', {}, 'task notification · agent ', short(agent), ' · ', status), h('pre', {}, text));
      }
      if (text.length > 4000) {
        // A context file or a long paste: folded, its first line as the summary.
        return h('details', {}, h('summary', {}, (text.split('\n')[0] || '').slice(0, 100), ' … (', num(text.length), ' characters)'),
          h('div', { class: 'text' }, text));
      }
      return h('div', { class: 'text' }, text);
    }
    case 'thinking':
    case 'redacted_thinking':
      return h('details', {}, h('summary', {}, 'thinking'), h('pre', {}, b.thinking || '(redacted)'));
    case 'tool_use':
      return h('details', {}, h('summary', {}, 'tool call · ', b.name || '?'),
        h('pre', {}, JSON.stringify(b.input, null, 2)));
    case 'tool_result': {
      const content = typeof b.content === 'string' ? b.content
        : Array.isArray(b.content) ? b.content.map((c) => c.text || JSON.stringify(c)).join('\n') : JSON.stringify(b.content);
      return h('details', {}, h('summary', {}, b.is_error ? 'tool result (error)' : 'tool result'), h('pre', {}, content));
    }
    default:
      return h('details', {}, h('summary', {}, b.type || 'block'), h('pre', {}, JSON.stringify(b, null, 2)));
  }
}

function messageView(m) {
  if (m.compaction) {
    return h('div', { class: 'compaction' }, 'compaction boundary — the requests after it start with this summary',
      h('details', {}, h('summary', {}, 'summary'), ...(m.content || []).map((b) => blockView(b))));
  }
  const blocks = Array.isArray(m.content) ? m.content : [];
  return h('div', { class: 'msg ' + m.role + (m.shared ? ' shared' : ''), 'data-seq': m.seq ?? '' },
    h('div', { class: 'role' }, m.role, m.seq !== null && m.seq !== undefined ? ' · #' + m.seq : ''),
    ...blocks.map((b) => blockView(b, m)));
}

function transcriptView(messages, container) {
  const shared = messages.filter((m) => m.shared);
  const rest = messages.filter((m) => !m.shared);
  container.replaceChildren(
    shared.length ? h('details', { class: 'shared' },
      h('summary', {}, 'inherited context: ', String(shared.length), shared.length === 1 ? ' message' : ' messages',
        ' shared with the siblings'),
      ...shared.map(messageView)) : '',
    ...rest.map(messageView));
}

// ---------- a session ----------

async function sessionView(id) {
  crumbs(h('a', { href: '#/' }, 'sessions'), h('span', {}, 'session ' + short(id)));
  const data = await api('/api/sessions/' + id);
  const indicator = h('span', { class: 'live off' }, '● connecting');
  const head = h('div', { class: 'grid' });
  const batches = h('tbody', {});
  const typed = h('tbody', {});
  const prompts = h('div', { id: 'prompts' });
  const transcript = h('div', { id: 'transcript' });
  const mainActions = h('div', { class: 'actions' });
  let main = data.main_agent;

  const drawHead = (x) => head.replaceChildren(
    ...[['model', x.model], ['main loop', x.state], ['turns', num(x.turns)], ['batches', num(x.batches)],
      ['agents', num(x.agents) + (x.running ? ' (' + x.running + ' running)' : '')], ['cost', usd(x.cost_usd)],
      ['messages', num(x.messages)], ['last activity', ago(x.last_activity_ms)]]
      .map(([k, v]) => h('div', { class: 'stat' }, h('b', {}, v), h('span', {}, k))));
  const drawMain = () => {
    mainActions.replaceChildren();
    if (main && !main.ended && main.state === 'running') {
      const bg = h('button', { onclick: () => act(bg, '/api/agents/' + main.id + '/background') }, 'Background the turn');
      const kill = h('button', { class: 'danger', onclick: () => confirm('Kill this turn?') && act(kill, '/api/agents/' + main.id + '/kill') }, 'Kill the turn');
      mainActions.append(bg, kill);
    }
  };
  const drawBatches = (list) => batches.replaceChildren(...list.map((b) => h('tr', { 'data-batch-id': b.id },
    h('td', { class: 'mono' }, h('a', { href: '#/batch/' + b.id }, b.id)),
    h('td', { class: 'num' }, num(b.children)),
    h('td', {}, Object.entries(b.states).map(([k, v]) => k + ' ' + v).join(', ')),
    h('td', { class: 'num' }, usd(b.cost_usd)),
    h('td', { class: 'muted' }, ago(b.created_at_ms)))));
  const typedRows = new Map(data.typed.map((a) => [a.id, a]));
  const drawTyped = () => typed.replaceChildren(...[...typedRows.values()].map((a) => h('tr', { 'data-agent-id': a.id },
    h('td', { class: 'mono' }, h('a', { href: '#/agent/' + a.id }, short(a.id))),
    h('td', {}, a.subagent_type), h('td', {}, a.description), stateCell(a.state, agentState(a)),
    h('td', { class: 'num' }, usd(a.cost_usd)))));

  drawHead(data.session);
  drawMain();
  drawBatches(data.batches);
  drawTyped();
  transcriptView(data.transcript, transcript);

  const origin = data.branch
    ? h('p', { id: 'branch-of' }, 'Branch of ', h('a', { href: '#/session/' + data.branch.origin, class: 'mono' }, short(data.branch.origin)),
      ' after its turn ' + data.branch.after_turn + ' (its first ' + data.branch.point + ' messages; files are not rewound)')
    : '';
  // An uploaded session: the tree it was made from.
  const mib = (n) => n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + ' MiB' : (n / 1024).toFixed(1) + ' KiB';
  const uploaded = data.upload
    ? h('p', { id: 'upload-origin' }, 'Uploaded: ', num(data.upload.files), ' files, ', mib(data.upload.bytes),
      data.upload.git_commit ? [' · commit ', h('span', { class: 'mono' }, data.upload.git_commit.slice(0, 12))] : '',
      ' · upload ', h('span', { class: 'mono' }, short(data.upload.upload_id)))
    : '';
  const branches = h('table', { id: 'branches' }, h('thead', {}, h('tr', {}, ['branch', 'after turn', 'made'].map((t) => h('th', {}, t)))),
    h('tbody', {}, ...data.branches.map((b) => h('tr', { 'data-session-id': b.id },
      h('td', { class: 'mono' }, h('a', { href: '#/session/' + b.id }, b.id)),
      h('td', { class: 'num' }, num(b.after_turn)),
      h('td', { class: 'muted' }, ago(b.created_at_ms))))));

  app.replaceChildren(
    h('div', { class: 'toolbar' }, h('h1', {}, 'Session ', h('span', { class: 'mono' }, id)), indicator),
    h('p', { class: 'muted' }, 'permission mode ', data.permission_mode, ' · sandbox ', data.sandbox,
      data.session.interactive ? ' · interactive' : '', data.session.coordinator ? ' · coordinator' : ''),
    origin, uploaded, head, mainActions, prompts,
    h('h2', {}, 'Batches'),
    h('table', { id: 'batches' }, h('thead', {}, h('tr', {}, h('th', {}, 'batch'), h('th', { class: 'num' }, 'children'),
      h('th', {}, 'states'), h('th', { class: 'num' }, 'cost'), h('th', {}, 'forked'))), batches),
    ...(data.branches.length ? [h('h2', {}, 'Branches'), branches] : []),
    h('h2', {}, 'Typed agents'),
    h('table', { id: 'typed' }, h('thead', {}, h('tr', {}, ['agent', 'type', 'description', 'state', 'cost'].map((t) => h('th', {}, t)))), typed),
    h('h2', {}, 'Transcript'), transcript);

  let messages = data.session.messages;
  let refreshing = false;
  const refreshTranscript = async () => {
    if (refreshing) return;
    refreshing = true;
    try { transcriptView((await api('/api/sessions/' + id)).transcript, transcript); } finally { refreshing = false; }
  };
  live('/api/live/sessions/' + id, {
    session: (x) => { drawHead(x); if (x.messages !== messages) { messages = x.messages; refreshTranscript(); } },
    batches: drawBatches,
    agents: (rows) => {
      for (const a of rows) {
        if (a.kind === 'parent') { main = a; drawMain(); } else { typedRows.set(a.id, a); }
      }
      drawTyped();
    },
    notification: () => {},
    prompt: (p) => prompts.append(promptView(p)),
  }, indicator);
}

function promptView(p) {
  const box = h('div', { class: 'prompt', 'data-prompt-id': p.id });
  const answer = (kind) => async (ev) => {
    if (await act(ev.target, '/api/prompts/' + encodeURIComponent(p.id), { answer: kind })) {
      box.replaceChildren(h('span', { class: 'muted' }, 'answered: ' + kind));
    }
  };
  box.append(h('b', {}, 'Permission asked'), ' by agent ', h('a', { href: '#/agent/' + p.agent_id }, short(p.agent_id)),
    h('div', {}, p.question), h('pre', {}, p.tool + ' ' + p.input),
    h('div', { class: 'actions' },
      h('button', { class: 'primary', onclick: answer('allow') }, 'Allow once'),
      h('button', { onclick: answer('always') }, 'Always allow ' + p.tool),
      h('button', { class: 'danger', onclick: answer('deny') }, 'Deny')));
  return box;
}

// ---------- a batch ----------

const ROW = 28;

async function batchView(id, t0) {
  const data = await api('/api/batches/' + id);
  crumbs(h('a', { href: '#/' }, 'sessions'), h('span', { id: 'crumb-session' }), h('span', {}, 'batch ' + short(id)));
  const indicator = h('span', { class: 'live off' }, '● connecting');
  const rows = new Map();
  let order = [];
  let filter = '';
  const counts = h('div', { class: 'grid', id: 'batch-counts' });
  const figures = h('div', { id: 'figures' });
  const scroller = h('div', { class: 'vscroll', id: 'children' });
  const spacer = h('div', {});
  const tbody = h('tbody', {});
  const table = h('table', {}, h('thead', {}, h('tr', {},
    ['#', 'agent', 'description', 'state', 'in', 'written', 'read', 'out', 'read share', 'cost', 'duration']
      .map((t, i) => h('th', { class: i >= 4 && i !== 10 ? 'num' : '' }, t)))), tbody);
  scroller.append(spacer, table);
  const select = h('select', { id: 'state-filter', onchange: (e) => { filter = e.target.value; reorder(); } },
    ['', ...CHILD_STATES].map((x) => h('option', { value: x }, x || 'all states')));

  let drawQueued = false;
  const draw = () => {
    if (drawQueued) return;
    drawQueued = true;
    requestAnimationFrame(() => { drawQueued = false; drawWindow(); drawCounts(); });
  };
  const reorder = () => {
    order = [...rows.values()].filter((r) => !filter || r.state === filter).sort((a, b) => a.index - b.index);
    spacer.style.height = ((order.length + 1) * ROW + 4) + 'px';
    draw();
  };
  const drawWindow = () => {
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW) - 5);
    const count = Math.ceil(scroller.clientHeight / ROW) + 10;
    table.style.top = (first * ROW) + 'px';
    tbody.replaceChildren(...order.slice(first, first + count).map((a) => h('tr', { 'data-agent-id': a.id, 'data-index': a.index },
      h('td', { class: 'num' }, a.index + 1),
      h('td', { class: 'mono' }, h('a', { href: '#/agent/' + a.id }, short(a.id))),
      h('td', {}, (a.description || '').slice(0, 60)),
      stateCell(a.state, agentState(a)),
      h('td', { class: 'num' }, num(a.usage.input_tokens)),
      h('td', { class: 'num' }, num(a.usage.cache_creation_input_tokens)),
      h('td', { class: 'num' }, num(a.usage.cache_read_input_tokens)),
      h('td', { class: 'num' }, num(a.usage.output_tokens)),
      h('td', { class: 'num' }, pct(a.read_share)),
      h('td', { class: 'num' }, usd(a.cost_usd)),
      h('td', { class: 'num' }, a.ended ? ((a.updated_at_ms - a.created_at_ms) / 1000).toFixed(1) + ' s' : ''))));
  };
  const drawCounts = () => {
    const by = {};
    for (const r of rows.values()) by[r.state] = (by[r.state] || 0) + 1;
    counts.replaceChildren(h('div', { class: 'stat' }, h('b', { id: 'children-total' }, rows.size), h('span', {}, 'children')),
      ...CHILD_STATES.map((st) =>
        h('div', { class: 'stat' }, h('b', { class: 'state-' + st, id: 'count-' + st }, by[st] || 0), h('span', {}, st))));
  };
  scroller.addEventListener('scroll', draw, { passive: true });

  app.replaceChildren(
    h('div', { class: 'toolbar' }, h('h1', {}, 'Batch ', h('span', { class: 'mono' }, id)), indicator),
    traceView(data.trace),
    counts,
    h('h2', {}, 'Children'),
    h('div', { class: 'toolbar' }, select, h('span', { class: 'muted' }, 'rows are drawn as they scroll into view')),
    scroller,
    figures);
  document.getElementById('crumb-session').replaceChildren(
    h('a', { href: '#/session/' + data.batch.session_id }, 'session ' + short(data.batch.session_id)));
  drawFigures(figures, data.figures, data.figures.timeline.length);

  let first = true;
  live('/api/live/batches/' + id, {
    agents: (changed) => {
      for (const a of changed) rows.set(a.id, a);
      reorder();
      if (first && rows.size) {
        first = false;
        document.body.dataset.batchLoadedMs = String(Math.round(performance.now() - t0));
      }
    },
    figures: (f) => drawFigures(figures, f, rows.size),
    notification: () => {},
  }, indicator);
}

function drawFigures(container, f, n) {
  const st = f.stats, c = f.calc, est = c.estimate;
  container.replaceChildren(
    h('h2', {}, 'Cost against independent agents'),
    h('div', { class: 'grid' },
      ...[['this batch, input', usd(st.input_cost_usd)], ['this batch, all', usd(st.cost_usd)],
        ['as independent agents', usd(st.independent_cost_usd)], ['saving', pct(st.saving)],
        ['cache-read share', pct(st.read_share)], ['shared prefix', num(st.shared_prefix_tokens) + ' tok'],
        ['calculator, forks', est ? usd(est.fork_cost_usd) : '—'], ['calculator, independent', est ? usd(est.independent_cost_usd) : '—']]
        .map(([k, v]) => h('div', { class: 'stat' }, h('b', {}, v), h('span', {}, k)))),
    h('div', { class: 'row2' },
      h('div', {}, h('h2', {}, 'Input cost over N (calculator, ', f.model, ')'), costChart(c, st, n)),
      h('div', {}, h('h2', {}, 'Timeline: waiting, first request, first token, end'), timelineChart(f.timeline))));
}

function costChart(c, st, n) {
  const W = 560, H = 240, P = 40;
  const pts = c.curve;
  if (!pts.length) return h('p', { class: 'muted' }, 'No requests yet.');
  const maxN = pts[pts.length - 1].n;
  const maxY = Math.max(...pts.map((p) => p.independent), st.input_cost_usd, 1e-9);
  const x = (v) => P + (v - 1) / Math.max(1, maxN - 1) * (W - 2 * P);
  const y = (v) => H - P + 10 - v / maxY * (H - 2 * P);
  const line = (key) => pts.map((p, i) => (i ? 'L' : 'M') + x(p.n).toFixed(1) + ' ' + y(p[key]).toFixed(1)).join(' ');
  return s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', width: '100%', id: 'cost-chart' },
    s('line', { x1: P, y1: H - P + 10, x2: W - P, y2: H - P + 10, stroke: '#ccc' }),
    s('line', { x1: P, y1: 10, x2: P, y2: H - P + 10, stroke: '#ccc' }),
    s('path', { d: line('independent'), fill: 'none', stroke: '#c0392b', 'stroke-width': 2 }),
    s('path', { d: line('fork'), fill: 'none', stroke: '#2a5bd7', 'stroke-width': 2 }),
    s('circle', { cx: x(Math.min(n, maxN)), cy: y(st.input_cost_usd), r: 5, fill: '#1f8a4c' },
      s('title', {}, 'this batch: ' + usd(st.input_cost_usd) + ' input at N = ' + n)),
    s('text', { x: P, y: H - 6 }, 'N = 1'), s('text', { x: W - P - 30, y: H - 6 }, 'N = ' + maxN),
    s('text', { x: P + 4, y: 20 }, usd(maxY)),
    s('text', { x: W - 200, y: 24, fill: '#c0392b' }, '— N independent agents'),
    s('text', { x: W - 200, y: 40, fill: '#2a5bd7' }, '— forked (calculator)'),
    s('text', { x: W - 200, y: 56, fill: '#1f8a4c' }, '● this batch (measured)'));
}

function timelineChart(rows) {
  const shown = rows.slice(0, 200);
  if (!shown.length) return h('p', { class: 'muted' }, 'No children.');
  const t0 = Math.min(...shown.map((r) => r.created_at_ms));
  const open = shown.some((r) => !r.ended_at_ms);
  const t1 = Math.max(open ? Date.now() : 0, ...shown.map((r) => r.ended_at_ms || r.first_reply_ms || r.created_at_ms)) || t0 + 1;
  const W = 560, L = 40, R = 10, RH = Math.max(2, Math.min(12, 200 / shown.length * 2));
  const H = shown.length * RH + 30;
  const x = (t) => L + (t - t0) / Math.max(1, t1 - t0) * (W - L - R);
  const bars = [];
  for (const [i, r] of shown.entries()) {
    const yy = 6 + i * RH;
    const reply = r.first_reply_ms;
    // Waiting (pending, or behind the warm-up gate) until its first request was sent.
    const sent = r.first_sent_ms || r.created_at_ms;
    if (reply && sent > r.created_at_ms) {
      bars.push(s('rect', { x: x(r.created_at_ms), y: yy, width: Math.max(1, x(sent) - x(r.created_at_ms)), height: RH - 1, fill: '#d9d9d9' },
        s('title', {}, `child ${r.index + 1}: waited ${((sent - r.created_at_ms) / 1000).toFixed(2)} s before its first request`)));
    }
    if (reply) {
      bars.push(s('rect', { x: x(sent), y: yy, width: Math.max(1, x(reply) - x(sent)), height: RH - 1, fill: '#e5d3a8' },
        s('title', {}, `child ${r.index + 1}: first request sent after ${((sent - r.created_at_ms) / 1000).toFixed(2)} s, first token ${r.first_token_ms ?? '?'} ms later, reply ended after ${((reply - r.created_at_ms) / 1000).toFixed(2)} s`)));
      if (r.first_sent_ms && r.first_token_ms !== null) {
        bars.push(s('rect', { x: x(sent + r.first_token_ms) - 1, y: yy, width: 2, height: RH - 1, fill: '#b7791f' }));
      }
    }
    if (!reply && !r.ended_at_ms) {
      bars.push(s('rect', { x: x(r.created_at_ms), y: yy, width: Math.max(1, x(t1) - x(r.created_at_ms)), height: RH - 1, fill: '#e5d3a8', opacity: .5 },
        s('title', {}, `child ${r.index + 1}: no reply yet`)));
    }
    if (r.ended_at_ms) {
      const from = reply || r.created_at_ms;
      bars.push(s('rect', { x: x(from), y: yy, width: Math.max(1, x(r.ended_at_ms) - x(from)), height: RH - 1, fill: '#2a5bd7', opacity: .7 }));
    }
  }
  return h('div', {},
    s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', width: '100%', id: 'timeline' },
      ...bars,
      s('text', { x: 2, y: 14 }, '#1'), s('text', { x: L, y: H - 4 }, '0 s'),
      s('text', { x: W - R - 50, y: H - 4 }, ((t1 - t0) / 1000).toFixed(1) + ' s')),
    h('p', { class: 'muted' }, 'One row per child from the batch\'s start: grey while it waits (pending, or behind ',
      'warm-up gating), amber from its first request to the end of its first reply, the tick at its first token; blue ',
      'from then to its end. Under warm-up gating the siblings\' first requests start at child 1\'s first token.', rows.length > shown.length ? ` First ${shown.length} of ${rows.length} children.` : ''));
}

// ---------- an agent ----------

async function agentView(id) {
  const data = await api('/api/agents/' + id);
  if (data.agent.kind === 'parent') { location.hash = '#/session/' + data.agent.session_id; return; }
  let a = data.agent;
  crumbs(h('a', { href: '#/' }, 'sessions'), h('a', { href: '#/session/' + a.session_id }, 'session ' + short(a.session_id)),
    a.batch_id ? h('a', { href: '#/batch/' + a.batch_id }, 'batch ' + short(a.batch_id)) : '', h('span', {}, 'agent ' + short(id)));
  const indicator = h('span', { class: 'live off' }, '● connecting');
  const head = h('div', { class: 'grid', id: 'agent-head' });
  const facts = h('p', { class: 'muted', id: 'agent-facts' });
  const actions = h('div', { class: 'actions' });
  const report = h('div', { id: 'report' });
  const transcript = h('div', { id: 'transcript' });
  const requests = h('tbody', {});
  const explainOut = h('div', { id: 'explain' });
  const seen = new Set(data.transcript.filter((m) => m.seq !== null).map((m) => m.seq));
  const selected = new Set();

  const drawHead = () => {
    // When it started, the limits it runs under, how long the provider's limits held it back.
    const parts = [
      a.started_at_ms ? h('span', { id: 'agent-started', title: new Date(a.started_at_ms).toISOString() }, 'started ' + ago(a.started_at_ms)) : '',
      a.limits ? h('span', { id: 'agent-limits' }, 'limits: ' + limitsText(a.limits)) : '',
      a.throttled_ms ? h('span', {}, 'throttled ' + dur(a.throttled_ms)) : '',
    ].filter(Boolean);
    facts.replaceChildren(...parts.flatMap((x, i) => (i ? [' · ', x] : [x])));
    facts.hidden = !parts.length;
    head.replaceChildren(...[['state', agentState(a), 'agent-state'], ['kind', a.kind + (a.subagent_type ? ' · ' + a.subagent_type : '')],
      ['input', num(a.usage.input_tokens)], ['written', num(a.usage.cache_creation_input_tokens)],
      ['read', num(a.usage.cache_read_input_tokens)], ['output', num(a.usage.output_tokens)],
      ['read share', pct(a.read_share)], ['cost', usd(a.cost_usd)]]
      .map(([k, v, idv]) => h('div', { class: 'stat' }, h('b', { id: idv, class: k === 'state' ? 'state-' + a.state : '' }, v), h('span', {}, k))));
    actions.replaceChildren();
    if (!a.ended) {
      const bg = h('button', { id: 'background', onclick: () => act(bg, '/api/agents/' + id + '/background') }, 'Background');
      const kill = h('button', { id: 'kill', class: 'danger', onclick: () => act(kill, '/api/agents/' + id + '/kill') }, 'Kill');
      actions.append(bg, kill);
    }
    if (a.error) actions.append(h('span', { class: 'error' }, a.error));
  };
  const drawRequests = (list) => requests.replaceChildren(...list.map((r) => h('tr', { 'data-request-id': r.id },
    h('td', {}, h('input', { type: 'checkbox', onchange: (e) => { e.target.checked ? selected.add(r.id) : selected.delete(r.id); } })),
    h('td', { class: 'mono' }, short(r.id)), h('td', { class: 'num' }, r.turn),
    h('td', { class: 'num' }, num(r.usage.input_tokens)), h('td', { class: 'num' }, num(r.usage.cache_creation_input_tokens)),
    h('td', { class: 'num' }, num(r.usage.cache_read_input_tokens)), h('td', { class: 'num' }, num(r.usage.output_tokens)),
    h('td', { class: 'num' }, pct(r.read_share)),
    h('td', { class: 'num' }, r.first_token_ms !== null ? r.first_token_ms + ' ms' : '—'),
    h('td', { class: 'mono', title: r.prefix_fingerprint }, (r.prefix_fingerprint || '').slice(0, 12)),
    h('td', { class: 'num' }, usd(r.cost_usd)),
    h('td', {}, a.batch_id ? h('button', { onclick: () => explain(r.id) }, 'vs first sibling') : ''))));
  const explain = async (x, y) => {
    explainOut.replaceChildren(h('p', { class: 'muted' }, 'Comparing…'));
    try {
      const e = await api('/api/explain?a=' + encodeURIComponent(x) + (y ? '&b=' + encodeURIComponent(y) : ''));
      explainOut.replaceChildren(explainView(e));
    } catch (err) { explainOut.replaceChildren(h('p', { class: 'error' }, err.message)); }
  };
  const drawReport = (n) => report.replaceChildren(h('h2', {}, 'Report · ', h('span', { class: 'state-' + n.status }, n.status),
    n.status === 'timed_out' ? ' (partial report: a limit stopped it)' : ''),
    h('div', { class: 'panel', id: 'report-text' },
      n.report.scope ? h('p', {}, h('b', {}, 'Scope: '), n.report.scope) : '',
      n.report.structured !== undefined
        ? h('div', {}, h('b', {}, 'Structured report (output schema):'),
          h('pre', { id: 'report-structured', class: 'text mono' }, JSON.stringify(n.report.structured, null, 2)))
        : n.report.result ? h('div', { class: 'text' }, n.report.result) : h('p', {}, n.summary),
      n.report.files_changed?.length ? h('p', {}, h('b', {}, 'Files changed: '), n.report.files_changed.join(', ')) : '',
      n.report.issues ? h('p', {}, h('b', {}, 'Issues: '), n.report.issues) : '',
      n.report.key_files?.length ? h('p', {}, h('b', {}, 'Key files: '), n.report.key_files.join(', ')) : ''));

  drawHead();
  drawRequests(data.requests);
  transcriptView(data.transcript, transcript);
  app.replaceChildren(
    h('div', { class: 'toolbar' }, h('h1', {}, 'Agent ', h('span', { class: 'mono' }, id)), indicator),
    traceView(data.trace),
    data.directive ? h('p', {}, h('b', {}, data.directive.description)) : '',
    facts, head, actions, report, data.changes ? changesView(data.changes) : '',
    h('h2', {}, 'Requests'),
    h('div', { class: 'actions' }, h('button', { onclick: () => {
      const [x, y] = [...selected];
      if (!x || !y) { alert('Tick two requests to compare them.'); return; }
      explain(x, y);
    } }, 'Explain the two ticked requests')),
    h('table', { id: 'requests' }, h('thead', {}, h('tr', {}, ['', 'request', 'turn', 'in', 'written', 'read', 'out', 'read share', 'first token', 'prefix', 'cost', '']
      .map((t) => h('th', {}, t)))), requests),
    explainOut,
    hooksView(data.hooks),
    h('h2', {}, 'Transcript'), transcript);

  const es = live('/api/live/agents/' + id + '?from=' + data.next_seq, {
    message: (m) => {
      if (seen.has(m.seq)) return;
      seen.add(m.seq);
      transcript.append(messageView(m));
    },
    ended: (n) => { drawReport(n); es.close(); indicator.textContent = '● ended'; indicator.className = 'live'; refreshAgent(); },
    agent: (row) => { a = row; drawHead(); },
    requests: drawRequests,
    // The database refused the agent's write: it waits, and resumes by itself.
    interrupted: (p) => { indicator.textContent = '● interrupted: ' + p.reason; indicator.className = 'error'; },
    resumed: () => { indicator.textContent = '● live'; indicator.className = 'live'; },
  }, indicator);
  const refreshAgent = async () => { try { a = (await api('/api/agents/' + id)).agent; drawHead(); } catch (e) { /* shown on next load */ } };
}

// What the agent's hooks decided, one row per command run (docs/contracts.md, "Hooks").
function hooksView(runs) {
  if (!runs || !runs.length) return '';
  return h('div', { id: 'hooks' }, h('h2', {}, 'Hooks'),
    h('table', {}, h('thead', {}, h('tr', {}, ['event', 'tool', 'program', 'decision', 'exit', 'time', 'said'].map((t) => h('th', {}, t)))),
      h('tbody', {}, ...runs.map((r) => h('tr', { class: 'hook-' + r.decision },
        h('td', {}, r.event),
        h('td', { class: 'mono' }, r.tool_name ? r.tool_name + ' ' + short(r.tool_use_id) : ''),
        h('td', { class: 'mono' }, r.program),
        h('td', { class: 'decision' }, r.decision),
        h('td', { class: 'num' }, r.exit_code === null ? '—' : String(r.exit_code)),
        h('td', { class: 'num' }, r.duration_ms + ' ms'),
        h('td', {}, h('pre', { class: 'text' }, r.output)))))));
}

// A file name as git quotes it (core.quotePath): a name holding a newline, a quote, a control
// or non-ASCII character is shown quoted, so it cannot pass for lines of a diff or a list.
function quotePath(path) {
  const bytes = new TextEncoder().encode(path);
  if (bytes.every((b) => b >= 0x20 && b < 0x7f && b !== 0x22 && b !== 0x5c)) return path;
  const named = { 0x07: '\\a', 0x08: '\\b', 0x09: '\\t', 0x0a: '\\n', 0x0b: '\\v', 0x0c: '\\f', 0x0d: '\\r', 0x22: '\\"', 0x5c: '\\\\' };
  let out = '"';
  for (const b of bytes) {
    out += named[b] || (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : '\\' + b.toString(8).padStart(3, '0'));
  }
  return out + '"';
}

// An isolated child's copy: its files, then the unified diff, its lines marked.
function changesView(c) {
  const line = (l) => h('span', { class: l.startsWith('+') && !l.startsWith('+++') ? 'diff-add'
    : l.startsWith('-') && !l.startsWith('---') ? 'diff-del' : l.startsWith('@@') ? 'diff-hunk' : '' }, l + '\n');
  return h('div', { id: 'changes' },
    h('h2', {}, 'Changes · ', c.state),
    h('p', {}, c.summary, c.outside_possible ? ' — changes outside the copy possible (an MCP tool not marked read-only)' : ''),
    c.conflicts.length ? h('ul', { class: 'error' }, ...c.conflicts.map((x) => h('li', {}, quotePath(x.path) + ': ' + x.reason))) : '',
    c.diff ? h('pre', { class: 'diff' }, ...c.diff.split('\n').map(line)) : '');
}

function explainView(e) {
  // The bodies are identical up to the first differing byte, and both excerpts start at the same
  // place: the first character where they differ is that byte.
  const [p, q] = [e.excerpt || '', e.other_excerpt || ''];
  let i = 0;
  while (i < p.length && i < q.length && p[i] === q[i]) i++;
  const pane = (text) => h('pre', {}, text.slice(0, i), h('mark', {}, text.slice(i, i + 1) || '∅'), text.slice(i + 1));
  return h('div', { class: 'panel' },
    h('p', {}, e.same_prefix ? 'Same prefix. ' : 'The prefixes differ. ',
      e.part ? ['First difference in ', h('b', {}, e.part), ' at byte ', h('b', {}, num(e.byte)), e.exact ? '' : ' (approximately)', '. '] : '',
      e.note || ''),
    h('div', { class: 'explain' },
      h('div', {}, h('div', { class: 'mono' }, 'request ', e.request_id), pane(p)),
      h('div', {}, h('div', { class: 'mono' }, 'request ', e.other_request_id), pane(q))));
}

// ---------- routing ----------

async function route() {
  for (const es of streams) es.close();
  streams = [];
  const t0 = performance.now();
  try {
    if (!me) { me = await api('/api/me'); whoami(); }
    const [, kind, id] = (location.hash || '#/').split('/');
    if (kind === 'session' && id) await sessionView(id);
    else if (kind === 'batch' && id) await batchView(id, t0);
    else if (kind === 'agent' && id) await agentView(id);
    else if (kind === 'automations') await automationsView(api, app);
    else sessionsView();
  } catch (e) {
    if (e instanceof Unauthenticated) signInView();
    else app.replaceChildren(h('p', { class: 'error', id: 'page-error' }, e.message));
  }
}

window.addEventListener('hashchange', route);
route();
