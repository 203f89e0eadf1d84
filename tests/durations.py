"""Writes tests/durations.json, each test file's seconds, from pytest JUnit XML reports.

``make test`` hands the heaviest files out first (tests/conftest.py), so that no worker is
left with a long file while the other idles. Refresh after large test changes:

  EMBEDDING_JAX_TESTS=single pytest -n 2 --dist loadfile --junitxml=/tmp/s.xml tests
  EMBEDDING_JAX_TESTS=mesh pytest -n 2 --dist loadfile --junitxml=/tmp/m.xml tests
  python tests/durations.py /tmp/s.xml /tmp/m.xml
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).with_name("durations.json")


def main(reports: list[str]) -> None:
    seconds: collections.Counter = collections.Counter()
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            seconds[case.get("classname").replace(".", "/") + ".py"] += float(case.get("time"))
    OUT.write_text(json.dumps({f: round(s) for f, s in seconds.most_common() if s >= 1},
                              indent=0) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
