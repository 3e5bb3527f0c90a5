"""OpenTelemetry traces and metrics of a job, where the OpenTelemetry API is installed.

Conveyor uses the global tracer and meter providers: an application that set its own (a notebook,
an orchestrator) gets Conveyor's spans and metrics in them. The command line sets providers from
OpenTelemetry's standard environment variables when ``OTEL_TRACES_EXPORTER`` or
``OTEL_METRICS_EXPORTER`` names an exporter (``console``, ``otlp``, ...: the SDK's exporters by their
entry-point names; ``OTEL_SERVICE_NAME`` defaults to ``conveyor``, ``OTEL_SDK_DISABLED=true`` turns
it off), and flushes them when it exits. Without the API, or without providers, nothing is recorded (and a
process that never imported OpenTelemetry does not import it for a job).

A job is one trace: the span ``conveyor.job`` (source, sink, load mode, degree, rows, status), its
phases (``conveyor.plan``, ``conveyor.prepare``, ``conveyor.tasks``, ``conveyor.verify``,
``conveyor.finalize``) and one ``conveyor.partition`` span per partition (key, rows, bytes,
attempts; an event per retry; an error status when it failed), recorded by the driver as each
partition finishes, whichever process ran it. Metrics: ``conveyor.rows``, ``conveyor.bytes`` and
``conveyor.partitions`` (by status) counters, and the ``conveyor.partition.duration`` histogram (s).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from conveyor.core import ProgressRelay

_PHASES = ("plan", "prepare", "count source", "tasks", "verify", "finalize")


def _api() -> tuple[Any, Any] | None:
    """OpenTelemetry's API where the process has loaded it: an application that set providers has, and so has
    the command line when the environment asks for them; otherwise not imported (~20 ms of every job's start)."""
    import sys

    if "opentelemetry.trace" not in sys.modules:
        return None
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return None
    return trace, metrics


class Traced:
    """One job's trace and metrics (see the module's docstring); a no-op without the API."""

    def __init__(self, plan: Any, start: float) -> None:
        self.api = _api()
        self.start_ns = time.time_ns() - int((time.perf_counter() - start) * 1e9)  # the job's start, on the wall clock
        self.span = self.context = None
        if self.api is None:
            return
        trace, metrics = self.api
        spec = plan.spec
        self.tracer = trace.get_tracer("conveyor")
        self.span = self.tracer.start_span("conveyor.job", start_time=self.start_ns, attributes={
            "conveyor.source": spec.names.get("source", ""), "conveyor.sink": spec.names.get("sink", ""),
            "conveyor.load_mode": spec.options.load_mode, "conveyor.degree": plan.degree, "conveyor.partitions": len(plan.partitions),
            "conveyor.source.label": plan.info.label})
        self.context = trace.set_span_in_context(self.span)
        meter = metrics.get_meter("conveyor")
        self.rows = meter.create_counter("conveyor.rows", unit="{row}", description="rows a job's partitions moved")
        self.bytes = meter.create_counter("conveyor.bytes", unit="By", description="bytes of Arrow data a job's partitions moved")
        self.partitions = meter.create_counter("conveyor.partitions", unit="{partition}", description="partitions finished, by status")
        self.duration = meter.create_histogram("conveyor.partition.duration", unit="s", description="a partition's seconds")

    def progress(self, progress: Any) -> Any:
        return progress if self.span is None else _Observed(progress, self)

    def partition(self, result: Any) -> None:
        """A partition finished (in whatever process ran it): its span, ended now, and its metrics."""
        if self.span is None:
            return
        trace = self.api[0]
        end = time.time_ns()
        status = "cancelled" if result.cancelled else ("ok" if result.ok else "failed")
        span = self.tracer.start_span("conveyor.partition", context=self.context, start_time=end - int(result.seconds * 1e9), attributes={
            "conveyor.partition": result.partition, "conveyor.rows": result.rows, "conveyor.bytes": result.bytes,
            "conveyor.attempts": result.attempts, "conveyor.status": status, "conveyor.already_committed": result.already_committed})
        for note in result.notes:
            span.add_event("conveyor.note", {"conveyor.note": note})
        if result.error is not None and not result.cancelled:
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(result.error)))
        span.end(end_time=end)
        attrs = {"conveyor.status": status}
        self.rows.add(result.rows, attrs)
        self.bytes.add(result.bytes, attrs)
        self.partitions.add(1, attrs)
        self.duration.record(result.seconds, attrs)

    def done(self, report: Any) -> None:
        """The job ended: its phases as spans laid end to end from its start, its outcome on its span."""
        if self.span is None:
            return
        trace = self.api[0]
        at = self.start_ns
        for name, seconds in report.phases.items():
            if name in _PHASES:
                end = at + int(seconds * 1e9)
                self.tracer.start_span(f"conveyor.{name.replace(' ', '_')}", context=self.context, start_time=at).end(end_time=end)
                at = end
        self.span.set_attribute("conveyor.rows", report.rows)
        self.span.set_attribute("conveyor.status", "ok" if report.error is None else "failed")
        if report.error is not None:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, str(report.error)))
        self.span.end()


class _Observed(ProgressRelay):
    """The job's progress, and each finished partition recorded (:meth:`Traced.partition`)."""

    def __init__(self, inner: Any, traced: Traced) -> None:
        super().__init__(inner)
        self.traced = traced

    def finished(self, result: Any) -> None:
        self.traced.partition(result)
        super().finished(result)


@contextlib.contextmanager
def from_environment() -> Iterator[None]:
    """The command line's providers, from OpenTelemetry's environment variables (see the module's
    docstring), flushed and shut down when the block ends; nothing when none is asked for."""
    traces, metrics_exp = os.environ.get("OTEL_TRACES_EXPORTER", ""), os.environ.get("OTEL_METRICS_EXPORTER", "")
    wanted = [x for x in (traces, metrics_exp) if x and x != "none"]
    if not wanted or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        yield
        return
    from conveyor.errors import ConfigError

    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError("OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER: the OpenTelemetry SDK is not installed",
                          hint="pip install opentelemetry-sdk (and the exporter's package, e.g. opentelemetry-exporter-otlp)") from None
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "conveyor")})
    made: list[Any] = []
    if traces and traces != "none":
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(_exporter("opentelemetry_traces_exporter", traces)()))
        trace.set_tracer_provider(provider)
        made.append(provider)
    if metrics_exp and metrics_exp != "none":
        reader = PeriodicExportingMetricReader(_exporter("opentelemetry_metrics_exporter", metrics_exp)())
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        metrics.set_meter_provider(meter_provider)
        made.append(meter_provider)
    try:
        yield
    finally:
        for provider in made:
            with contextlib.suppress(Exception):
                provider.shutdown()  # flushes what is left


def _exporter(group: str, name: str) -> Any:
    """The exporter class the SDK registers under ``name`` (entry points, as the SDK's own configuration finds them)."""
    from importlib.metadata import entry_points

    from conveyor.errors import ConfigError

    found = [ep for ep in entry_points(group=group) if ep.name == name]
    if not found:
        known = sorted(ep.name for ep in entry_points(group=group))
        raise ConfigError(f"OpenTelemetry exporter {name!r} is not installed (installed: {', '.join(known) or 'none'})",
                          hint="pip install its package (otlp: opentelemetry-exporter-otlp), or unset the variable")
    return found[0].load()
