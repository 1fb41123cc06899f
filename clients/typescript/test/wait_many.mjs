// Forks N children on the daemon at ADDR and waits on them; prints how many completed and the
// process's peak RSS. Usage: node wait_many.mjs ADDR WORKSPACE N

import { resourceUsage } from "node:process";

import { Client } from "../dist/index.js";

const [addr, workspace, n] = process.argv.slice(2);
const client = new Client({ addr });
const session = await client.sessions.create({ system: "s", workspace });
const batch = await session.fork(Array.from({ length: Number(n) }, (_, i) => `Part ${i}.\n@sim say part ${i} done`));
let completed = 0;
for await (const note of batch.notifications({ signal: AbortSignal.timeout(600_000) })) {
  if (note.status === "completed") completed += 1;
}
client.close();
// maxRSS is in KiB.
console.log(JSON.stringify({ completed, peakRssMiB: Math.round(resourceUsage().maxRSS / 102.4) / 10 }));
