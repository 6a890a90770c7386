"""Test-wide settings: a throwaway AIRFLOW_HOME so tests never touch ~/airflow."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="promshift-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
# Every writer needs the audit HMAC key, as in a deployment; tests of a missing key unset it.
os.environ.setdefault("PROMSHIFT_AUDIT_KEY", "test-only-audit-key-0123456789abcdef")
