"""compile: place a recorded Program on a target -> Report (see docs/cost-model.md)."""

from popviz.compile.compiler import compile
from popviz.compile.report import Report

__all__ = ["Report", "compile"]
