"""How fast a new ZRE peer is discovered, over real UDP broadcast in network namespaces.

Two namespaces joined by a veth pair with 10.x addresses (created here and deleted after;
nothing is broadcast on the machine's real interfaces). A node runs in namespace A; a new
node starts in namespace B; measured: from the new node's READY line (printed once it has
started and sent its first beacon) to the ENTER line of the other node (beacon received,
DEALER connected, HELLO received), both stamped as they arrive at this script.

* ours -> pyre: our node (tests/zre_peers/bus_peer.py) is new, pyre (zeromq-pyre 0.3.4)
  sees it enter; * pyre -> ours: the reverse; * baseline pyre -> pyre.

    python bench/zre_discovery.py [--rounds 5]     (root: creates network namespaces)

Target (issue 10): a new peer discovered in under 100 ms (pyre takes 2-6 ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from _common import machine, summary

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.netns import LinePeer, NamespacePair  # noqa: E402

PEERS = ROOT / "tests" / "zre_peers"


def start(kind: str, ns: str, name: str, iface: str, log: Path) -> LinePeer:
    if kind == "bus":
        argv = [sys.executable, str(PEERS / "bus_peer.py"), name, "5670", iface, json.dumps({})]
    else:
        argv = [sys.executable, str(PEERS / "pyre_peer.py"), name, "5670"]
    return LinePeer(argv, log / f"{name}.log", ns)


def discovery(pair: NamespacePair, old: str, new: str, log: Path) -> float:
    """Seconds from the new node's READY to the old node's ENTER for it."""
    first = start(old, pair.a, f"old-{old}", pair.iface_a, log)
    try:
        first.ready  # noqa: B018
        second = start(new, pair.b, f"new-{new}", pair.iface_b, log)
        try:
            ready = second.ready
            enter = first.wait_for("ENTER", ready["peer"], timeout=20)
            return first.arrival(enter) - second.arrival(ready)
        finally:
            second.stop()
    finally:
        first.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    info = machine()
    results: dict[str, list[float]] = {
        "bus->pyre": [],
        "pyre->bus": [],
        "pyre->pyre": [],
        "bus->bus": [],
    }
    pair = NamespacePair()
    pair.create()
    try:
        with tempfile.TemporaryDirectory(prefix="zre-discovery-") as tmp:
            for _ in range(args.rounds):
                for label in results:
                    new, old = label.split("->")
                    results[label].append(discovery(pair, old, new, Path(tmp)))
    finally:
        pair.delete()
    ms = {label: statistics.median(values) * 1000 for label, values in results.items()}
    worst = max(max(results["bus->pyre"]), max(results["pyre->bus"]), max(results["bus->bus"]))
    summary(
        "ZRE discovery of a new peer (network namespaces, veth, UDP broadcast)",
        info,
        measured=(
            f"median: our new node seen by pyre {ms['bus->pyre']:.1f} ms; a new pyre seen by "
            f"ours {ms['pyre->bus']:.1f} ms; ours by ours {ms['bus->bus']:.1f} ms "
            f"(worst {worst * 1000:.1f} ms over {args.rounds} rounds)"
        ),
        baseline=f"pyre seen by pyre: median {ms['pyre->pyre']:.1f} ms",
        ratio=(
            f"pyre->ours x{ms['pyre->bus'] / ms['pyre->pyre']:.1f}, ours->pyre "
            f"x{ms['bus->pyre'] / ms['pyre->pyre']:.1f} of pyre->pyre"
        ),
        target="a new peer discovered in < 100 ms",
        verdict=worst < 0.1,
        json_path=args.json,
        record={"seconds": results},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
