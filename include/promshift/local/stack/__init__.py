"""Local stack: the simulated DCGM fleet and the source/target Prometheus servers on 127.0.0.1."""
