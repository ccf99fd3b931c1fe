"""Prometheus metrics of the SIP bridge (in the worker's registry, ``gateway_sip_*``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

JITTER_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2)
SETUP_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class SipMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "gateway_sip_requests_total",
            "SIP requests received, by method.",
            ["method"],
            registry=r,
        )
        self.responses = Counter(
            "gateway_sip_responses_total",
            "SIP responses sent, by status code.",
            ["code"],
            registry=r,
        )
        self.refused = Counter(
            "gateway_sip_refused_total",
            "SIP requests refused before any call state was kept, by reason (untrusted: "
            "source outside GATEWAY_SIP_ALLOW and not a trunk; challenged: 401 to a trunk; "
            "bad_credentials: a trunk's digest failed; trunk_calls: too many trunk calls; "
            "rate: GATEWAY_SIP_INVITES_PER_S; per_source: GATEWAY_SIP_MAX_CALLS_PER_SOURCE; "
            "address_family: SDP media the RTP sockets cannot reach, 488).",
            ["reason"],
            registry=r,
        )
        self.calls_active = Gauge(
            "gateway_sip_calls_active",
            "SIP calls in progress (answered or not).",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.calls = Counter(
            "gateway_sip_calls_total",
            "SIP calls ended, by how (remote_bye, local_bye, cancelled, rejected, ack_timeout, "
            "no_answer, max_duration, rtp_timeout).",
            ["reason"],
            registry=r,
        )
        self.setup = Histogram(
            "gateway_sip_setup_seconds",
            "INVITE received to 200 OK sent.",
            buckets=SETUP_BUCKETS,
            registry=r,
        )
        self.rtp_packets = Counter(
            "gateway_sip_rtp_packets_total",
            "RTP packets, by direction (in, out).",
            ["direction"],
            registry=r,
        )
        # the per-packet counters, labelled once (labels() is a lookup under a lock)
        self.rtp_in = self.rtp_packets.labels(direction="in")
        self.rtp_out = self.rtp_packets.labels(direction="out")
        self.rtp_dropped = Counter(
            "gateway_sip_rtp_dropped_total",
            "Inbound RTP packets dropped, by reason (unexpected_source, malformed, "
            "duplicate, unknown_payload).",
            ["reason"],
            registry=r,
        )
        self.rtp_unexpected_source = self.rtp_dropped.labels(reason="unexpected_source")
        self.rtp_malformed = self.rtp_dropped.labels(reason="malformed")
        self.rtp_duplicate = self.rtp_dropped.labels(reason="duplicate")
        self.rtp_unknown_payload = self.rtp_dropped.labels(reason="unknown_payload")
        self.rtp_lost = Counter(
            "gateway_sip_rtp_lost_total",
            "Inbound RTP packets lost (RFC 3550 A.3, counted at the end of each call).",
            registry=r,
        )
        self.rtp_jitter = Histogram(
            "gateway_sip_rtp_jitter_seconds",
            "Inbound interarrival jitter (RFC 3550 A.8) at the end of each call.",
            buckets=JITTER_BUCKETS,
            registry=r,
        )
        self.dtmf = Counter("gateway_sip_dtmf_total", "RFC 4733 DTMF digits received.", registry=r)
        self.webhook_requests = Counter(
            "gateway_sip_webhook_requests_total",
            "Requests to route webhooks, by outcome (ok, timeout, connection, http_error, "
            "too_large, invalid, cancelled: the call ended first).",
            ["outcome"],
            registry=r,
        )
        self.webhook_seconds = Histogram(
            "gateway_sip_webhook_seconds",
            "Webhook request to its answer (or failure).",
            buckets=SETUP_BUCKETS,
            registry=r,
        )
