// A real `forkd serve` for the tests: FORKD_BIN names the binary (the cargo test that runs these
// sets it), on a temporary home and socket; killed with SIGKILL and started again by the restart
// test.

import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Client } from "../dist/index.js";

const bin = process.env.FORKD_BIN;
if (!bin) throw new Error("set FORKD_BIN to the forkd binary (cargo test -p forkd --test typescript_client)");

export async function freePort() {
  return new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

export class Daemon {
  // `config`: its config.toml (written before it starts), e.g. `[webhooks]` settings.
  constructor({ speed = "1", listen, config } = {}) {
    this.root = mkdtempSync(join(tmpdir(), "forkd-ts-"));
    this.home = join(this.root, "home");
    // Beside the home, never in it: the home is never a workspace.
    this.workspace = join(this.root, "ws");
    mkdirSync(this.home);
    mkdirSync(this.workspace);
    if (config) writeFileSync(join(this.home, "config.toml"), config);
    this.speed = speed;
    this.listen = listen;
    this.process = undefined;
  }

  get addr() {
    return `unix:${join(this.home, "forkd.sock")}`;
  }

  async start() {
    const args = ["serve", "--sim-speed", this.speed, "--grace", "1s"];
    if (this.listen) args.push("--listen", this.listen);
    const env = { ...process.env, FORKD_HOME: this.home, RUST_LOG: "warn" };
    delete env.FORKD_ADDR;
    delete env.FORKD_TOKEN;
    this.process = spawn(bin, args, { env, stdio: "ignore" });
    // Waits until it answers: an unknown session is NOT_FOUND once it serves.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const client = new Client({ addr: this.addr });
      try {
        await client.sessions.get("01a00000-0000-7000-8000-000000000000");
        return;
      } catch (e) {
        if (e.name === "NotFound") return;
        if (e.name !== "Unavailable" || Date.now() > deadline) throw e;
      } finally {
        client.close();
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  kill9() {
    this.process?.kill("SIGKILL");
    this.process = undefined;
  }

  token(name) {
    const out = spawnSync(bin, ["token", "create", name], {
      env: { ...process.env, FORKD_HOME: this.home },
      encoding: "utf8",
    });
    if (out.status !== 0) throw new Error(out.stderr);
    return out.stdout.trim();
  }

  stop() {
    this.process?.kill("SIGTERM");
    this.process = undefined;
    rmSync(this.root, { recursive: true, force: true });
  }
}
