"""The lab: the local stack and stand-ins, demo drivers, local Airflow and Celery.

Production code never imports this package and the wheel does not ship it.
"""
