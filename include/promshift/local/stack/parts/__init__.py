"""The local stack's component families, one per module, each a part ``LocalStack`` is composed of.

- ``fleet``: the simulated GPU fleet (and its faults);
- ``prometheus``: the source Prometheus and the target (the AMP stand-in's TSDB), their configs and rules;
- ``cluster_b``: the second cluster (``clusters=2``): its fleet, source and target;
- ``replicas``: the source's second replica (``replicas=2``): an HA pair scraping the same fleet;
- ``amp``: the local AWS (``target_kind="amp"``): moto, the control plane, the front door, the signing relays;
- ``stand_ins``: what deployers edit besides the source's file: the Kubernetes API (k8s), the config
  repository with its sync (git), Grafana's provisioned dashboards;
- ``alerting``: the target's Alertmanager and the SMTP sink;
- ``airflow``: what faces the local Airflow: the source's scrape of promshift's ``/metrics`` and stopping
  Airflow's process group with the stack.

Each family subclasses ``promshift.local.stack.processes.StackProcesses`` and reads ``promshift.local.stack.spec``.
"""
