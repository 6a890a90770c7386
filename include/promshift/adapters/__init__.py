"""Adapters: HTTP clients, config deployers and the audit store around the pure core."""
