"""Renderers of :mod:`vramlens.planner`'s results (text, plots, HTML), beside the package that computes them."""
