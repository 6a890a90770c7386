"""Pure domain core: no airflow, boto3, requests, clock or environment reads.

Everything here takes its data and ``now`` as arguments, so it is unit-tested
with in-memory values.
"""
