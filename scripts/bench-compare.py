#!/usr/bin/env python3
"""Compares two sets of `scripts/bench.sh --json` runs: before and after a change.

Usage:
    scripts/bench-compare.py --before b1.json b2.json b3.json --after a1.json a2.json a3.json

For every check the benchmark judges (the last table of its report), it prints the verdicts of
each side's runs, the median of the measured figure (the first number of the check's
`measured` text) on each side, and after ÷ before. A check whose verdict is `met` in every run
before and `MISSED` in any run after is a flip; the script exits 1 when there is one. Latencies
are for a person to read against the ±10% the structural issues ask for: machines here are
shared, so the script reports the ratio and judges nothing on it.

Take both sides on the same machine, one after the other, with nothing else running: build each
tree's `forkd-bench` (bench.sh does), then run it three times.
"""

import argparse
import json
import re
import statistics
import sys

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
TIMING = re.compile(r"(^|\s)(p\d+ )?(ms|s)$|\bms\b|\bwall s\b")


def checks(path):
    """The checks of one run: figure name -> (verdict, first number measured or None)."""
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    found = {}
    for figure in run["figures"]:
        for check in figure.get("checks", []):
            match = NUMBER.search(check.get("measured", ""))
            value = float(match.group()) if match else None
            found[check["figure"]] = (check["verdict"], value, check.get("measured", ""))
    return found


def side(paths):
    """Every check over a side's runs: figure -> list of (verdict, value, measured)."""
    merged = {}
    for path in paths:
        for name, result in checks(path).items():
            merged.setdefault(name, []).append(result)
    return merged


def timings(path):
    """The timings of one run's tables: (figure, table, row, column) -> (label, seconds-or-ms).

    A timing is a cell under a header that names milliseconds or seconds (`p50 ms`, `wall s`);
    rows keep their order from run to run, so they pair by position."""
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    found = {}
    for figure in run["figures"]:
        for ti, table in enumerate(figure.get("tables", [])):
            headers = table["headers"]
            for ri, row in enumerate(table["rows"]):
                for ci, header in enumerate(headers):
                    if not TIMING.search(header) or ci >= len(row):
                        continue
                    match = NUMBER.fullmatch(row[ci].strip())
                    if not match:
                        continue
                    # Rows named by their first cells; a row of numbers only by its table.
                    label = " / ".join(c for c in row[:2] if not NUMBER.fullmatch(c.strip()))
                    if not label:
                        caption = table.get("caption", "")
                        label = f"{caption[:48]}… row {ri + 1}" if caption else f"row {ri + 1}"
                    label = f"{figure['id']}: {label} — {header}"
                    found[(figure["id"], ti, ri, ci)] = (label, float(match.group()))
    return found


def short(verdict):
    """`met`, `MISSED` or `n/a`: the report's verdict is `"met"`, `{"missed": why}` or
    `{"not_applicable": why}`."""
    if verdict == "met":
        return "met"
    if isinstance(verdict, dict) and "missed" in verdict:
        return "MISSED"
    return "n/a"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", required=True, metavar="JSON")
    parser.add_argument("--after", nargs="+", required=True, metavar="JSON")
    args = parser.parse_args()
    before, after = side(args.before), side(args.after)

    print(f"Before: {len(args.before)} runs; after: {len(args.after)} runs. Medians of each side.")
    print()
    print("| check | verdicts before | verdicts after | median before | median after | after ÷ before |")
    print("|---|---|---|---|---|---|")
    flips = []
    for name in list(before) + [n for n in after if n not in before]:
        b, a = before.get(name, []), after.get(name, [])
        vb = ", ".join(short(v) for v, _, _ in b) or "—"
        va = ", ".join(short(v) for v, _, _ in a) or "—"
        nb = [x for _, x, _ in b if x is not None]
        na = [x for _, x, _ in a if x is not None]
        mb = statistics.median(nb) if nb else None
        ma = statistics.median(na) if na else None
        ratio = f"{ma / mb:.3f}" if mb and ma is not None else "—"
        fmt = lambda x: "—" if x is None else f"{x:g}"
        print(f"| {name} | {vb} | {va} | {fmt(mb)} | {fmt(ma)} | {ratio} |")
        if b and all(short(v) == "met" for v, _, _ in b) and any(short(v) == "MISSED" for v, _, _ in a):
            flips.append(name)
    print()
    print("Timings (every table cell under a header in ms or s), medians; beyond ±10% marked:")
    print()
    print("| timing | median before | median after | after ÷ before |")
    print("|---|---|---|---|")
    tb, ta = {}, {}
    for paths, into in ((args.before, tb), (args.after, ta)):
        for path in paths:
            for key, (label, value) in timings(path).items():
                into.setdefault(key, (label, []))[1].append(value)
    for key, (label, values) in tb.items():
        if key not in ta:
            continue
        mb, ma = statistics.median(values), statistics.median(ta[key][1])
        if mb == 0:
            continue
        ratio = ma / mb
        mark = " **" if abs(ratio - 1) > 0.10 else ""
        print(f"| {label} | {mb:g} | {ma:g} | {ratio:.3f}{mark} |")
    print()
    if flips:
        print("Verdicts that flipped to MISSED: " + "; ".join(flips))
        return 1
    print("No verdict flipped to MISSED.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
