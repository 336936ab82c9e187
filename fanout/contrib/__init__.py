"""Opt-in integrations: logging, structlog, Prometheus and OpenTelemetry instruments.

Each lives in its own module and imports its third-party package at the top,
so importing ``fanout`` (or this package) never pulls one in; import the
module you want, e.g. ``from fanout.contrib.logging import LoggingInstrument``.
"""
