"""Device naming for figures: re-exported from `popviz.vocab`, where every layer reads it."""

from popviz.vocab import MEASURED, MODELLED, Naming, naming_for, naming_of

__all__ = ["MEASURED", "MODELLED", "Naming", "naming_for", "naming_of"]
