"""popviz Dash app (installed as the package `popviz_app`): wiring only."""
