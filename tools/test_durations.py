"""Records how long each test file takes in each tier, for the order in which pytest-xdist hands files to workers
(tests/conftest.py: the longest first, so the last files to start are short and no worker waits on one long file
at the end).

    python -m pytest -q --junitxml=default.xml && python -m pytest -q -m slow --junitxml=slow.xml
    python tools/test_durations.py --default default.xml --slow slow.xml      # writes tests/durations.json

A file's figure is the sum of its tests' times (junit `time`, setup and teardown included), in seconds, rounded."""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "durations.json"


def file_seconds(junit: Path) -> dict[str, float]:
    """tests/<...>.py → summed seconds, from a junit XML file pytest wrote."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"error: {junit}: not a readable junit XML file ({e})", file=sys.stderr)
        raise SystemExit(2) from None
    out: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        parts = case.get("classname", "").split(".")
        while parts and parts[-1][:1].isupper():  # a test class: not part of the file's path
            parts.pop()
        if parts:
            out["/".join(parts) + ".py"] += float(case.get("time", 0) or 0)
    return {k: round(v, 1) for k, v in sorted(out.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--default", type=Path, required=True, help="junit XML of the default tier")
    ap.add_argument("--slow", type=Path, required=True, help="junit XML of the slow tier")
    ap.add_argument("--out", type=Path, default=OUT, help="where to write (default: tests/durations.json)")
    args = ap.parse_args(argv)
    record = {"default": file_seconds(args.default), "slow": file_seconds(args.slow)}
    if not record["default"] or not record["slow"]:
        print("error: a junit file holds no test: pass the files of a whole run of each tier", file=sys.stderr)
        return 2
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(args.out)  # whole or not at all
    print(f"wrote {args.out}: {len(record['default'])} default-tier and {len(record['slow'])} slow-tier files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
