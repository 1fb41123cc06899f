// Schedules against a real daemon: a six-field schedule fires every two seconds, each firing a
// batch of its own; its next firing times; a trigger, pause and resume; the spec's options (limits,
// a webhook, an uploaded tree) carried into each firing; names taken, bad expressions and missing
// schedules refused by meaning. And, on requests caught before they leave, the daemon's answers
// mapped and the spec as the request carries it.

import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import * as pb from "../dist/gen/forkd/v1/forkd.js";
import * as forkd from "../dist/index.js";
import { Daemon } from "./daemon.mjs";

// Its webhooks may name loopback: a `namedOnly` one a spec names.
const daemon = new Daemon({ speed: "0", config: "[webhooks]\nallow_private = true\n" });
before(() => daemon.start());
after(() => daemon.stop());

const client = () => new forkd.Client({ addr: daemon.addr });

/** `check()`'s first value that is not undefined, within `ms`. */
async function eventually(check, ms = 20_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error("not within the time");
    await new Promise((r) => setTimeout(r, 100));
  }
}

const gaps = (times) => times.slice(1).map((t, i) => t.getTime() - times[i].getTime());

async function stored(c, batchId) {
  const out = [];
  for await (const n of c.notifications({ batchId, follow: false })) out.push(n);
  return out;
}

test("a six-field schedule fires every two seconds, a batch per firing; trigger, pause, resume, delete", async () => {
  const c = client();
  try {
    const spec = { cron: "*/2 * * * * *", session: { system: "s", workspace: daemon.workspace }, directives: ["Hi."] };
    const created = await c.createSchedule("every2", spec);
    assert.equal(created.name, "every2");
    assert.equal(created.cron, "*/2 * * * * *");
    assert.deepEqual([created.timezone, created.overlap, created.catchUp, created.paused], ["UTC", "skip", "once", false]);
    assert.equal(created.directives, 1);
    assert.equal(created.webhookId, undefined);
    assert.ok(created.createdAt instanceof Date && created.createdAt <= new Date());
    assert.equal(created.nextFires.length, 5);
    assert.deepEqual(gaps(created.nextFires), [2000, 2000, 2000, 2000]);

    const fired = await eventually(async () => {
      const firings = (await c.getSchedule("every2")).firings.filter((f) => f.state === "fired" && !f.manual);
      return firings.length >= 2 ? firings : undefined;
    });
    assert.equal(new Set(fired.map((f) => f.batchId)).size, fired.length);
    assert.equal(new Set(fired.map((f) => f.sessionId)).size, fired.length);
    for (const f of fired) {
      assert.ok(f.batchId && f.sessionId && f.reason === undefined, JSON.stringify(f));
      assert.equal(f.fireTime.getTime() % 2000, 0);
    }
    // Each firing's batch is an ordinary one: its child ends and reports.
    const batchId = fired.at(-1).batchId;
    const done = await eventually(async () => {
      const ended = await stored(c, batchId);
      return ended.length > 0 ? ended : undefined;
    });
    assert.deepEqual(done.map((n) => n.status), ["completed"]);
    const settled = await eventually(async () =>
      (await c.getSchedule("every2")).firings.find((f) => f.batchId === batchId && f.completed === 1),
    );
    assert.deepEqual([settled.children, settled.failed], [1, 0]);

    const got = await c.getSchedule("every2");
    assert.equal(got.nextFires.length, 5);
    assert.deepEqual(gaps(got.nextFires), [2000, 2000, 2000, 2000]);
    const times = got.firings.map((f) => f.fireTime.getTime());
    assert.deepEqual(times, [...times].sort((a, b) => b - a));
    const [listed] = (await c.listSchedules()).filter((s) => s.name === "every2");
    assert.equal(listed.cron, "*/2 * * * * *");
    assert.deepEqual([listed.nextFires, listed.firings], [[], []]);

    // A trigger fires now, outside the clock.
    const triggered = await c.triggerSchedule("every2");
    assert.deepEqual([triggered.state, triggered.manual], ["fired", true]);
    assert.ok(triggered.batchId && !fired.some((f) => f.batchId === triggered.batchId));
    assert.ok(triggered.sessionId && triggered.fireTime instanceof Date);

    // Paused: no next firing times; a trigger still fires; resumed: its times from now.
    const paused = await c.pauseSchedule("every2");
    assert.ok(paused.paused);
    assert.deepEqual(paused.nextFires, []);
    const pausedGot = await c.getSchedule("every2");
    assert.ok(pausedGot.paused);
    assert.deepEqual(pausedGot.nextFires, []);
    assert.ok(pausedGot.firings.some((f) => f.manual && f.batchId === triggered.batchId));
    assert.equal((await c.triggerSchedule("every2")).state, "fired");
    const resumed = await c.resumeSchedule("every2");
    assert.ok(!resumed.paused);
    assert.equal(resumed.nextFires.length, 5);
    assert.ok(resumed.nextFires[0].getTime() > Date.now() - 1000);

    // The name is taken; an expression, a zone or an overlap that does not parse; no directives.
    await assert.rejects(c.createSchedule("every2", spec), forkd.FailedPrecondition);
    await assert.rejects(c.createSchedule("bad-cron", { ...spec, cron: "not a cron" }), forkd.InvalidArgument);
    await assert.rejects(
      c.createSchedule("bad-zone", { ...spec, cron: "0 3 * * *", timezone: "Mars/Olympus" }),
      forkd.InvalidArgument,
    );
    await assert.rejects(c.createSchedule("bad-overlap", { ...spec, overlap: "sometimes" }), forkd.InvalidArgument);
    await assert.rejects(c.createSchedule("no-directives", { ...spec, directives: [] }), forkd.InvalidArgument);
    await assert.rejects(c.createSchedule("bad name!", spec), forkd.InvalidArgument);
    assert.deepEqual((await c.listSchedules()).map((s) => s.name), ["every2"]);

    await c.deleteSchedule("every2");
    await assert.rejects(c.getSchedule("every2"), forkd.NotFound);
    for (const call of [c.deleteSchedule, c.pauseSchedule, c.resumeSchedule, c.triggerSchedule]) {
      await assert.rejects(call.call(c, "every2"), forkd.NotFound);
    }
    assert.deepEqual(await c.listSchedules(), []);
  } finally {
    c.close();
  }
});

test("the spec carries the batch's options, a webhook and an uploaded tree into each firing", async () => {
  const c = client();
  try {
    const { webhook: hook } = await c.createWebhook("http://127.0.0.1:9/", { namedOnly: true });
    const created = await c.createSchedule("nightly", {
      cron: "0 3 * * 1-5",
      timezone: "Europe/Berlin",
      overlap: "allow",
      catchUp: "none",
      session: { system: "s", context: [["notes.md", "Be brief."]], workspace: daemon.workspace },
      directives: ["One.\n@sim say one", ["two", "Two.\n@sim say two", { maxTurns: 5 }]],
      maxTurns: 3,
      timeoutMs: 600_000,
      webhook: hook,
    });
    assert.deepEqual([created.timezone, created.overlap, created.catchUp], ["Europe/Berlin", "allow", "none"]);
    assert.deepEqual([created.directives, created.webhookId], [2, hook.webhookId]);
    const berlin = new Intl.DateTimeFormat("en-GB", {
      timeZone: "Europe/Berlin",
      weekday: "short",
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
      hourCycle: "h23",
    });
    for (const t of created.nextFires) {
      const [weekday, time] = berlin.format(t).split(" ");
      assert.ok(!["Sat", "Sun"].includes(weekday) && time === "03:00:00", berlin.format(t));
    }

    const firing = await c.triggerSchedule("nightly");
    assert.equal(firing.state, "fired", JSON.stringify(firing));
    const ended = await eventually(async () => {
      const ns = await stored(c, firing.batchId);
      return ns.length === 2 ? ns : undefined;
    });
    const agents = await Promise.all(ended.map((n) => c.agents.get(n.agentId)));
    const limits = Object.fromEntries(agents.map((a) => [a.info.description, a.limits]));
    assert.equal(limits["One."].maxTurns, 3);
    assert.equal(limits["One."].timeoutMs, 600_000);
    assert.equal(limits.two.maxTurns, 5);
    await c.deleteSchedule("nightly");
    await c.deleteWebhook(hook.webhookId);
    const missing = { cron: "0 3 * * *", session: { workspace: daemon.workspace }, directives: ["x"] };
    await assert.rejects(
      c.createSchedule("missing-hook", { ...missing, webhook: "01a00000-0000-7000-8000-000000000000" }),
      forkd.NotFound,
    );

    // A tree uploaded once, when the schedule is created: each firing's session starts from it.
    const tree = join(daemon.root, "tree");
    mkdirSync(tree);
    writeFileSync(join(tree, "README.md"), "# Uploaded\n");
    await c.createSchedule("uploaded", { cron: "0 3 * * *", session: { upload: tree }, directives: ["Hi."] });
    const uploaded = await c.triggerSchedule("uploaded");
    assert.equal(uploaded.state, "fired", JSON.stringify(uploaded));
    assert.ok((await c.sessions.get(uploaded.sessionId)).info.uploadOrigin?.uploadId);
    await c.deleteSchedule("uploaded");
  } finally {
    c.close();
  }
});

// Requests caught before they leave.

test("schedules and firings are mapped from the daemon's answers, and the spec built here", async () => {
  const c = new forkd.Client({ addr: "unix:/nonexistent/forkd.sock", reconnectForMs: 100 });
  const sent = [];
  const answer = (reply) => (request, _metadata, _options, callback) => {
    sent.push(request);
    callback(null, reply);
    return { cancel() {} };
  };
  const at = (s) => new Date(s * 1000);
  const raw = pb.Schedule.fromPartial({
    name: "nightly",
    cron: "0 3 * * 1-5",
    timezone: "Europe/Berlin",
    overlap: "skip",
    catchUp: "once",
    paused: true,
    createdAt: at(1_700_000_000),
    nextFires: [at(1_700_000_100), at(1_700_000_200)],
    firings: [
      {
        fireTime: at(1_700_000_050),
        state: "fired",
        sessionId: "s",
        batchId: "b",
        children: 3,
        completed: 2,
        failed: 1,
        costUsd: 0.25,
      },
      { fireTime: at(1_700_000_000), state: "skipped", manual: true, reason: "the previous firing's batch still runs" },
    ],
    directives: 3,
    webhookId: "w",
  });
  for (const method of ["getSchedule", "pauseSchedule", "resumeSchedule"]) {
    c.stub[method] = answer(pb.ScheduleResponse.fromPartial({ schedule: raw }));
  }
  const zeros = { children: 0, completed: 0, failed: 0, costUsd: 0 };
  const mapped = {
    name: "nightly",
    cron: "0 3 * * 1-5",
    timezone: "Europe/Berlin",
    overlap: "skip",
    catchUp: "once",
    paused: true,
    createdAt: at(1_700_000_000),
    directives: 3,
    webhookId: "w",
    nextFires: [at(1_700_000_100), at(1_700_000_200)],
    firings: [
      {
        fireTime: at(1_700_000_050),
        state: "fired",
        manual: false,
        sessionId: "s",
        batchId: "b",
        children: 3,
        completed: 2,
        failed: 1,
        costUsd: 0.25,
      },
      {
        fireTime: at(1_700_000_000),
        state: "skipped",
        manual: true,
        reason: "the previous firing's batch still runs",
        ...zeros,
      },
    ],
  };
  assert.deepEqual(await c.getSchedule("nightly"), mapped);
  assert.deepEqual(await c.pauseSchedule("nightly"), mapped);
  assert.deepEqual(await c.resumeSchedule("nightly"), mapped);
  c.stub.listSchedules = answer(pb.ListSchedulesResponse.fromPartial({ schedules: [{ name: "bare" }] }));
  assert.deepEqual(await c.listSchedules(), [
    {
      name: "bare",
      cron: "",
      timezone: "",
      overlap: "",
      catchUp: "",
      paused: false,
      directives: 0,
      nextFires: [],
      firings: [],
    },
  ]);
  c.stub.triggerSchedule = answer(
    pb.TriggerScheduleResponse.fromPartial({ firing: { state: "fired", manual: true, batchId: "b" } }),
  );
  assert.deepEqual(await c.triggerSchedule("nightly"), { state: "fired", manual: true, batchId: "b", ...zeros });
  c.stub.deleteSchedule = answer(pb.DeleteScheduleResponse.fromPartial({}));
  assert.equal(await c.deleteSchedule("nightly"), undefined);
  assert.deepEqual(
    sent.filter((r) => "name" in r).map((r) => r.name),
    Array(5).fill("nightly"),
  );
  await assert.rejects(c.getSchedule(7), TypeError);

  // The spec: a session and a batch, neither with an idempotency key; the batch with no session.
  c.stub.createSchedule = answer(pb.ScheduleResponse.fromPartial({ schedule: { name: "nightly" } }));
  sent.length = 0;
  await c.createSchedule("nightly", {
    cron: "0 3 * * 1-5",
    timezone: "Europe/Berlin",
    overlap: "allow",
    catchUp: "none",
    session: {
      system: "You are a reviewer.",
      context: [["notes.md", "Be brief."]],
      uploadId: "u",
      model: "m",
      allow: ["Read"],
      capacityTool: true,
    },
    directives: ["Review the API.", ["docs", "Review the docs.", { maxTurns: 4 }]],
    isolation: "copy",
    outputSchema: { type: "object", required: ["verdict"] },
    budgetUsd: 2.5,
    budgetTokens: 1000,
    maxTurns: 10,
    idleTimeoutMs: 90_000,
    webhook: { webhookId: "w", url: "http://x/", kinds: [], namedOnly: false },
  });
  const [request] = sent;
  assert.deepEqual(
    [request.name, request.cron, request.timezone, request.overlap, request.catchUp],
    ["nightly", "0 3 * * 1-5", "Europe/Berlin", "allow", "none"],
  );
  const { session, batch } = request.spec;
  assert.deepEqual(
    session,
    pb.CreateSessionRequest.fromPartial({
      systemPrompt: "You are a reviewer.",
      contextFiles: [{ path: "notes.md", content: "Be brief." }],
      uploadId: "u",
      model: "m",
      allowRules: ["Read"],
      capacityTool: true,
    }),
  );
  assert.deepEqual([batch.sessionId, batch.idempotencyKey, batch.dryRun, batch.atTurn], ["", "", false, undefined]);
  assert.deepEqual(
    batch.directives.map((d) => d.description),
    ["Review the API.", "docs"],
  );
  assert.equal(batch.directives[1].limits.maxTurns, 4);
  assert.deepEqual([batch.isolation, batch.budgetUsd, batch.budgetTokens], ["copy", 2.5, 1000]);
  assert.deepEqual(JSON.parse(batch.outputSchema), { type: "object", required: ["verdict"] });
  assert.deepEqual([batch.limits.maxTurns, batch.limits.idleTimeoutMs], [10, 90_000]);
  assert.equal(batch.webhookId, "w");
  // On the wire as the daemon reads it.
  const wire = pb.CreateScheduleRequest.decode(pb.CreateScheduleRequest.encode(request).finish());
  assert.equal(wire.spec.batch.directives.length, 2);

  // The defaults: empty strings the daemon reads as its defaults.
  await c.createSchedule("plain", { cron: "* * * * *", directives: ["x"] });
  const plain = sent.at(-1);
  assert.deepEqual([plain.timezone, plain.overlap, plain.catchUp], ["", "", ""]);
  assert.deepEqual(plain.spec.session, pb.CreateSessionRequest.fromPartial({}));
  assert.deepEqual([plain.spec.batch.limits, plain.spec.batch.webhookId], [undefined, ""]);

  // Refused before anything is sent.
  const base = { cron: "* * * * *", directives: ["x"] };
  await assert.rejects(c.createSchedule("x", { ...base, session: { idempotencyKey: "k" } }), /session has no idempotencyKey/);
  await assert.rejects(c.createSchedule("x", { ...base, session: { upload: ".", workspace: "/w" } }), /exclusive/);
  await assert.rejects(c.createSchedule("x", { ...base, directives: "Hi." }), TypeError);
  await assert.rejects(c.createSchedule("x", { ...base, maxTurns: 0 }), RangeError);
  await assert.rejects(c.createSchedule("x", { ...base, timezone: 1 }), TypeError);
  await assert.rejects(c.createSchedule("x", { ...base, webhook: 7 }), TypeError);
  assert.equal(sent.length, 2);
  c.close();
});
