"""Renderers of :mod:`vramlens.rlhf`'s results (text, plots, HTML), beside the package that computes them."""
