"""Prometheus metrics of the AudioSocket listener (in the worker's registry,
``gateway_audiosocket_*``). Sessions also count in ``gateway_sessions_active`` and
``gateway_sessions_total`` with ``protocol="audiosocket"``, like every other leg."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AudioSocketMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.refused = Counter(
            "gateway_audiosocket_connections_refused_total",
            "AudioSocket connections closed before a call was started for them, by reason "
            "(untrusted: source outside GATEWAY_AUDIOSOCKET_ALLOW; limit: "
            "GATEWAY_AUDIOSOCKET_MAX_CALLS; draining: the worker is shutting down; "
            "uuid_timeout: no UUID in time; bad_start: something else than a UUID first, "
            "or closed before it).",
            ["reason"],
            registry=r,
        )
        self.calls_active = Gauge(
            "gateway_audiosocket_calls_active",
            "AudioSocket calls in progress (from the UUID to the socket's close).",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.calls = Counter(
            "gateway_audiosocket_calls_total",
            "AudioSocket calls ended, by how (remote_hangup: a terminate from Asterisk; "
            "remote_closed: Asterisk closed the socket; hangup: the application, a flow or "
            "the listener's stop; shutting_down: the drain ended it; no_application: none "
            "attached in time; max_duration; protocol_error; peer_error: an error message "
            "from Asterisk; refused: the session could not start; failed: anything else).",
            ["reason"],
            registry=r,
        )
        self.dtmf = Counter("gateway_audiosocket_dtmf_total", "DTMF messages received.", registry=r)
