"""Tables 1–2 (+ IDBI) and one plot for several dynamic-corpora runs side by side.

    python tools/dynamic_report.py runs/dyn_bm25 runs/dyn_mdgr runs/dyn_pq --out runs/dynamic_report

Each argument is a MODEL_DIR of `python -m gr_jax.dynamic` (its dynamic/dynamic.json is read); writes
OUT/report.md and OUT/report.png and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gr_jax.cli import setup_logging
from gr_jax.io_utils import atomic_dir
from gr_jax.protocols.dynamic_corpora import plot, tables_markdown


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dirs", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    setup_logging()
    results = []
    for d in args.model_dirs:
        path = Path(d) / "dynamic" / "dynamic.json"
        try:
            result = json.loads(path.read_text())
            if not isinstance(result, dict) or not {"P", "method", "idbi", "initial_P_o0", "new_P_oo"} <= set(result):
                raise ValueError("fields P, method, idbi, initial_P_o0, new_P_oo missing")
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            sys.stderr.write(f"error: {path}: not a dynamic-corpora result ({e})\n")
            return 2
        results.append(result)
    if len({len(r["P"]) for r in results}) != 1:
        sys.stderr.write("error: the runs have different numbers of steps\n")
        return 2
    text = tables_markdown(results)
    try:
        with atomic_dir(args.out, keep_previous=True) as tmp:
            (tmp / "report.md").write_text(text)
            plot(results, tmp / "report.png")
    except OSError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
