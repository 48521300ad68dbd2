"""Top functions of a py-spy `--format raw` profile (collapsed stacks: `f1;f2;...;fn COUNT`).

    python bench/profile_summary.py bench/results/X.pyspy.txt [--top 30] [--by file|function]

Self: samples where the function is the innermost frame. Total: samples where it is anywhere on
the stack (counted once per stack). Idle samples (the event loop waiting in epoll/select) are
reported apart so that percentages are of busy time.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

IDLE = re.compile(r"\b(select|poll|epoll_wait|_run_once \(uvloop|run_forever \(uvloop)")


def parse(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        stacks.append((stack.split(";"), int(count)))
    return stacks


def key(frame: str, by: str) -> str:
    # py-spy frames look like `function (path/to/file.py:123)`
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame
    func, file = m.groups()
    file = re.sub(r".*/site-packages/", "", file)
    file = re.sub(r".*/work/main/", "", file)
    file = re.sub(r".*/lib/python3\.\d+/", "stdlib/", file)
    if by == "package":
        parts = file.split("/")
        if parts[0] == "stdlib" and len(parts) > 1:
            return "stdlib/" + (parts[1] if len(parts) > 2 else parts[1].removesuffix(".py"))
        return parts[0].removesuffix(".py")
    return file if by == "file" else f"{func} ({file})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--by", choices=["function", "file", "package"], default="function")
    args = p.parse_args()
    stacks = parse(args.profile)
    total = sum(c for _, c in stacks)
    idle = sum(c for s, c in stacks if s and IDLE.search(s[-1]))
    busy = total - idle
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for frames, count in stacks:
        if frames and IDLE.search(frames[-1]):
            continue
        keys = [key(f, args.by) for f in frames]
        if keys:
            self_c[keys[-1]] += count
        for k in set(keys):
            incl[k] += count
    print(f"{args.profile.name}: {total} samples, {idle} idle "
          f"({100 * idle / max(total, 1):.0f}%), percentages of {busy} busy samples\n")
    print(f"top {args.top} by self time")
    print("| self % | total % | function |\n|---:|---:|---|")
    for k, c in self_c.most_common(args.top):
        print(f"| {100 * c / max(busy, 1):.1f} | {100 * incl[k] / max(busy, 1):.1f} | {k} |")
    print(f"\ntop {args.top} by total time")
    print("| total % | self % | function |\n|---:|---:|---|")
    for k, c in incl.most_common(args.top):
        print(f"| {100 * c / max(busy, 1):.1f} | {100 * self_c[k] / max(busy, 1):.1f} | {k} |")


if __name__ == "__main__":
    main()
