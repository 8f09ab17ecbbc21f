"""zyre's elections with our node as a member, against the real zyre in network namespaces.

Four hosts on one bridge (namespaces with 10.x addresses, created here and deleted after).
Three zyres contest group ELG (``zyre_set_contest_in_group``); a fourth node joins first,
second, third or last (last: once the three have elected): our node, then, as the control,
a plain zyre (one that does not contest) in the same place. Counted per run: a *split* (two
nodes naming different leaders as their last report) and *agreement* (all four name the
same leader). Issue 35: never a split with our node, and agreement at least as often as
with the control (zyre alone sometimes leaves a late contester without a LEADER).

    python bench/zre_zyre_elections.py [--runs 32]   (root; zyre built: bench/README.md)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.netns import make_hosts  # noqa: E402
from tests.zre_zyre_real import SKIP_REASON, election_run, zyre_peer_program  # noqa: E402

POSITIONS = ("first", "second", "third", "last")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs with each fourth node")
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    args = parser.parse_args()
    program = zyre_peer_program()
    if program is None:
        print(f"skipped: {SKIP_REASON}")
        return 0
    hosts = make_hosts(["n0", "n1", "n2", "n3"])
    tally: Counter[tuple[str, str]] = Counter()
    runs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(args.runs):
                position = n % 4
                for fourth in ("ours", "zyre"):
                    run = election_run(program, hosts, fourth, position, Path(tmp))
                    verdict = "split" if run.split else "agreed" if run.agreed else "partial"
                    tally[(fourth, verdict)] += 1
                    runs.append(
                        {"run": n, "position": POSITIONS[position], "fourth": fourth}
                        | {"leaders": run.leaders, "verdict": verdict}
                    )
                    print(
                        f"run {n:2d} {POSITIONS[position]:6s} {fourth:4s} {verdict:7s} "
                        + " ".join(f"{k}={(v or '-')[:6]}" for k, v in run.leaders.items()),
                        flush=True,
                    )
    finally:
        hosts.delete()
    for fourth in ("ours", "zyre"):
        total = sum(tally[(fourth, v)] for v in ("agreed", "partial", "split"))
        print(
            f"{fourth} as the fourth: {total} runs, agreed {tally[(fourth, 'agreed')]}, "
            f"partial {tally[(fourth, 'partial')]}, split {tally[(fourth, 'split')]}"
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    ok = tally[("ours", "split")] == 0 and tally[("ours", "agreed")] >= tally[("zyre", "agreed")]
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
