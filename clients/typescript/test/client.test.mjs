// The client against a real daemon: every call, errors by meaning, an aborted wait, a batch
// followed across a SIGKILL and restart, TCP with tokens, a 1000-child wait's memory, capacity
// and a dry run, webhooks (deliveries verified here with the Standard Webhooks library); and, on
// requests caught before they leave, limits as a batch's request carries them, `timed_out` read
// back, capacity and dry runs mapped, and a batch's webhook in its request; a session's own hooks
// (sent as the settings text, their events read back, run for its children with each run read
// back as `agent.hookRuns()`, refused outside the sandbox).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Webhook, WebhookVerificationError } from "standardwebhooks";

import * as pb from "../dist/gen/forkd/v1/forkd.js";
import * as forkd from "../dist/index.js";
import { Daemon, freePort } from "./daemon.mjs";

const daemon = new Daemon({ speed: "1" });
before(() => daemon.start());
after(() => daemon.stop());

const client = () => new forkd.Client({ addr: daemon.addr });

test("a batch is forked and each child reports once", async () => {
  const c = client();
  writeFileSync(join(daemon.workspace, "README.md"), "# A project\n");
  const session = await c.sessions.create({
    system: "You are a reviewer.",
    context: [join(daemon.workspace, "README.md"), ["notes.md", "Be brief."]],
    workspace: daemon.workspace,
  });
  assert.equal((await c.sessions.get(session.id)).id, session.id);
  const batch = await session.fork(["Review the API.\n@sim say api ok", ["docs", "Review.\n@sim say docs ok"]]);
  assert.equal(batch.agentIds.length, 2);
  const seen = [];
  for await (const n of batch.notifications()) seen.push(n);
  assert.deepEqual(seen.map((n) => n.agentId).sort(), [...batch.agentIds].sort());
  assert.ok(seen.every((n) => n.status === "completed"));
  assert.equal((await batch.wait({ signal: AbortSignal.timeout(30_000) })).length, 2);
  const stored = [];
  for await (const n of c.notifications({ since: 0, follow: false })) stored.push(n);
  const mine = stored.filter((n) => n.batchId === batch.id);
  assert.equal(mine.length, 2);
  const later = [];
  for await (const n of c.notifications({ since: mine[0].seq, follow: false })) later.push(n.seq);
  assert.ok(!later.includes(mine[0].seq));
  const agent = await c.agents.get(batch.agentIds[0]);
  assert.ok((await agent.transcript()).some((m) => m.role === "assistant"));
  const turn = [];
  for await (const e of session.send("Hi.\n@sim say hello")) turn.push(e);
  assert.equal(turn.at(-1).$case, "turnEnded");
  const branch = await session.branch(1);
  assert.notEqual(branch.id, session.id);
  c.close();
});

test("structured results come back as the schema says", async () => {
  const c = client();
  const session = await c.sessions.create({ system: "s", workspace: daemon.workspace });
  const verdict = JSON.stringify({ verdict: "pass", findings: ["a.rs"] });
  const batch = await session.fork([`Judge.\n@sim json ${verdict}`], {
    outputSchema: { type: "object", required: ["verdict"], properties: { verdict: { enum: ["pass", "fail"] } } },
  });
  const [n] = await batch.wait();
  assert.deepEqual(n.report.structured, { verdict: "pass", findings: ["a.rs"] });
  c.close();
});

test("errors keep their meaning, and an aborted wait stops waiting", async () => {
  const c = client();
  await assert.rejects(c.sessions.get("01a00000-0000-7000-8000-000000000000"), forkd.NotFound);
  const session = await c.sessions.create({ system: "s", workspace: daemon.workspace });
  await assert.rejects(session.fork([]), forkd.InvalidArgument);
  await assert.rejects(session.fork(["x"], { outputSchema: { type: "objet" } }), forkd.InvalidArgument);
  const gone = new forkd.Client({ addr: `unix:${join(daemon.home, "nobody.sock")}`, reconnectForMs: 500 });
  await assert.rejects(gone.sessions.get(session.id), forkd.Unavailable);
  gone.close();
  assert.throws(() => new forkd.Client({ addr: "ftp://x" }), TypeError);

  const slow = await session.fork(["Slow.\n@sim sleep 20s\n@sim say never"]);
  const started = Date.now();
  await assert.rejects(slow.wait({ signal: AbortSignal.timeout(300) }), { name: "TimeoutError" });
  assert.ok(Date.now() - started < 3000);
  const agent = await c.agents.get(slow.agentIds[0]);
  assert.equal(await agent.background(), "async_launched");
  await agent.kill();
  const [n] = await slow.wait({ signal: AbortSignal.timeout(30_000) });
  assert.equal(n.status, "killed");
  c.close();
});

test("a wait is resumed across a daemon restart", async () => {
  const c = client();
  const session = await c.sessions.create({ system: "s", workspace: daemon.workspace });
  const batch = await session.fork([0, 1].map((i) => `Part ${i}.\n@sim sleep 2s\n@sim say part ${i} done`));
  const restart = (async () => {
    await new Promise((r) => setTimeout(r, 700));
    daemon.kill9();
    await new Promise((r) => setTimeout(r, 500));
    await daemon.start();
  })();
  const done = await batch.wait({ signal: AbortSignal.timeout(60_000) });
  await restart;
  assert.deepEqual(done.map((n) => n.agentId).sort(), [...batch.agentIds].sort());
  assert.ok(done.every((n) => n.status === "completed"));
  // A turn sent while the daemon is down goes once it is back, under its key.
  daemon.kill9();
  const back = (async () => {
    await new Promise((r) => setTimeout(r, 500));
    await daemon.start();
  })();
  const turn = [];
  for await (const e of session.send("Still there?\n@sim say yes")) turn.push(e.$case);
  await back;
  assert.equal(turn.at(-1), "turnEnded");
  assert.equal((await c.sessions.get(session.id)).info.finishedTurns, 1);
  c.close();
});

test("tokens travel over TCP and tenants stay apart", async () => {
  const tcp = new Daemon({ speed: "0", listen: `127.0.0.1:${await freePort()}` });
  await tcp.start();
  try {
    const addr = `http://${tcp.listen}`;
    const alice = new forkd.Client({ addr, token: tcp.token("alice") });
    const bob = new forkd.Client({ addr, token: tcp.token("bob") });
    const session = await alice.sessions.create({ system: "s" });
    const [n] = await (await session.fork(["Go.\n@sim say done"])).wait();
    assert.equal(n.status, "completed");
    await assert.rejects(bob.sessions.get(session.id), forkd.NotFound);
    const anon = new forkd.Client({ addr, token: "" });
    await assert.rejects(anon.sessions.get(session.id), forkd.Unauthenticated);
    for (const c of [alice, bob, anon]) c.close();
  } finally {
    tcp.stop();
  }
});

test("a thousand children are waited on in little memory", () => {
  const out = spawnSync(process.execPath, [new URL("./wait_many.mjs", import.meta.url).pathname, daemon.addr, daemon.workspace, "1000"], {
    encoding: "utf8",
    timeout: 600_000,
  });
  assert.equal(out.status, 0, out.stderr);
  const report = JSON.parse(out.stdout);
  console.log(`1000-child wait: ${JSON.stringify(report)}`);
  assert.equal(report.completed, 1000);
  assert.ok(report.peakRssMiB < 128, out.stdout);
});

test("uploads, isolated changes applied here, attach, merge and zod schemas", async () => {
  const { cpSync, mkdirSync, readFileSync, symlinkSync } = await import("node:fs");
  const { z } = await import("zod");
  const c = client();
  // An upload: the tree's ignore files kept, only missing contents sent again.
  const tree = join(daemon.root, "tree");
  mkdirSync(join(tree, "sub"), { recursive: true });
  writeFileSync(join(tree, "a.txt"), "alpha\n");
  writeFileSync(join(tree, ".gitignore"), "*.log\n");
  writeFileSync(join(tree, "noise.log"), "x\n");
  writeFileSync(join(tree, "sub", "b.txt"), "beta\n");
  symlinkSync("a.txt", join(tree, "link"));
  const first = await c.upload(tree);
  assert.ok(first.blobsReceived > 0);
  assert.equal((await c.upload(tree)).blobsReceived, 0);
  const uploaded = await c.sessions.create({ system: "s", upload: tree });
  assert.equal(uploaded.info.uploadOrigin?.files, 4);

  // Isolated children; their changes applied to a checkout here, one with a conflict.
  const ws = join(daemon.root, "isolated");
  mkdirSync(ws);
  writeFileSync(join(ws, "README.md"), "line1\nline2\nline3\n");
  const session = await c.sessions.create({ system: "s", workspace: ws, permissionMode: "bypassPermissions" });
  const write = '@sim tool Write {"file_path":"new.txt","content":"made\\n"}';
  const edit = '@sim tool Edit {"file_path":"README.md","old_string":"line2","new_string":"LINE2"}';
  const batch = await session.fork([`Add.\n${write}\n@sim say added`, `Edit.\n${edit}\n@sim say edited`], {
    isolation: "copy",
  });
  await batch.wait({ signal: AbortSignal.timeout(60_000) });
  const checkout = join(daemon.root, "checkout");
  cpSync(ws, checkout, { recursive: true });
  writeFileSync(join(checkout, "README.md"), "line1\nother\nline3\n");
  const [added, edited] = await batch.apply({ to: checkout });
  assert.deepEqual(added.applied, ["new.txt"]);
  assert.deepEqual(edited.applied, []);
  assert.deepEqual(edited.conflicts.map((x) => x.path), ["README.md"]);
  assert.equal(readFileSync(join(checkout, "new.txt"), "utf8"), "made\n");
  assert.equal(readFileSync(join(checkout, "README.md"), "utf8"), "line1\nother\nline3\n");

  // Attach to an ended child: its messages, then its end.
  const events = [];
  for await (const e of (await c.agents.get(batch.agentIds[0])).attach()) events.push(e.$case);
  assert.equal(events.at(-1), "ended");
  assert.ok(events.includes("message"));

  // A branch merged back; a zod schema sent as JSON Schema and the result parsed with it.
  for await (const _ of session.send("Hi.\n@sim say hello"));
  const branch = await session.branch(1);
  for await (const _ of branch.send("More.\n@sim say more"));
  assert.ok(await branch.merge());
  const Verdict = z.object({ verdict: z.enum(["pass", "fail"]), findings: z.array(z.string()) });
  const judged = await session.fork([`Judge.\n@sim json ${JSON.stringify({ verdict: "fail", findings: ["b.rs"] })}`], {
    outputSchema: Verdict,
  });
  const [n] = await judged.wait();
  assert.deepEqual(n.report.structured, { verdict: "fail", findings: ["b.rs"] });
  c.close();
});

// A client whose ForkBatch calls are caught here (no daemon): what each request carried.
function caught() {
  const c = new forkd.Client({ addr: "unix:/nonexistent/forkd.sock", reconnectForMs: 100 });
  const sent = [];
  c.stub.forkBatch = (request, _metadata, _options, callback) => {
    sent.push(request);
    callback(null, { batchId: "b", agentIds: request.directives.map((_, i) => `a${i}`) });
    return { cancel() {} };
  };
  return { c, sent, session: new forkd.Session(c, pb.Session.fromPartial({ sessionId: "s" })) };
}

test("a batch's limits and a directive's own go in its request", async () => {
  const { c, sent, session } = caught();
  const batch = await session.fork(
    ["Plain.", ["api", "Review the API."], ["docs", "Review the docs.", { timeoutMs: 120_000, maxTurns: 5 }]],
    { timeoutMs: 600_000, idleTimeoutMs: 90_000, maxTurns: 40, maxOutputTokens: 20_000, timeoutExcludesThrottle: true },
  );
  assert.deepEqual(batch.agentIds, ["a0", "a1", "a2"]);
  const [request] = sent;
  assert.deepEqual(request.limits, {
    timeoutMs: 600_000,
    idleTimeoutMs: 90_000,
    maxTurns: 40,
    maxOutputTokens: 20_000,
    timeoutExcludesThrottle: true,
  });
  const [plain, api, docs] = request.directives;
  assert.equal(plain.limits, undefined);
  assert.equal(api.limits, undefined);
  assert.equal(docs.description, "docs");
  assert.deepEqual(docs.limits, { timeoutMs: 120_000, idleTimeoutMs: 0, maxTurns: 5, maxOutputTokens: 0, timeoutExcludesThrottle: undefined });
  // On the wire as the daemon reads it.
  const wire = pb.ForkBatchRequest.decode(pb.ForkBatchRequest.encode(request).finish());
  assert.equal(wire.limits.timeoutMs, 600_000);
  assert.equal(wire.directives[2].limits.maxTurns, 5);
  // `false` is sent, not left out; no limits at all: no Limits message.
  await session.fork(["x"], { timeoutExcludesThrottle: false });
  assert.equal(sent.at(-1).limits.timeoutExcludesThrottle, false);
  await session.fork(["x"], { budgetUsd: 1 });
  assert.equal(sent.at(-1).limits, undefined);
  assert.equal(sent.at(-1).directives[0].limits, undefined);
  c.close();
});

test("a limit that is not a positive whole number is refused before sending", async () => {
  const { c, sent, session } = caught();
  const bad = [
    [{ timeoutMs: 0 }, RangeError, /timeoutMs must be a positive whole number/],
    [{ timeoutMs: -1 }, RangeError, /timeoutMs must be a positive/],
    [{ timeoutMs: 1.5 }, RangeError, /timeoutMs must be a positive whole number/],
    [{ timeoutMs: Number.NaN }, RangeError, /timeoutMs/],
    [{ timeoutMs: Number.POSITIVE_INFINITY }, RangeError, /timeoutMs/],
    [{ timeoutMs: "10s" }, TypeError, /timeoutMs is a number/],
    [{ idleTimeoutMs: 0 }, RangeError, /idleTimeoutMs must be a positive/],
    [{ maxTurns: 0 }, RangeError, /maxTurns must be a positive/],
    [{ maxTurns: 2 ** 32 }, RangeError, /maxTurns is too large/],
    [{ maxOutputTokens: -5 }, RangeError, /maxOutputTokens must be a positive/],
    [{ maxOutputTokens: 2 ** 60 }, RangeError, /maxOutputTokens is too large/],
    [{ timeoutExcludesThrottle: 1 }, TypeError, /timeoutExcludesThrottle is a boolean/],
  ];
  for (const [limits, error, message] of bad) {
    await assert.rejects(session.fork(["x"], limits), (e) => e instanceof error && message.test(e.message));
    await assert.rejects(session.fork([["d", "p", limits]]), (e) => e instanceof error && message.test(e.message));
  }
  await assert.rejects(session.fork([["d", "p", 5]]), TypeError);
  assert.equal(sent.length, 0);
  c.close();
});

test("timed_out is a status and a state, an agent's limits and start are read back", async () => {
  const c = new forkd.Client({ addr: "unix:/nonexistent/forkd.sock", reconnectForMs: 100 });
  const notes = [
    { seq: 1, agentId: "a0", status: pb.NotificationStatus.NOTIFICATION_STATUS_COMPLETED },
    {
      seq: 2,
      agentId: "a1",
      status: pb.NotificationStatus.NOTIFICATION_STATUS_TIMED_OUT,
      report: { result: "half done", issues: "stopped: timeout (10m) reached" },
    },
  ].map((n) => pb.Notification.fromPartial(n));
  c.stub.subscribeNotifications = () => ({
    async *[Symbol.asyncIterator]() {
      yield* notes;
    },
    cancel() {},
  });
  const done = await new forkd.Batch(c, "b", ["a0", "a1"]).wait();
  assert.deepEqual(done.map((n) => n.status), ["completed", "timed_out"]);
  assert.equal(done[1].report.result, "half done");
  assert.match(done[1].report.issues, /timeout/);
  const failures = done.filter((n) => n.status !== "completed");
  assert.deepEqual(failures.map((n) => n.agentId), ["a1"]);

  const startedAt = new Date("2026-03-01T12:00:05Z");
  const agent = new forkd.Agent(
    c,
    pb.Agent.fromPartial({
      agentId: "a1",
      state: pb.AgentState.AGENT_STATE_TIMED_OUT,
      limits: { timeoutMs: 600_000, maxTurns: 40, timeoutExcludesThrottle: false },
      startedAt,
    }),
  );
  assert.equal(agent.state, "timed_out");
  assert.deepEqual(agent.limits, { timeoutMs: 600_000, maxTurns: 40, timeoutExcludesThrottle: false });
  assert.equal(agent.startedAt.getTime(), startedAt.getTime());
  const bare = new forkd.Agent(c, pb.Agent.fromPartial({ agentId: "a2", state: pb.AgentState.AGENT_STATE_PENDING }));
  assert.equal(bare.state, "pending");
  assert.deepEqual(bare.limits, {});
  assert.equal(bare.startedAt, undefined);
  c.close();
});

test("a batch with limits is taken by the daemon", async () => {
  const c = client();
  const session = await c.sessions.create({ system: "s", workspace: daemon.workspace });
  const batch = await session.fork(
    ["Quick.\n@sim say quick", ["own", "Own limits.\n@sim say own", { timeoutMs: 120_000, maxTurns: 8 }]],
    { timeoutMs: 300_000, idleTimeoutMs: 60_000, maxTurns: 10, maxOutputTokens: 100_000, timeoutExcludesThrottle: true },
  );
  const done = await batch.wait({ signal: AbortSignal.timeout(60_000) });
  assert.deepEqual(done.map((n) => n.agentId).sort(), [...batch.agentIds].sort());
  assert.ok(done.every((n) => n.status === "completed"));
  const own = await c.agents.get(batch.agentIds[1]);
  assert.equal(own.state, "completed");
  // The daemon tells them back, resolved: the child's own over the batch's.
  assert.deepEqual(own.limits, {
    timeoutMs: 120_000,
    idleTimeoutMs: 60_000,
    maxTurns: 8,
    maxOutputTokens: 100_000,
    timeoutExcludesThrottle: true,
  });
  assert.ok(own.startedAt instanceof Date);
  c.close();
});

test("a child past its limit times out", async () => {
  const c = client();
  const session = await c.sessions.create({ system: "s", workspace: daemon.workspace });
  const batch = await session.fork(["Quick.\n@sim say quick", "Stalls.\n@sim stall\n@sim say never"], {
    idleTimeoutMs: 500,
  });
  const done = new Map((await batch.wait({ signal: AbortSignal.timeout(60_000) })).map((n) => [n.agentId, n]));
  assert.equal(done.get(batch.agentIds[0]).status, "completed");
  const late = done.get(batch.agentIds[1]);
  assert.equal(late.status, "timed_out");
  assert.ok(late.report.issues.startsWith("timed out: no model output"), late.report.issues);
  assert.equal((await c.agents.get(batch.agentIds[1])).state, "timed_out");
  c.close();
});

// Asking before submitting: `client.capacity()` and `session.dryRun(...)`.

const DRY = {
  children: 2,
  prefixTokens: 1072,
  directiveTokens: 12,
  forkCostUsd: 0.0044,
  independentCostUsd: 0.0065,
  saving: 0.32,
  slots: { used: 3, free: 253, total: 256 },
  queued: 1,
  startInMs: 0,
  finishInMs: 41700,
  estimateBasis: "no cap on running agents; runs here took 42 s (median of the latest 6)",
};

test("capacity and a dry run are mapped from the daemon's answers, a dry run's request is the fork's", async () => {
  const c = new forkd.Client({ addr: "unix:/nonexistent/forkd.sock", reconnectForMs: 100 });
  const sent = [];
  c.stub.forkBatch = (request, _metadata, _options, callback) => {
    sent.push(request);
    const reply = request.dryRun
      ? { batchId: "", agentIds: [], dryRun: pb.DryRun.fromPartial(DRY) }
      : { batchId: "b", agentIds: request.directives.map((_, i) => `a${i}`) };
    callback(null, pb.ForkBatchResponse.fromPartial(reply));
    return { cancel() {} };
  };
  let capacity = pb.GetCapacityResponse.fromPartial({
    providers: [
      {
        provider: "anthropic",
        endpoint: "https://api.anthropic.com",
        model: "claude-sonnet-4-5",
        limits: [{ name: "requests", perSecond: 0.8, burst: 4, source: "headers" }],
        concurrency: 32,
        inFlight: 3,
        waiting: 1,
        throttled: 2,
        refusalsLastMinute: 5,
        pausedForMs: 1500,
      },
    ],
    slots: { used: 250, free: 6, total: 256 },
    queued: 4,
    budgetLeft: { usd: 1.25 },
  });
  c.stub.getCapacity = (_request, _metadata, _options, callback) => {
    callback(null, capacity);
    return { cancel() {} };
  };
  assert.deepEqual(await c.capacity(), {
    slots: { used: 250, free: 6, total: 256 },
    queued: 4,
    budgetLeft: { usd: 1.25 },
    providers: [
      {
        provider: "anthropic",
        endpoint: "https://api.anthropic.com",
        model: "claude-sonnet-4-5",
        limits: [{ name: "requests", perSecond: 0.8, burst: 4, source: "headers" }],
        concurrency: 32,
        inFlight: 3,
        waiting: 1,
        throttled: 2,
        refusalsLastMinute: 5,
        pausedForMs: 1500,
      },
    ],
  });
  // A budget of tokens only (0 left is a limit); no budget and no cap: undefined, and zeros.
  capacity = pb.GetCapacityResponse.fromPartial({ budgetLeft: { tokens: 0 } });
  assert.deepEqual((await c.capacity()).budgetLeft, { tokens: 0 });
  capacity = pb.GetCapacityResponse.fromPartial({});
  assert.deepEqual(await c.capacity(), {
    slots: { used: 0, free: 0, total: 0 },
    queued: 0,
    budgetLeft: undefined,
    providers: [],
  });

  const session = new forkd.Session(c, pb.Session.fromPartial({ sessionId: "s" }));
  const directives = ["One.", ["two", "Two.", { maxTurns: 5 }]];
  const options = {
    isolation: "copy",
    outputSchema: { type: "object" },
    budgetUsd: 2.5,
    budgetTokens: 100_000,
    atTurn: 3,
    warmupGating: false,
    timeoutMs: 600_000,
    idleTimeoutMs: 90_000,
    maxTurns: 40,
    maxOutputTokens: 20_000,
    timeoutExcludesThrottle: true,
    webhook: "w",
    idempotencyKey: "k",
  };
  assert.deepEqual(await session.dryRun(directives, options), DRY);
  const batch = await session.fork(directives, options);
  assert.deepEqual(batch.agentIds, ["a0", "a1"]);
  const [asked, forked] = sent;
  assert.equal(asked.dryRun, true);
  assert.equal(forked.dryRun, false);
  assert.deepEqual({ ...asked, dryRun: false }, forked);
  assert.equal(forked.limits.maxTurns, 40);
  assert.equal(forked.directives[1].limits.maxTurns, 5);
  assert.equal(forked.webhookId, "w");
  // On the wire as the daemon reads it.
  assert.equal(pb.ForkBatchRequest.decode(pb.ForkBatchRequest.encode(asked).finish()).dryRun, true);
  // Refused here as the fork's are, before anything is sent.
  await assert.rejects(session.dryRun(["x"], { maxTurns: 0 }), RangeError);
  assert.equal(sent.length, 2);
  // A webhook by its record; none: empty; anything else: refused before sending.
  await session.fork(["x"], { webhook: { webhookId: "w2", url: "http://x/", kinds: [], namedOnly: false } });
  assert.equal(sent.at(-1).webhookId, "w2");
  await session.fork(["x"]);
  assert.equal(sent.at(-1).webhookId, "");
  await assert.rejects(session.fork(["x"], { webhook: 7 }), TypeError);
  assert.equal(sent.length, 4);
  c.close();
});

test("capacity of a fresh daemon, and a dry run that forks nothing and leaves its key free", async () => {
  const fresh = new Daemon({ speed: "0" });
  await fresh.start();
  const c = new forkd.Client({ addr: fresh.addr });
  try {
    // The default max_running_agents, none taken; nothing of ours waits; no tenant budget.
    const capacity = await c.capacity();
    assert.deepEqual(capacity.slots, { used: 0, free: 256, total: 256 });
    assert.equal(capacity.queued, 0);
    assert.equal(capacity.budgetLeft, undefined);

    const session = await c.sessions.create({ system: "s", workspace: fresh.workspace });
    const turn = [];
    for await (const e of session.send("Hello.\n@sim say hi")) turn.push(e.$case);
    assert.equal(turn.at(-1), "turnEnded");
    const agents = async () =>
      (await c.call(c.stub.listAgents, pb.ListAgentsRequest.fromPartial({ sessionId: session.id, includeEnded: true })))
        .agents;
    const directives = ["Review the API.\n@sim say api ok", ["docs", "Review the docs.\n@sim say docs ok", { maxTurns: 5 }]];
    const options = { atTurn: 1, maxTurns: 10, idempotencyKey: "dry-then-real" };
    const dry = await session.dryRun(directives, options);
    assert.equal(dry.children, directives.length);
    assert.ok(dry.forkCostUsd > 0);
    assert.ok(dry.independentCostUsd > dry.forkCostUsd);
    assert.ok(dry.prefixTokens > 0 && dry.directiveTokens > 0);
    assert.equal(dry.slots.total, 256);
    assert.equal(dry.queued, 0);
    // Nothing was forked: the session's only agent is its parent's main loop.
    assert.deepEqual((await agents()).map((a) => a.kind), ["parent"]);

    // The key was not recorded: the fork under it forks now (not `existing`).
    const replies = [];
    const forkBatch = c.stub.forkBatch;
    c.stub.forkBatch = function (request, metadata, callOptions, callback) {
      return forkBatch.call(this, request, metadata, callOptions, (error, reply) => {
        if (reply) replies.push(reply);
        callback(error, reply);
      });
    };
    const batch = await session.fork(directives, options);
    // Sent again under its key, the fork is the first one's (what `existing` tells).
    const again = await session.fork(directives, options);
    c.stub.forkBatch = forkBatch;
    assert.deepEqual(replies.map((r) => r.existing), [false, true]);
    assert.equal(replies[0].dryRun, undefined);
    assert.equal(batch.agentIds.length, 2);
    assert.equal(again.id, batch.id);
    const done = await batch.wait({ signal: AbortSignal.timeout(60_000) });
    assert.ok(done.every((n) => n.status === "completed"));
    const kinds = (await agents()).map((a) => a.kind);
    assert.equal(kinds.length, 3);
    assert.equal(kinds.filter((k) => k === "parent").length, 1);

    // Refused as the fork would be.
    const other = await c.sessions.create({ system: "s", workspace: fresh.workspace });
    await assert.rejects(other.dryRun(["x"], { atTurn: 99 }), forkd.InvalidArgument);
    await assert.rejects(other.dryRun([]), forkd.InvalidArgument);
    // Its model gets the Capacity tool only when asked for; the dry run after the batch
    // estimates an end from the runs that ended.
    assert.ok(!other.info.toolNames.includes("Capacity"));
    const sizing = await c.sessions.create({ system: "s", workspace: fresh.workspace, capacityTool: true });
    assert.ok(sizing.info.toolNames.includes("Capacity"));
    const later = await sizing.dryRun(["x"]);
    assert.equal(later.startInMs, 0);
    assert.ok(later.finishInMs !== undefined && later.estimateBasis.includes("median of the latest"), later.estimateBasis);
    await assert.rejects(other.dryRun(["x"], { outputSchema: { type: "objet" } }), forkd.InvalidArgument);
  } finally {
    c.close();
    fresh.stop();
  }
});

/** An HTTP server on loopback that takes a POST a secret it knows signed (200), and refuses any other (401). */
async function receiver() {
  const r = { secrets: [], verified: [], refused: [] };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (chunk) => chunks.push(chunk));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      for (const secret of r.secrets) {
        try {
          const payload = new Webhook(secret).verify(body, req.headers);
          r.verified.push({ path: req.url, id: req.headers["webhook-id"], headers: req.headers, body, payload });
          res.writeHead(200).end();
          return;
        } catch (e) {
          if (!(e instanceof WebhookVerificationError)) throw e;
        }
      }
      r.refused.push(req.headers["webhook-id"]);
      res.writeHead(401).end();
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  r.url = (path) => `http://127.0.0.1:${server.address().port}${path}`;
  r.close = () => new Promise((resolve) => server.close(resolve));
  return r;
}

async function eventually(check, within = 30_000) {
  const deadline = Date.now() + within;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("not within the time");
    await new Promise((r) => setTimeout(r, 50));
  }
}

const MISSING = "01a00000-0000-7000-8000-000000000000";

test("webhooks: a batch's notifications arrive signed once per child, pings, rotation, named batches", async () => {
  const hooked = new Daemon({ speed: "0", config: "[webhooks]\nallow_private = true\n" });
  await hooked.start();
  const r = await receiver();
  const c = new forkd.Client({ addr: hooked.addr });
  try {
    await assert.rejects(c.createWebhook("http://169.254.169.254/"), forkd.InvalidArgument);
    await assert.rejects(c.createWebhook(r.url("/"), { kinds: ["nope"] }), forkd.InvalidArgument);
    const created = await c.createWebhook(r.url("/all"), { kinds: ["fork"] });
    r.secrets.push(created.secret);
    const hook = created.webhook;
    assert.match(created.secret, /^whsec_/);
    assert.equal(hook.url, r.url("/all"));
    assert.deepEqual(hook.kinds, ["fork"]);
    assert.equal(hook.sessionId, undefined);
    assert.equal(hook.namedOnly, false);
    assert.ok(hook.createdAt instanceof Date && hook.createdAt <= new Date());
    assert.equal(hook.failingSince, undefined);
    assert.equal(hook.disabledReason, undefined);
    assert.deepEqual(await c.getWebhook(hook.webhookId), hook);
    assert.deepEqual(await c.listWebhooks(), [hook]);

    const session = await c.sessions.create({ system: "s", workspace: hooked.workspace });
    const batch = await session.fork(["One.\n@sim say one", "Two.\n@sim say two", "Three.\n@sim say 3"]);
    const done = new Map((await batch.wait({ signal: AbortSignal.timeout(60_000) })).map((n) => [n.agentId, n]));
    const mine = () => r.verified.filter((d) => d.payload.type === "notification" && d.payload.data.batch_id === batch.id);
    await eventually(() => mine().length >= batch.agentIds.length);
    await new Promise((resolve) => setTimeout(resolve, 300)); // nothing more comes: one per child
    const arrived = mine();
    assert.equal(arrived.length, batch.agentIds.length);
    assert.equal(new Set(arrived.map((d) => d.id)).size, arrived.length);
    assert.deepEqual(r.refused, []);
    for (const d of arrived) {
      assert.equal(d.path, "/all");
      assert.match(d.headers["content-type"], /^application\/json/);
      assert.match(d.payload.timestamp, /Z$/);
      const data = d.payload.data;
      const n = done.get(data.agent_id);
      assert.equal(data.seq, n.seq);
      assert.equal(data.session_id, session.id);
      assert.equal(data.kind, "fork");
      assert.equal(data.status, "completed");
      assert.equal(data.report.result, n.report.result);
      assert.ok("input_tokens" in data.usage && "output_tokens" in data.usage);
    }

    // The attempts as the daemon recorded them: each delivered, at its first try.
    const delivered = async () => (await c.webhookAttempts(hook.webhookId)).filter((a) => a.state === "delivered");
    await eventually(async () => (await delivered()).length === batch.agentIds.length);
    const attempts = await delivered();
    assert.deepEqual(new Set(attempts.map((a) => a.deliveryId)), new Set(arrived.map((d) => d.id)));
    assert.deepEqual(new Set(attempts.map((a) => a.notificationSeq)), new Set([...done.values()].map((n) => n.seq)));
    for (const a of attempts) {
      assert.equal(a.number, 1);
      assert.equal(a.status, 200);
      assert.equal(a.error, undefined);
      assert.equal(a.event, "notification");
      assert.ok(a.at instanceof Date);
    }
    assert.equal((await c.webhookAttempts(hook.webhookId, { limit: 1 })).length, 1);
    await assert.rejects(c.webhookAttempts(hook.webhookId, { limit: 0 }), RangeError);

    // A ping, taken now; then a rotated secret, the old one signing beside it.
    const ping = await c.testWebhook(hook.webhookId);
    assert.equal(ping.event, "ping");
    assert.equal(ping.status, 200);
    assert.equal(ping.error, undefined);
    assert.equal(ping.notificationSeq, undefined);
    assert.equal(ping.state, "delivered");
    const pinged = r.verified.find((d) => d.id === ping.deliveryId);
    assert.equal(pinged.payload.type, "ping");
    assert.deepEqual(pinged.payload.data, { webhook_id: hook.webhookId });
    const rotated = await c.rotateWebhookSecret(hook.webhookId);
    assert.match(rotated.secret, /^whsec_/);
    assert.notEqual(rotated.secret, created.secret);
    assert.equal(rotated.webhook.webhookId, hook.webhookId);
    assert.ok(rotated.webhook.previousSecretUntil instanceof Date);
    r.secrets.splice(0, r.secrets.length, rotated.secret);
    const again = await c.testWebhook(hook.webhookId);
    assert.equal(again.status, 200);
    const signed = r.verified.find((d) => d.id === again.deliveryId);
    new Webhook(created.secret).verify(signed.body, signed.headers);
    await c.deleteWebhook(hook.webhookId);
    await assert.rejects(c.getWebhook(hook.webhookId), forkd.NotFound);
    assert.deepEqual(await c.listWebhooks(), []);

    // A named_only webhook gets only the batches that name it.
    const named = await c.createWebhook(r.url("/named"), { namedOnly: true });
    r.secrets.push(named.secret);
    assert.equal(named.webhook.namedOnly, true);
    await (await session.fork(["Quiet.\n@sim say quiet"])).wait({ signal: AbortSignal.timeout(60_000) });
    assert.equal((await session.dryRun(["One."], { webhook: named.webhook })).children, 1);
    const naming = await session.fork(["One.\n@sim say one", "Two.\n@sim say two"], { webhook: named.webhook.webhookId });
    await naming.wait({ signal: AbortSignal.timeout(60_000) });
    const at = () => r.verified.filter((d) => d.path === "/named");
    await eventually(() => at().length >= 2);
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.deepEqual(at().map((d) => d.payload.data.agent_id).sort(), [...naming.agentIds].sort());

    // Missing ids are NotFound in every call, and as a batch's webhook.
    for (const call of [
      () => c.getWebhook(MISSING),
      () => c.deleteWebhook(MISSING),
      () => c.rotateWebhookSecret(MISSING),
      () => c.testWebhook(MISSING),
      () => c.webhookAttempts(MISSING),
      () => session.fork(["x"], { webhook: MISSING }),
    ]) {
      await assert.rejects(call(), forkd.NotFound);
    }
  } finally {
    c.close();
    await r.close();
    hooked.stop();
  }
});

test("webhooks and attempts are mapped from the daemon's answers, and their requests built here", async () => {
  const c = new forkd.Client({ addr: "unix:/nonexistent/forkd.sock", reconnectForMs: 100 });
  const sent = [];
  const answer = (reply) => (request, _metadata, _options, callback) => {
    sent.push(request);
    callback(null, reply);
    return { cancel() {} };
  };
  const at = (s) => new Date(s * 1000);
  const full = pb.Webhook.fromPartial({
    webhookId: "w",
    url: "https://ci.example.com/forkd",
    kinds: ["fork", "typed"],
    sessionId: "s",
    namedOnly: true,
    createdAt: at(1_700_000_000),
    failingSince: at(1_700_000_100),
    disabledReason: "failed every attempt for 5 days",
    disabledAt: at(1_700_000_200),
    previousSecretUntil: at(1_700_000_300),
  });
  c.stub.getWebhook = answer(pb.GetWebhookResponse.fromPartial({ webhook: full }));
  assert.deepEqual(await c.getWebhook("w"), {
    webhookId: "w",
    url: "https://ci.example.com/forkd",
    kinds: ["fork", "typed"],
    sessionId: "s",
    namedOnly: true,
    createdAt: at(1_700_000_000),
    failingSince: at(1_700_000_100),
    disabledReason: "failed every attempt for 5 days",
    disabledAt: at(1_700_000_200),
    previousSecretUntil: at(1_700_000_300),
  });
  c.stub.createWebhook = answer(
    pb.CreateWebhookResponse.fromPartial({ webhook: { webhookId: "w", url: "http://x/" }, secret: "whsec_x" }),
  );
  assert.deepEqual(await c.createWebhook("https://x/", { kinds: ["fork", "turn"], sessionId: "s", namedOnly: true }), {
    webhook: { webhookId: "w", url: "http://x/", kinds: [], namedOnly: false },
    secret: "whsec_x",
  });
  const request = { url: "https://x/", kinds: ["fork", "turn"], sessionId: "s", namedOnly: true };
  assert.deepEqual(sent.at(-1), pb.CreateWebhookRequest.fromPartial(request));
  await assert.rejects(c.createWebhook("https://x/", { kinds: "fork" }), TypeError);
  const taken = { deliveryId: "d", number: 2, at: at(1_700_000_000), status: 204, latencyMs: 12 };
  const delivered = { ...taken, event: "notification", notificationSeq: 7, state: "delivered" };
  const lost = { deliveryId: "p", number: 1, error: "connection refused", event: "ping", state: "failed" };
  c.stub.listWebhookAttempts = answer(pb.ListWebhookAttemptsResponse.fromPartial({ attempts: [delivered, lost] }));
  // No answer: no status; a ping: no seq.
  assert.deepEqual(await c.webhookAttempts("w", { limit: 5 }), [delivered, { ...lost, latencyMs: 0 }]);
  assert.equal(sent.at(-1).limit, 5);
  await c.webhookAttempts("w");
  assert.equal(sent.at(-1).limit, 0);
  await assert.rejects(c.webhookAttempts("w", { limit: 1.5 }), RangeError);
  c.close();
});

const BLOCK = { type: "command", command: "echo blocked-by-hook >&2; exit 2" };
const HOOKS = { hooks: { PreToolUse: [{ matcher: "Bash", hooks: [BLOCK] }] } };
const OUTSIDE = { hooks: { Stop: [{ hooks: [{ type: "command", command: "true", sandbox: false }] }] } };

/** The one run of BLOCK for the child's Bash call: denied, with what it wrote. */
function blocked(runs) {
  assert.equal(runs.length, 1, JSON.stringify(runs));
  const [run] = runs;
  assert.equal(run.event, "PreToolUse");
  assert.equal(run.toolName, "Bash");
  assert.ok(run.toolUseId?.startsWith("toolu_"), JSON.stringify(run));
  assert.equal(run.program, "echo");
  assert.equal(run.decision, "deny");
  assert.equal(run.exitCode, 2);
  assert.equal(run.output, "blocked-by-hook");
  assert.ok(run.startedAt instanceof Date && run.startedAt <= new Date(), String(run.startedAt));
  assert.ok(Number.isInteger(run.durationMs) && run.durationMs >= 0);
}

test("a session's own hooks run for its children, and one outside the sandbox is refused", async () => {
  const c = client();
  const session = await c.sessions.create({
    system: "s",
    workspace: daemon.workspace,
    permissionMode: "bypassPermissions",
    hooks: HOOKS,
  });
  assert.deepEqual(session.hookEvents, ["PreToolUse"]);
  assert.deepEqual((await c.sessions.get(session.id)).hookEvents, ["PreToolUse"]);
  const plain = await c.sessions.create({ system: "s", workspace: daemon.workspace });
  assert.deepEqual(plain.hookEvents, []);
  // The JSON text is sent as is.
  const text = await c.sessions.create({ system: "s", workspace: daemon.workspace, hooks: JSON.stringify(HOOKS) });
  assert.deepEqual(text.hookEvents, ["PreToolUse"]);

  const batch = await session.fork(['Go.\n@sim tool Bash {"command":"echo hi"}\n@sim say done']);
  const [n] = await batch.wait({ signal: AbortSignal.timeout(60_000) });
  assert.equal(n.status, "completed");
  const transcript = await (await c.agents.get(batch.agentIds[0])).transcript();
  const said = transcript.map((m) => m.contentJson).join("\n");
  assert.ok(said.includes("blocked-by-hook"), said);
  blocked(await (await c.agents.get(batch.agentIds[0])).hookRuns());
  // A session without hooks of its own: its child's runs are the operator's (none here).
  const bare = await c.sessions.create({ system: "s", workspace: daemon.workspace, permissionMode: "bypassPermissions" });
  const [quiet] = await (await bare.fork(['Go.\n@sim tool Bash {"command":"echo hi"}\n@sim say done'])).wait({
    signal: AbortSignal.timeout(60_000),
  });
  assert.equal(quiet.status, "completed");
  assert.deepEqual(await (await c.agents.get(quiet.agentId)).hookRuns(), []);

  const refused = await c.sessions
    .create({ system: "s", workspace: daemon.workspace, hooks: OUTSIDE })
    .then(() => undefined, (e) => e);
  assert.ok(refused instanceof forkd.InvalidArgument, String(refused));
  assert.match(refused.message, /sandbox/);
  await assert.rejects(c.sessions.create({ system: "s", workspace: daemon.workspace, hooks: "{not json" }), forkd.InvalidArgument);
  c.close();
});

test("hooks go in a session's request as the settings text, and a schedule's session has none", async () => {
  const c = new forkd.Client({ addr: "unix:/nonexistent/forkd.sock", reconnectForMs: 100 });
  const sent = [];
  c.stub.createSession = (request, _metadata, _options, callback) => {
    sent.push(request);
    callback(null, { session: pb.Session.fromPartial({ sessionId: "s", hookEvents: ["PreToolUse"] }) });
    return { cancel() {} };
  };
  const session = await c.sessions.create({ system: "s", hooks: HOOKS });
  assert.deepEqual(JSON.parse(sent.at(-1).hooksJson), HOOKS);
  assert.deepEqual(session.hookEvents, ["PreToolUse"]);
  await c.sessions.create({ system: "s", hooks: '{"hooks": {}}' });
  assert.equal(sent.at(-1).hooksJson, '{"hooks": {}}');
  await c.sessions.create({ system: "s" });
  assert.equal(sent.at(-1).hooksJson, "");
  await assert.rejects(c.sessions.create({ system: "s", hooks: [HOOKS] }), TypeError);
  await assert.rejects(c.sessions.create({ system: "s", hooks: 1 }), TypeError);
  await assert.rejects(
    c.createSchedule("n", { cron: "* * * * *", directives: ["x"], session: { hooks: HOOKS } }),
    /session has no hooks/,
  );
  c.close();
});

test("hook runs are mapped from the daemon's answer", async () => {
  const c = new forkd.Client({ addr: "unix:/nonexistent/forkd.sock", reconnectForMs: 100 });
  const sent = [];
  const at = new Date(1_700_000_000_005);
  c.stub.getTranscript = (request, _metadata, _options, callback) => {
    sent.push(request);
    callback(
      null,
      pb.GetTranscriptResponse.fromPartial({
        agentId: "a",
        hookRuns: [
          {
            event: "PreToolUse",
            toolUseId: "toolu_1",
            toolName: "Bash",
            program: "python3",
            exitCode: 0,
            decision: "allow",
            output: "ok",
            startedAt: at,
            durationMs: 31,
          },
          // Not about a tool call, killed before it exited: no tool, no exit code (0 is one).
          { event: "Stop", program: "sh", decision: "error" },
        ],
      }),
    );
    return { cancel() {} };
  };
  const agent = new forkd.Agent(c, pb.Agent.fromPartial({ agentId: "a" }));
  assert.deepEqual(await agent.hookRuns(), [
    {
      event: "PreToolUse",
      toolUseId: "toolu_1",
      toolName: "Bash",
      program: "python3",
      exitCode: 0,
      decision: "allow",
      output: "ok",
      startedAt: at,
      durationMs: 31,
    },
    { event: "Stop", program: "sh", decision: "error", output: "", durationMs: 0 },
  ]);
  assert.deepEqual(sent.at(-1), pb.GetTranscriptRequest.fromPartial({ agentId: "a" }));
  c.close();
});
