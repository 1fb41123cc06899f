"""Forks N children on the daemon at ADDR and waits on them; prints how many completed and the
process's peak RSS. Usage: wait_many.py ADDR WORKSPACE N"""

from __future__ import annotations

import json
import resource
import sys

import forkd


def main() -> None:
    addr, workspace, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with forkd.Client(addr=addr) as client:
        session = client.sessions.create(system="s", workspace=workspace)
        batch = session.fork([f"Part {i}.\n@sim say part {i} done" for i in range(n)])
        completed = sum(n.status == "completed" for n in batch.notifications(timeout=600))
    # ru_maxrss is in KiB on Linux.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"completed": completed, "peak_rss_mib": round(peak, 1)}))


if __name__ == "__main__":
    main()
