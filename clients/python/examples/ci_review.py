"""What `forkctl run review.yaml --wait --junit review.xml` does, in Python: one session over the
repository, one child per review, a JUnit report, exit 1 unless every child completed.

    FORKD_ADDR=https://forkd.example:7070 FORKD_TOKEN=... python ci_review.py review.xml
"""

import os
import sys
import xml.etree.ElementTree as ET

import forkd

REVIEWS = {
    "api": "Review the public API in src/ for breaking changes.",
    "docs": "Check the README against the code; list what is wrong.",
    "tests": "Find code paths in src/ that no test covers.",
}

with forkd.Client() as client:
    session = client.sessions.create(
        system="You review this repository. Be specific: name files and lines.",
        context=["README.md", "ARCHITECTURE.md"],
        workspace=os.getcwd(),
        idempotency_key=f"review-{os.environ.get('CI_COMMIT_SHA', 'local')}",
    )
    batch = session.fork(REVIEWS.items(), budget_usd=2.0)
    names = dict(zip(batch.agent_ids, REVIEWS, strict=True))
    suite = ET.Element("testsuite", name="forkd review", tests=str(len(REVIEWS)))
    failed = 0
    for n in batch.notifications(timeout=1800):
        case = ET.SubElement(suite, "testcase", classname="review", name=names[n.agent_id])
        ET.SubElement(case, "system-out").text = n.report.result
        print(f"{names[n.agent_id]}: {n.status} (${n.cost_usd:.4f})")
        if n.status != "completed":
            failed += 1
            ET.SubElement(case, "failure", message=n.status).text = n.report.issues
    suite.set("failures", str(failed))
    ET.ElementTree(suite).write(sys.argv[1] if len(sys.argv) > 1 else "review.xml")
    sys.exit(1 if failed else 0)
