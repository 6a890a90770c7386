"""promshift: move Prometheus metric groups to AMP one proven group at a time."""

from __future__ import annotations

__version__ = "0.2.0"
