"""Airflow shell: hooks, deferrable operators, triggers and the DAG factory."""
