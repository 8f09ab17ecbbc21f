"""Same-run A/B: one benchmark, two revisions' code, alternated run by run on this machine.

    python bench/ab.py --base main [--head REV] [--runs 3] [--venvs] BENCH [BENCH's options]

    python bench/ab.py --base cb146d2 eventbus_throughput --events 100000 --repeat 1
    python bench/ab.py --base main zre_mesh --idle 1 --rounds 3

* ``--base`` (and ``--head``, when given) are checked out into temporary git worktrees;
  without ``--head`` the head is this checkout as it is, uncommitted changes included.
* The benchmark script and its load generators (raw pyzmq workers) are this checkout's, the
  same for both sides: only the code under test changes. Each run gets ``BENCH_CODE`` = its
  side's tree, which bench/_common.py puts first on the path of the benchmark (for what it
  runs in-process) and of every server it starts.
* Runs alternate A B B A A B ... (``--runs`` per side), so drift on a shared machine falls on
  both sides alike. Before each run it waits (up to ``--wait-idle`` s) for other processes to
  leave the CPUs, and it says how many cores they kept busy during each run: compare only
  runs whose noise is near 0.
* Both sides use this interpreter's packages unless ``--venvs``: then each revision gets a
  venv of its own (``pip install -e`` of its tree), for when their dependencies differ.
  Either way each side's compiled code (the transport's C helper) is built in its tree
  first, as an install would build it.

For each figure the benchmark reports (bench/_common.py ``summary(figures=...)``) it prints
each side's median and range, head/base, and whether the ranges are apart ("head better",
"head worse") or overlap ("within the spread"). Every change to a hot path records this
against main, for each protocol's main benchmark (bench/README.md says which).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import HERE, CpuAccount, describe_machine, machine, wait_for_quiet

REPO = HERE.parent


@dataclass
class Side:
    label: str
    revision: str
    tree: Path
    python: str = sys.executable
    runs: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.label} {self.revision}"


def git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ab: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def worktree(revision: str, where: Path) -> Iterator[Path]:
    git("worktree", "add", "--quiet", "--detach", str(where), revision)
    try:
        yield where
    finally:
        git("worktree", "remove", "--force", str(where))


def describe_revision(revision: str) -> str:
    short = git("rev-parse", "--short", revision)
    return short if revision.startswith(short) else f"{short} ({revision})"


def build_in_place(side: Side) -> None:
    """Build the side's compiled code in its tree (the transport's C helper), as its install
    would: a worktree has only the sources, and a side without its helper would measure
    the pure-Python fallback. A revision without setup.py has nothing to build; where
    nothing can be built (no compiler), both sides run without it."""
    if not (side.tree / "setup.py").is_file():
        return
    done = subprocess.run(
        [side.python, "setup.py", "--quiet", "build_ext", "--inplace"],
        cwd=side.tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:  # no compiler here: then neither side has it
        print(f"ab: {side.describe()} runs without its C helper (build_ext failed)", flush=True)


def build_venv(side: Side, where: Path) -> None:
    print(f"ab: building a venv for {side.describe()} (pip install -e) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = str(where / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "-e", str(side.tree)],
        check=True,
    )
    side.python = python


def bench_path(name: str) -> Path:
    for candidate in (Path(name), HERE / name, HERE / f"{name}.py"):
        if candidate.is_file():
            return candidate.resolve()
    raise SystemExit(f"ab: no benchmark {name!r} (a file, or a name in {HERE})")


def run_once(side: Side, bench: Path, args: list[str], work: Path, index: int) -> dict[str, Any]:
    out = work / f"run{index}-{side.label}.json"
    log = work / f"run{index}-{side.label}.log"
    env = dict(os.environ, BENCH_CODE=str(side.tree), PYTHONUNBUFFERED="1")
    account = CpuAccount()
    with open(log, "wb") as sink:
        code = subprocess.run(
            [side.python, str(bench), *args, "--json", str(out)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            check=False,
        ).returncode
    noise = account.stop()
    # A benchmark exits 1 on a MISS against its target: still a measurement.
    if not out.exists():
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-30:])
        raise SystemExit(f"ab: {side.describe()} run {index} failed (exit {code}):\n{tail}")
    result: dict[str, Any] = json.loads(out.read_text())
    if not result.get("figures"):
        raise SystemExit(f"ab: {bench.name} reports no figures (summary(figures=...))")
    if Path(result.get("code", "")).resolve() != side.tree.resolve():
        raise SystemExit(f"ab: {bench.name} ran {result.get('code')}, not {side.tree}")
    result["exit_code"] = code
    result["noise_cores"] = noise
    result["wall_s"] = account.wall
    return result


def order(runs: int) -> list[int]:
    """0 = base, 1 = head: A B B A A B ... (each side first as often as the other)."""
    return [side for n in range(runs) for side in ((0, 1) if n % 2 == 0 else (1, 0))]


def compare(base: Side, head: Side) -> list[dict[str, Any]]:
    rows = []
    for key, first in base.runs[0]["figures"].items():
        values = {
            side.label: [run["figures"][key]["value"] for run in side.runs if key in run["figures"]]
            for side in (base, head)
        }
        if not values["base"] or not values["head"]:
            continue
        b, h = statistics.median(values["base"]), statistics.median(values["head"])
        higher = first.get("better", "higher") == "higher"
        if len(values["base"]) < 2 or len(values["head"]) < 2:
            verdict = "one run: no spread to judge by"
        elif min(values["head"]) > max(values["base"]):
            verdict = "head better" if higher else "head worse"
        elif max(values["head"]) < min(values["base"]):
            verdict = "head worse" if higher else "head better"
        else:
            verdict = "within the spread"
        rows.append(
            {
                "figure": key,
                "unit": first.get("unit", ""),
                "better": "higher" if higher else "lower",
                "base": values["base"],
                "head": values["head"],
                "base_median": b,
                "head_median": h,
                "ratio": h / b if b else float("nan"),
                "verdict": verdict,
            }
        )
    return rows


def number(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def report(
    bench: Path, args: list[str], base: Side, head: Side, rows: list[dict[str, Any]]
) -> None:
    lines = [
        ("command", " ".join(["bench/ab.py", *sys.argv[1:]])),
        ("machine", describe_machine(machine())),
        ("base", base.describe()),
        ("head", head.describe()),
        ("runs", f"{len(base.runs)} per side, alternated; options: {' '.join(args) or '-'}"),
    ]
    for row in rows:
        lines.append(
            (
                row["figure"],
                f"head/base {row['ratio']:.3f} ({row['better']} is better) -> {row['verdict']}; "
                f"base {number(row['base_median'])} [{number(min(row['base']))}-"
                f"{number(max(row['base']))}], head {number(row['head_median'])} "
                f"[{number(min(row['head']))}-{number(max(row['head']))}] {row['unit']}",
            )
        )
    noise = ", ".join(
        f"{side.label} {run['noise_cores']:.2f}" for side in (base, head) for run in side.runs
    )
    lines.append(("noise", f"other processes kept {noise} cores busy during the runs"))
    width = max(len(label) for label, _ in lines)
    print()
    print(f" A/B: {bench.stem} ".center(78, "="))
    for label, value in lines:
        print(f"{label:<{width}} : {value}")
    print("=" * 78)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="bench/ab.py --base REV [--head REV] [--runs N] [--venvs] BENCH [BENCH options]",
    )
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--head", default=None, help="default: this checkout as it is")
    parser.add_argument("--runs", type=int, default=3, help="runs per side (default 3)")
    parser.add_argument("--venvs", action="store_true", help="a venv per revision")
    parser.add_argument("--wait-idle", type=float, default=30.0, help="seconds, before each run")
    parser.add_argument("--json", default=None, help="also write the comparison here")
    parser.add_argument("bench", help="a benchmark in bench/, e.g. eventbus_throughput")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    bench = bench_path(options.bench)
    args = [a for a in options.bench_args if a != "--"]
    if "--json" in args:
        parser.error("the benchmark's --json is ab's to set")
    with (
        tempfile.TemporaryDirectory(prefix="bus-ab-") as temporary,
        contextlib.ExitStack() as stack,
    ):
        work = Path(temporary)
        base_tree = stack.enter_context(worktree(options.base, work / "base"))
        base = Side("base", describe_revision(options.base), base_tree)
        if options.head is None:
            dirty = " + uncommitted changes" if git("status", "--porcelain", "--", "bus") else ""
            head = Side("head", f"{describe_revision('HEAD')}, this checkout{dirty}", REPO)
        else:
            head_tree = stack.enter_context(worktree(options.head, work / "head"))
            head = Side("head", describe_revision(options.head), head_tree)
        if options.venvs:
            build_venv(base, work / "venv-base")
            build_venv(head, work / "venv-head")
        sides = (base, head)
        for side in sides:
            build_in_place(side)
        plan = order(options.runs)
        started = time.monotonic()
        for index, which in enumerate(plan, 1):
            side = sides[which]
            if options.wait_idle > 0:
                wait_for_quiet(options.wait_idle)
            result = run_once(side, bench, args, work, index)
            side.runs.append(result)
            shown = ", ".join(
                f"{key} {number(f['value'])} {f['unit']}" for key, f in result["figures"].items()
            )
            print(
                f"ab: run {index}/{len(plan)} {side.describe()}: {shown} "
                f"(noise {result['noise_cores']:.2f} cores, {result['wall_s']:.0f} s; "
                f"{time.monotonic() - started:.0f} s so far)",
                flush=True,
            )
        rows = compare(base, head)
        report(bench, args, base, head, rows)
        if options.json:
            Path(options.json).write_text(
                json.dumps(
                    {
                        "bench": bench.stem,
                        "args": args,
                        "base": {"revision": base.revision, "runs": base.runs},
                        "head": {"revision": head.revision, "runs": head.runs},
                        "figures": rows,
                    },
                    indent=1,
                    default=str,
                )
                + "\n"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
