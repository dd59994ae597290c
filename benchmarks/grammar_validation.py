"""How grammar validation scales with the size of an argument grid (it must be linear).

    python benchmarks/grammar_validation.py [--sizes 5 10 20 25 40]

For each n, a grammar with one operation call whose three independent axes have n values each
(n³ grid points, each checked by the operation's argument rules and for duplicates) is parsed
and validated; printed per size: grid points, the fastest of 3 parses, and the time per grid
point relative to the smallest grid, measured in the same run. Linear validation keeps that
ratio near 1 (fixed costs make it fall for small grids); the quadratic duplicate check this
replaced made a 25³ grid take 10-30 s.
"""

from __future__ import annotations

import argparse
import time

from einspace.grammar import parse_grammar


def grammar(n: int) -> str:
    values = " | ".join(str(v) for v in range(1, n + 1))
    return f"start S\nS -> im2col(k = {values}, s = {values}, p = {values}) col2im\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 10, 20, 25, 40])
    args = parser.parse_args()
    parse_grammar(grammar(2))  # load the parser and the operations once
    print(f"{'n':>4} {'grid points':>12} {'seconds':>9} {'per point vs smallest':>22}")
    base = None
    for n in args.sizes:
        text = grammar(n)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            parse_grammar(text)
            best = min(best, time.perf_counter() - start)
        per_point = best / n**3
        base = base or per_point
        print(f"{n:>4} {n**3:>12,} {best:>9.3f} {per_point / base:>21.2f}x")


if __name__ == "__main__":
    main()
