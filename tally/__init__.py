"""Tally: a table store for real-time aggregates.

This package sits at the bottom of the dependency graph: it holds only the version and the
exception hierarchy that every other package raises.
"""

__version__ = "0.1.0"
