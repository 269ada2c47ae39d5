#!/usr/bin/env python3
"""Watch latency, hive against etcd, over many alternating pairs (issue 34's measure).

Each pair runs `hive bench --phases watch` and `bench/etcd/run.sh` at one load, in
alternating order (hive first in odd pairs, etcd first in even ones), each side after a
warm-up run of its own whose numbers are not used. It prints each pair's p50 and p99 and
their ratios (hive / etcd), then the median ratio over the pairs with a 95% bootstrap
interval, so a goal like "p50 <= 0.8x etcd's" is stated with its spread, not by one pair.

    bench/watch-pairs.py --hive target/release/hive --pairs 12
    bench/watch-pairs.py --hive target/release/hive --pairs 4 --load 1000x10 --duration 10s

Needs what both benches need (see bench/etcd/run.sh); the etcd generator is built by
run.sh on its first use. Every run is bounded (--timeout), and a run that fails or loses
a delivery stops the series with its output.
"""

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# The delivery row: "... N of N deliveries; nothing lost   <p50> ms  <p99> ms ..."
ROW = re.compile(r"watch delivery, .*?deliveries; (nothing lost|.*?)\s{2,}([\d.]+) ms\s+([\d.]+) ms")


def run(command, timeout, env=None):
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        sys.exit(f"watch-pairs: {' '.join(command)} failed ({done.returncode}):\n{out}")
    found = ROW.search(out)
    if not found:
        sys.exit(f"watch-pairs: no watch delivery row in the output of {' '.join(command)}:\n{out}")
    if found.group(1) != "nothing lost":
        sys.exit(f"watch-pairs: deliveries were lost:\n{out}")
    return float(found.group(2)), float(found.group(3))


def interval(ratios, rounds=10000, seed=34):
    """The 2.5th and 97.5th percentiles of the median of resampled ratios."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return medians[int(rounds * 0.025)], medians[int(rounds * 0.975) - 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hive", required=True, help="the hive binary (a release build)")
    parser.add_argument("--pairs", type=int, default=12, help="how many pairs (default 12)")
    parser.add_argument("--load", default="100x1000", help="watchers x writes/s (default 100x1000)")
    parser.add_argument("--connections", type=int, default=16, help="watch connections on both sides")
    parser.add_argument("--duration", default="10s", help="each run's writing time (default 10s)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one run may take (default 300)")
    args = parser.parse_args()
    if args.pairs < 1 or not re.fullmatch(r"\d+x\d+", args.load):
        sys.exit("watch-pairs: --pairs is at least 1 and --load is WATCHERSxRATE, e.g. 100x1000")

    with tempfile.TemporaryDirectory(prefix="watch-pairs.") as scratch:
        hive = [args.hive, "bench", "--phases", "watch", "--watch-loads", args.load,
                "--watch-connections", str(args.connections), "--watch-duration", args.duration,
                "--dir", scratch]
        etcd = [os.path.join(HERE, "etcd", "run.sh"), "--clients", "1", "--duration", "1s",
                "--watch-duration", args.duration, "--watch-loads", args.load,
                "--watch-clients", str(args.connections)]
        sides = {"hive": hive, "etcd": etcd}
        rows = []
        print(f"{'pair':>4}  {'order':<9}  {'hive p50/p99 ms':>16}  {'etcd p50/p99 ms':>16}  p50 ratio  p99 ratio",
              flush=True)
        for pair in range(1, args.pairs + 1):
            order = ["hive", "etcd"] if pair % 2 else ["etcd", "hive"]
            got = {}
            for side in order:
                run(sides[side], args.timeout)  # the warm-up
                got[side] = run(sides[side], args.timeout)
            (hp50, hp99), (ep50, ep99) = got["hive"], got["etcd"]
            rows.append((hp50 / ep50, hp99 / ep99))
            print(f"{pair:>4}  {order[0] + ' first':<9}  {hp50:>7.2f} / {hp99:<6.2f}  {ep50:>7.2f} / {ep99:<6.2f}"
                  f"  {hp50 / ep50:>8.2f}x  {hp99 / ep99:>8.2f}x", flush=True)
        for name, index in (("p50", 0), ("p99", 1)):
            ratios = [row[index] for row in rows]
            low, high = interval(ratios)
            print(f"{name}: median ratio {statistics.median(ratios):.2f}x over {len(ratios)} pairs "
                  f"(95% bootstrap interval {low:.2f}-{high:.2f}x; range {min(ratios):.2f}-{max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
