"""zyre's elections with our node as a member, against the real zyre in network namespaces.

Four hosts on one bridge (namespaces with 10.x addresses, created here and deleted after).
Three zyres contest group ELG (``zyre_set_contest_in_group``); a fourth node joins first,
second, third or last (last: once the three have elected): our node, then, as the control,
a plain zyre (one that does not contest) in the same place. Counted per run: a *split* (two
nodes naming different leaders as their last report) and *agreement* (all four name the
same leader). Issue 35: never a split with our node, and agreement at least as often as
with the control (zyre alone sometimes leaves a late contester without a LEADER).

    python bench/zre_zyre_elections.py [--runs 32] [--json FILE] [--trace DIR]
    (root; zyre built: bench/README.md)

``--trace DIR`` records the bridge (bench/_zre_capture.py) and writes, for every run that
did not agree, ``DIR/run-N-FOURTH.txt``: each beacon, connect and ZRE command between the
four nodes on one clock, and what each node reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _zre_capture import BridgeCapture, decode, timeline  # noqa: E402

from tests.netns import make_hosts  # noqa: E402
from tests.zre_zyre_real import (  # noqa: E402
    SKIP_REASON,
    ElectionRun,
    election_run,
    zyre_peer_program,
)

POSITIONS = ("first", "second", "third", "last")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs with each fourth node")
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    parser.add_argument(
        "--trace", type=Path, default=None, help="capture the bridge; trace runs that split"
    )
    args = parser.parse_args()
    program = zyre_peer_program()
    if program is None:
        print(f"skipped: {SKIP_REASON}")
        return 0
    hosts = make_hosts(["n0", "n1", "n2", "n3"])
    tally: Counter[tuple[str, str]] = Counter()
    runs = []
    capture: BridgeCapture | None = None
    traced: list[tuple[str, float, float, ElectionRun]] = []
    try:
        if args.trace:
            args.trace.mkdir(parents=True, exist_ok=True)
            capture = BridgeCapture(hosts.switch, args.trace / "bridge.capture")
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(args.runs):
                position = n % 4
                for fourth in ("ours", "zyre"):
                    started = time.time()
                    run = election_run(program, hosts, fourth, position, Path(tmp))
                    verdict = "split" if run.split else "agreed" if run.agreed else "partial"
                    if capture is not None and verdict != "agreed":
                        traced.append((f"run-{n}-{fourth}", started, time.time(), run))
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
        if capture is not None:
            capture.stop()
        hosts.delete()
    if capture is not None and args.trace:
        _write_traces(args.trace, capture.path, hosts.addresses, traced)
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


def _write_traces(
    where: Path,
    capture: Path,
    addresses: dict[str, str],
    traced: list[tuple[str, float, float, ElectionRun]],
) -> None:
    events = decode(capture)
    hosts = {
        address: "fourth" if host == "n3" else f"zy{host[1:]}"
        for host, address in addresses.items()
    }
    for name, start, end, run in traced:
        nodes = {uuid.upper(): node for node, uuid in run.ids.items()}
        lines = timeline(events, start, end, hosts, nodes, run.reports)
        verdict = "split" if run.split else "partial"
        head = f"{name}: {POSITIONS[run.position]}, {verdict}; " + ", ".join(
            f"{node}={nodes.get(leader or '', '-')}" for node, leader in run.leaders.items()
        )
        (where / f"{name}.txt").write_text("\n".join([head, *lines]) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
