// A GitHub Actions step: one reviewer per changed file, forked from one session over the
// repository (so every child reads the shared context from the provider's cache), each ending
// with a verdict; the job fails on any `fail`.
//
//   - run: node clients/typescript/examples/review-action.mjs origin/main
//     env: { FORKD_ADDR: "https://forkd.example:7070", FORKD_TOKEN: "${{ secrets.FORKD_TOKEN }}" }

import { execFileSync } from "node:child_process";

import { Client } from "@forkd/client";

const base = process.argv[2] ?? "origin/main";
const changed = execFileSync("git", ["diff", "--name-only", `${base}...HEAD`], { encoding: "utf8" })
  .split("\n")
  .filter(Boolean);
if (changed.length === 0) process.exit(0);

const verdict = {
  type: "object",
  required: ["verdict", "findings"],
  properties: { verdict: { enum: ["pass", "fail"] }, findings: { type: "array", items: { type: "string" } } },
};
const client = new Client();
const session = await client.sessions.create({
  system: "You review one file of a change. Fail it only for a real defect; name the lines.",
  context: ["README.md"],
  upload: ".",
  idempotencyKey: `review-${process.env.GITHUB_SHA ?? "local"}`,
});
const batch = await session.fork(
  changed.map((file) => [file, `Review ${file} as changed since ${base}.`]),
  { outputSchema: verdict, budgetUsd: 2 },
);
let failed = 0;
for await (const n of batch.notifications({ signal: AbortSignal.timeout(30 * 60_000) })) {
  const file = changed[batch.agentIds.indexOf(n.agentId)];
  const result = n.report.structured;
  console.log(`${file}: ${n.status} ${result?.verdict ?? ""} ${(result?.findings ?? []).join("; ")}`);
  if (n.status !== "completed" || result?.verdict === "fail") failed += 1;
}
client.close();
process.exit(failed ? 1 : 0);
