"""Pieces both halves of tether speak: the wire protocol, settings and logging.

`runner` and `supervisor` both import this package; it imports neither of them, and needs
nothing beyond the runner's own dependencies.
"""

__version__ = "0.1.0"
