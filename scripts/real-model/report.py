#!/usr/bin/env python3
"""The per-child table of scripts/real-model.sh.

Inputs (all written by the script into its work directory):
  scenarios.jsonl  one object per scenario: name, t_submit, t_done, and its children
                   [{agent_id, directive}] in submission order
  agents.jsonl     `forkctl --json ps -a`: forkd's own record of each agent's usage
  requests.jsonl   the timing proxy's record of every model request (timing_proxy.py)

Per child it prints the uncached input tokens and cache-read tokens forkd recorded, and three
times measured at the proxy between forkd and llama-server:

  ttft     time to first token of the request itself: from when llama-server's only slot could
           start on it (the request arrived and the previous response had ended) to its first
           event, which llama-server sends with the first generated token; prefill plus one
           token, without time spent queued behind a sibling
  first    from the batch's submission to the child's first token (gating, queueing and all)
  total    from the batch's submission to the end of the child's response
"""

import argparse
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--agents", required=True)
    parser.add_argument("--requests", required=True)
    parser.add_argument("--json", action="store_true", help="also print one JSON object per row")
    args = parser.parse_args()

    scenarios = load(args.scenarios)
    agents = {a["agent_id"]: a for a in load(args.agents)}
    requests = [
        r for r in load(args.requests) if r.get("t_first_event") is not None and r["status"] == 200
    ]

    # llama-server runs one slot: responses are produced one after another, in the order their
    # first events came back. A request's own work starts when it has arrived and the response
    # before it has ended.
    requests.sort(key=lambda r: r["t_first_event"])
    previous_end = 0.0
    for r in requests:
        r["t_start"] = max(r["t_request"], previous_end)
        previous_end = max(previous_end, r["t_end"])

    rows = []
    problems = []
    for scenario in scenarios:
        window = [
            r for r in requests if scenario["t_submit"] <= r["t_request"] <= scenario["t_done"]
        ]
        for i, child in enumerate(scenario["children"], start=1):
            mine = [r for r in window if r.get("directive") == child["directive"]]
            agent = agents.get(child["agent_id"], {})
            usage = agent.get("usage") or {}
            if not mine:
                problems.append(f"{scenario['name']} child {i}: no request seen")
                continue
            first = mine[0]
            last = mine[-1]
            proxy_usage = first.get("usage") or {}
            if len(mine) == 1 and (
                proxy_usage.get("input_tokens") != usage.get("input_tokens")
                or proxy_usage.get("cache_read_input_tokens", 0)
                != usage.get("cache_read_input_tokens")
            ):
                problems.append(
                    f"{scenario['name']} child {i}: forkd recorded {usage}, the server said "
                    f"{proxy_usage}"
                )
            rows.append(
                {
                    "scenario": scenario["name"],
                    "child": i,
                    "agent_id": child["agent_id"],
                    "state": agent.get("state"),
                    "requests": len(mine),
                    "uncached_input_tokens": usage.get("input_tokens"),
                    "cache_read_input_tokens": usage.get("cache_read_input_tokens"),
                    "output_tokens": usage.get("output_tokens"),
                    "ttft_ms": round((first["t_first_event"] - first["t_start"]) * 1000),
                    "first_token_ms": round((first["t_first_event"] - scenario["t_submit"]) * 1000),
                    "total_ms": round((last["t_end"] - scenario["t_submit"]) * 1000),
                    "model": first.get("model"),
                }
            )

    header = (
        "| scenario | child | uncached input | cache read | TTFT | first token after submit "
        "| total after submit |"
    )
    print(header)
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['scenario']} | {row['child']} | {row['uncached_input_tokens']} "
            f"| {row['cache_read_input_tokens']} | {row['ttft_ms'] / 1000:.2f} s "
            f"| {row['first_token_ms'] / 1000:.2f} s | {row['total_ms'] / 1000:.2f} s |"
        )
    print()
    for scenario in scenarios:
        mine = [r for r in rows if r["scenario"] == scenario["name"]]
        if not mine:
            continue
        print(
            f"{scenario['name']}: {sum(r['uncached_input_tokens'] or 0 for r in mine)} uncached "
            f"and {sum(r['cache_read_input_tokens'] or 0 for r in mine)} cache-read input tokens; "
            f"TTFT summed {sum(r['ttft_ms'] for r in mine) / 1000:.2f} s; all done after "
            f"{max(r['total_ms'] for r in mine) / 1000:.2f} s"
        )
    models = sorted({r["model"] for r in rows if r.get("model")})
    if models:
        print(f"the server answered as: {', '.join(models)}")
    if args.json:
        for row in rows:
            print(json.dumps(row))
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 1 if problems and not rows else 0


if __name__ == "__main__":
    sys.exit(main())
