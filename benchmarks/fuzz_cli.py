"""The adversarial CLI run of issue 17, counted: N hypothesis-drawn calls over every
command (tests/cli_fuzz.py), in this process, on one core; prints the calls per command
and outcome, every problem and every call slower than 30 s.

    python benchmarks/fuzz_cli.py --calls 10000 --seed 17 > fuzz.md

Outcomes: ok (exit 0), usage (2, one error line), oom (3), failed (1: out of
tolerance), internal (a fault of trainsim, one line), traceback, timeout (past
--timeout-s), bad-output (exit code, error lines or JSON wrong). The run's seed makes it
repeatable. Writes a progress line to stderr every 500 calls.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

KINDS = ("ok", "usage", "oom", "failed", "internal", "traceback", "timeout", "bad-output")


def main() -> None:
    """Parse the options, run the calls, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    options = parser.parse_args()

    from hypothesis import HealthCheck, Phase, given, seed, settings

    from cli_fuzz import COMMANDS, SLOW_S, calls_per_command, run
    from malformed_corpus import build_corpus

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    seconds: collections.Counter = collections.Counter()
    cpu: collections.Counter = collections.Counter()
    exit_codes: collections.Counter = collections.Counter()
    problems, slow = [], []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        paths = build_corpus(Path(scratch))
        os.chdir(scratch)  # relative outputs land in the scratch directory

        def call(args):
            outcome = run(args, timeout_s=options.timeout_s)
            counts[outcome.command][outcome.kind] += 1
            seconds[outcome.command] += outcome.seconds
            if outcome.problems or outcome.kind in ("internal", "traceback", "timeout"):
                problems.append((outcome.kind, args, outcome.problems,
                                 outcome.err.strip().splitlines()[-1:]))
            cpu[outcome.command] += outcome.cpu_seconds
            exit_codes[outcome.code] += 1
            if outcome.seconds > SLOW_S:
                slow.append((outcome.seconds, outcome.cpu_seconds, args))
            done = sum(sum(c.values()) for c in counts.values())
            if done % 500 == 0:
                print(f"# {done} calls, {time.perf_counter() - start:.0f} s", file=sys.stderr,
                      flush=True)

        # Each command on its own, in the proportions of cli_fuzz.COMMAND_SHARE (a draw
        # over all commands at once lets hypothesis dwell on the cheapest failures).
        per_command = calls_per_command(options.calls)
        for number, (name, strategy) in enumerate(COMMANDS.items()):
            examples = per_command[name]
            runner = seed(options.seed + number)(settings(
                max_examples=examples, deadline=None, database=None,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck))(
                given(strategy(paths))(call)))
            runner()
    total = collections.Counter()
    for c in counts.values():
        total.update(c)
    calls = sum(total.values())
    print(f"# trainsim CLI fuzz: {calls} calls, seed {options.seed}, "
          f"{time.perf_counter() - start:.0f} s\n")
    print("| command | calls | " + " | ".join(KINDS) + " | mean s | mean CPU s |")
    print("|---" * (len(KINDS) + 4) + "|")
    for command in sorted(counts):
        c = counts[command]
        n = sum(c.values())
        print(f"| {command} | {n} | " + " | ".join(str(c[k]) for k in KINDS)
              + f" | {seconds[command] / n:.3f} | {cpu[command] / n:.3f} |")
    print(f"| **all** | {calls} | " + " | ".join(str(total[k]) for k in KINDS) + " | | |")
    print("\nexit codes: " + ", ".join(f"{code} x {n}" for code, n in
                                       sorted(exit_codes.items(), key=str)))
    print(f"\n## calls over {SLOW_S:g} s (wall clock; CPU seconds of this process): "
          f"{len(slow)}")
    for took, cpu_s, args in sorted(slow, reverse=True):
        print(f"- {took:.1f} s ({cpu_s:.1f} s CPU): `trainsim {' '.join(args)}`")
    print(f"\n## problems: {len(problems)}")
    for kind, args, found, last in problems:
        print(f"- {kind}: `trainsim {' '.join(args)}` {found} {last}")


if __name__ == "__main__":
    main()
