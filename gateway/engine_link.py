"""What the gateway knows of its engine: the client while it is up, and what its last
handshake said (voices, backend, text limit), for sessions, the voices API and metrics."""

from __future__ import annotations

from engine.ipc.client import EngineClient, EngineUnavailable
from engine.ipc.schema import Capabilities, VoiceInfo
from gateway.engine_supervisor import EngineSupervisor
from gateway.metrics import GatewayMetrics
from gateway.voices.registry import BackendInfo

DEFAULT_MAX_TEXT_CHARS = 5000  # until the engine says otherwise
#: The English voice callers hear when nobody chose one: the first the engine has.
DEFAULT_VOICES = ("en-us-joe", "en-us")


class EngineLink:
    def __init__(self, supervisor: EngineSupervisor, metrics: GatewayMetrics) -> None:
        self.supervisor = supervisor
        self._metrics = metrics
        self.voices: tuple[VoiceInfo, ...] = ()
        self.backend: BackendInfo | None = None
        # What each of the engine's backends can do (its Welcome), by backend name.
        self.capabilities: dict[str, Capabilities] = {}
        self.max_text_chars = DEFAULT_MAX_TEXT_CHARS
        supervisor.on_ready = self.on_ready
        supervisor.on_lost = self.on_lost

    def client(self) -> EngineClient:
        """The engine's client; raises :class:`EngineUnavailable` while it is down."""
        client = self.supervisor.client
        if client is None or client.lost:
            raise EngineUnavailable("the engine is not ready")
        return client

    def voice_ids(self) -> frozenset[str]:
        return frozenset(v.id for v in self.voices)

    @property
    def default_voice(self) -> str:
        """The neural English voice when the engine has it, else espeak's."""
        ids = self.voice_ids()
        return next((v for v in DEFAULT_VOICES if v in ids), DEFAULT_VOICES[-1])

    def on_ready(self, client: EngineClient) -> None:
        welcome = client.welcome
        if welcome is not None:
            self.voices = welcome.voices
            self.max_text_chars = welcome.max_text_chars
            self.capabilities = dict(welcome.capabilities)
            # Registered voices are prepared and spoken by one backend: their base voice is
            # one of its voices, never another backend's (a Piper voice cannot take an
            # espeak profile).
            cloning = welcome.cloning_backend
            self.backend = BackendInfo(
                name=cloning or welcome.backend,
                version=welcome.backend_version,
                cloning=welcome.voice_cloning,
                voices={
                    v.id: v.language for v in welcome.voices if not cloning or v.backend == cloning
                },
            )
        self._metrics.engine_ready.set(1)

    def on_lost(self) -> None:
        self._metrics.engine_ready.set(0)
        self._metrics.engine_restarts.inc()
        self._metrics.golden_errors.labels(type="engine_unavailable").inc()

    def refresh_gauges(self) -> None:
        """Engine readiness and memory from the last heartbeat (pinged every second)."""
        self._metrics.engine_ready.set(1 if self.supervisor.ready else 0)
        client = self.supervisor.client
        pong = client.last_pong if client is not None else None
        if pong is not None:
            self._metrics.gpu_memory_used.set(pong.gpu_used_bytes)
            self._metrics.engine_memory_used.set(pong.memory_used_bytes or pong.rss_bytes)
            self._metrics.engine_memory_budget.set(pong.memory_budget_bytes)
        self._metrics.engine_speech_cache = pong.speech_cache if pong is not None else None
