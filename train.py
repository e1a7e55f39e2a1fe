#!/usr/bin/env python
"""`python train.py ...` = `popviz train ...`: train a reference model for real on the CPU
and profile one step as it would run on IPUs (popviz/cli/train/, docs/train.md)."""

import sys

from popviz.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
