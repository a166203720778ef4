"""Renderers of :mod:`vramlens.experiments`'s results (text, plots, HTML), beside the package that computes them."""
