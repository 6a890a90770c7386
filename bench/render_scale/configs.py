"""Generated Prometheus configs shaped like kube-prometheus-stack's: many scrape jobs with relabelings."""

from __future__ import annotations

HEADER = """# Generated for bench/render_scale: a kube-prometheus-stack-like config.
global:
  scrape_interval: 30s
  evaluation_interval: 30s
  external_labels:
    cluster: bench
    prometheus: monitoring/kube-prometheus-stack-prometheus
rule_files:
  - /etc/prometheus/rules/*.yaml
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["alertmanager:9093"]
remote_write:
  - url: http://thanos-receive:19291/api/v1/receive
    name: thanos
"""


def job(index: int) -> str:
    """One ServiceMonitor-rendered scrape job (about 2.4 kB)."""
    name = f"serviceMonitor/team-{index:05d}/app-{index:05d}-metrics/0"
    return f"""- job_name: {name}
  honor_labels: false
  honor_timestamps: true
  scrape_interval: 30s
  scrape_timeout: 10s
  metrics_path: /metrics
  scheme: http
  follow_redirects: true
  enable_http2: true
  kubernetes_sd_configs:
    - role: endpoints
      kubeconfig_file: ""
      follow_redirects: true
      enable_http2: true
      namespaces:
        own_namespace: false
        names:
          - team-{index:05d}
  relabel_configs:
    - source_labels: [job]
      separator: ;
      regex: (.*)
      target_label: __tmp_prometheus_job_name
      replacement: $1
      action: replace
    - source_labels: [__meta_kubernetes_service_label_app_kubernetes_io_name,
        __meta_kubernetes_service_labelpresent_app_kubernetes_io_name]
      separator: ;
      regex: (app-{index:05d});true
      replacement: $1
      action: keep
    - source_labels: [__meta_kubernetes_endpoint_port_name]
      separator: ;
      regex: metrics
      replacement: $1
      action: keep
    - source_labels: [__meta_kubernetes_endpoint_address_target_kind, __meta_kubernetes_endpoint_address_target_name]
      separator: ;
      regex: Node;(.*)
      target_label: node
      replacement: ${{1}}
      action: replace
    - source_labels: [__meta_kubernetes_namespace]
      separator: ;
      regex: (.*)
      target_label: namespace
      replacement: $1
      action: replace
    - source_labels: [__meta_kubernetes_service_name]
      separator: ;
      regex: (.*)
      target_label: service
      replacement: $1
      action: replace
    - source_labels: [__meta_kubernetes_pod_name]
      separator: ;
      regex: (.*)
      target_label: pod
      replacement: $1
      action: replace
    - source_labels: [__meta_kubernetes_pod_container_name]
      separator: ;
      regex: (.*)
      target_label: container
      replacement: $1
      action: replace
    - source_labels: [__address__]
      separator: ;
      regex: (.*)
      modulus: 1
      target_label: __tmp_hash
      replacement: $1
      action: hashmod
  metric_relabel_configs:
    - source_labels: [__name__]
      separator: ;
      regex: 'go_gc_duration_seconds.*|process_.*'  # noisy runtime metrics
      replacement: $1
      action: drop
"""


def config(target_bytes: int) -> str:
    """A config of about ``target_bytes`` bytes (at least one job)."""
    parts = [HEADER, "scrape_configs:\n"]
    size = sum(map(len, parts))
    index = 0
    while size < target_bytes or index == 0:
        text = job(index)
        parts.append(text)
        size += len(text)
        index += 1
    return "".join(parts)
