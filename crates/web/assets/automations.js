// The tenant's webhooks, each with its latest delivery attempts (status, latency, error), and its
// schedules with their latest firings and the batches they forked.

import { h, short, ago, crumbs, stateCell } from './ui.js';

const when = (ms) => (ms ? new Date(ms).toISOString().replace('T', ' ').slice(0, 19) + 'Z' : '');

function webhookView({ webhook: w, attempts }) {
  const health = w.disabled ? h('span', { class: 'error' }, 'disabled: ' + w.disabled.reason)
    : w.failing_since_ms ? h('span', { class: 'error' }, 'failing since ' + ago(w.failing_since_ms))
      : h('span', { class: 'muted' }, 'healthy');
  const filter = w.named_only ? 'batches that name it' : [
    w.kinds.length ? w.kinds.join(', ') : 'every kind',
    w.session_id ? 'session ' + short(w.session_id) : 'every session',
  ].join(' · ');
  const rows = attempts.map((a) => h('tr', { 'data-delivery-id': a.delivery_id },
    h('td', { class: 'muted' }, when(a.at_ms)),
    h('td', {}, a.event === 'notification' ? 'notification #' + a.notification_seq : a.event),
    h('td', { class: 'num' }, String(a.number)),
    h('td', { class: 'num' }, a.status ? String(a.status) : 'no answer'),
    h('td', { class: 'num' }, a.latency_ms + ' ms'),
    stateCell(a.state),
    h('td', { class: 'muted' }, a.error || '')));
  return h('section', { class: 'webhook', 'data-webhook-id': w.webhook_id },
    h('h2', {}, h('span', { class: 'mono' }, w.url), ' ', health),
    h('p', { class: 'muted' }, short(w.webhook_id) + ' · ' + filter),
    attempts.length === 0 ? h('p', { class: 'muted' }, 'No attempts yet.')
      : h('table', { class: 'attempts' },
        h('thead', {}, h('tr', {}, ['at', 'event', 'attempt', 'status', 'latency', 'state', 'error']
          .map((t, i) => h('th', { class: i >= 2 && i <= 4 ? 'num' : '' }, t)))),
        h('tbody', {}, rows)));
}

function scheduleView(s) {
  const rows = s.firings.map((f) => h('tr', {},
    h('td', { class: 'muted' }, when(f.fire_at_ms) + (f.manual ? ' (triggered)' : '')),
    stateCell(f.state),
    h('td', { class: 'mono' }, f.batch_id ? h('a', { href: '#/batch/' + f.batch_id }, short(f.batch_id)) : ''),
    h('td', { class: 'muted' }, f.reason || '')));
  return h('section', { class: 'schedule', 'data-schedule': s.name },
    h('h2', {}, s.name, ' ', h('span', { class: 'mono muted' }, s.cron + ' (' + s.timezone + ')')),
    h('p', { class: 'muted' }, s.paused ? 'paused' : 'next: ' + when(s.next_fire_at_ms)),
    s.firings.length === 0 ? h('p', { class: 'muted' }, 'No firings yet.')
      : h('table', { class: 'firings' },
        h('thead', {}, h('tr', {}, ['due', 'state', 'batch', 'reason'].map((t) => h('th', {}, t)))),
        h('tbody', {}, rows)));
}

// `api` is the page's reader of its JSON API; `app` the element the page draws in.
export async function automationsView(api, app) {
  crumbs(h('a', { href: '#/' }, 'sessions'), h('span', {}, 'webhooks & schedules'));
  const { webhooks, schedules } = await api('/api/automations');
  app.replaceChildren(
    h('h1', {}, 'Webhooks'),
    webhooks.length ? h('div', { id: 'webhooks' }, webhooks.map(webhookView))
      : h('p', { class: 'muted', id: 'no-webhooks' }, 'No webhooks. Add one with forkctl webhook add URL.'),
    h('h1', {}, 'Schedules'),
    schedules.length ? h('div', { id: 'schedules' }, schedules.map(scheduleView))
      : h('p', { class: 'muted', id: 'no-schedules' }, 'No schedules. Add one with forkctl schedule add.'),
  );
}
