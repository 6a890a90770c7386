"""Fixtures the package tests share: the wheel, built from what the Dockerfile's builder stage copies, as it does."""

from tests.package.test_wheel import stages, wheel  # noqa: F401
