"""`popviz compare A B --ops`: its flags (reporters.compare prints the op-by-op table)."""

from __future__ import annotations

import argparse

from popviz.analysis.compare.ops import GROUP_BY, PER
from popviz.argtypes import non_negative_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("op by op (--ops)")
    group.add_argument("--ops", action="store_true",
                       help="print A vs B time, calls and memory per op group instead, "
                       "largest time difference first")
    group.add_argument("--by", choices=list(GROUP_BY), default="op",
                       help="group ops by op type, op class, module or pass (default: op)")
    group.add_argument("--depth", type=int, default=1, metavar="N",
                       help="module levels kept with --by module (default: 1)")
    group.add_argument("--per", choices=list(PER), default="auto",
                       help="time and bytes written per step of one replica, or per "
                       "sample (default auto: per sample when the two runs' steps hold "
                       "different numbers of samples)")
    group.add_argument("--top", type=non_negative_int, default=20, metavar="N",
                       help="rows printed (default: 20; 0 = all); --json gives all")
