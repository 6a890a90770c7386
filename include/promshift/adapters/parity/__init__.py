"""Parity in layers, one class per layer (coverage, aggregates, labels, golden, samples) over one shared
``ParityContext``; ``adapters.parity_check.ParityCheck`` composes them. The maths lives in ``core.parity``."""
