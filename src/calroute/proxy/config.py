"""What `calroute serve` is configured with, and the constants of its engine traffic. Every serve option's
default is written here, once: the CLI's options take theirs from these dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.types import SloClass

# Below vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default, vllm/envs.py).
ENGINE_KEEPALIVE_S = 4.0
# A non-streamed answer may take this many calibrated decode steps per token before the engine counts as
# stalled: generous, since a step at full batch and long context is several times the reference step.
SLOW_STEPS_PER_TOKEN = 4.0
# A client that leaves while its prefill runs: the prefill engine's answer is still awaited this long. One
# that comes (the prefill ended as the client left) is released through its decode engine (release.py);
# then the request is closed, which vLLM aborts, freeing its blocks at once. A prefill whose last step runs
# as the abort arrives still ends as done and keeps its blocks until vLLM's lease expires (30 s): the wait
# makes that rarer, at the cost of at most this much more prefill for a client that left.
PREFILL_GRACE_S = 0.5

# ---- what an engine's answer may weigh (engines are not trusted with the proxy's memory) ------------------
# A whole answer: a prefill's, a non-streamed completion's, an engine's 4xx. The largest honest one is a JSON
# completion of many tokens with logprobs: vLLM writes about 60 bytes per candidate (token, logprob, bytes),
# so a token with top_logprobs=5 is ~400 bytes (8,192 tokens: ~3 MiB) and with top_logprobs=20 ~1.3 KiB
# (8,192 tokens: ~10 MiB). 16 MiB holds those, and bounds what one request can make the proxy hold.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
# A /metrics or /health answer: vLLM's exposition is tens of KiB (histograms per model), a large
# multi-LoRA one a few hundred.
MAX_PROBE_BYTES = 4 * 1024 * 1024
# One SSE event of a decode stream: a token's chunk is a few hundred bytes, a usage chunk as small; with
# logprobs and top_logprobs=20 a chunk stays within a few KiB. The relay holds at most this much of an
# event whose end has not come.
MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True)
class AnswerLimits:
    """What an engine's answers may make the proxy hold (the constants above; `calroute serve`
    --max-answer-bytes and the like). Past a cap the answer is an engine failure, not a client's."""

    max_answer_bytes: int = MAX_ANSWER_BYTES  # a prefill answer, a JSON completion, an engine's 4xx body
    max_event_bytes: int = MAX_EVENT_BYTES  # one SSE event of a decode stream
    max_probe_bytes: int = MAX_PROBE_BYTES  # a /metrics or /health answer

    def __post_init__(self) -> None:
        for name in ("max_answer_bytes", "max_event_bytes", "max_probe_bytes"):
            if getattr(self, name) < 1024:
                raise ConfigError(f"{name} must be at least 1024, got {getattr(self, name)}")


@dataclass(frozen=True)
class ClientLimits:
    """What one client may make the proxy's server wait for and hold (proxy/http/reader.py holds it to them;
    docs/proxy.md, "Client limits", compares them with uvicorn's and Envoy's)."""

    head_timeout_s: float = 10.0  # from a request's first byte to the end of its head: else 408
    # A body must arrive within max(body_timeout_s, its length / body_min_rate_bytes_s) of its head's end (a
    # chunked body's length: what has arrived so far, so one that keeps up the rate goes on): else 408.
    body_timeout_s: float = 10.0
    body_min_rate_bytes_s: float = 64 * 1024
    # An idle connection, between requests, is closed after this: as aiohttp's and nginx's defaults, well past
    # any client pool's own idle limit.
    keepalive_timeout_s: float = 75.0
    max_client_connections: int = 1024  # past it, a new connection gets a 503 and is closed
    max_body_bytes: int = 8 * 1024 * 1024  # one request's body: past it 413
    max_buffered_body_bytes: int = 64 * 1024 * 1024  # bodies being read, all connections together: 503

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "body_timeout_s", "body_min_rate_bytes_s", "keepalive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_body_bytes", "max_client_connections", "max_buffered_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ProxyConfig:
    cluster: ClusterFile
    calibration: Calibration
    policy: str = "marginal_cost"
    policy_params: dict[str, Any] = field(default_factory=dict)
    predictor: str = "bucket"
    # Studies only: relative error injected into the predictor's answer (the paper's noise study), and its
    # seed. With predictor "oracle" the true length comes from a header (proxy/oracle.py).
    predictor_noise: float = 0.0
    predictor_seed: int = 0
    default_slo: SloClass = SloClass.LOOSE
    log_path: Path | None = None
    decision_log_path: Path | None = None  # each decision with its view (routing/decisions.py)
    poll_interval_s: float = 0.05
    health_interval_s: float = 1.0
    prefill_timeout_s: float = 60.0
    stall_timeout_s: float = 60.0  # longest silence from a decode engine before it counts as stalled
    max_attempts: int = 3
    online_calibration: bool = False  # refit tau_pre / tau_dec from routed requests (costmodel/online.py)
    # Match each prompt's blocks against a prefix index (docs/prefix.md): fed by an engine's KV events where
    # the cluster file gives its kv_events_endpoint, by the router's own placements elsewhere (and while a
    # stream is stale). Off: every prompt is priced as uncached.
    prefix_index: bool = False
    admin_token: str | None = None  # from CALROUTE_ADMIN_TOKEN; None disables the admin endpoints
    engine_api_key: str | None = None  # from CALROUTE_ENGINE_API_KEY; sent to engines, never logged
    answer_limits: AnswerLimits = field(default_factory=AnswerLimits)
    client_limits: ClientLimits = field(default_factory=ClientLimits)

    def __post_init__(self) -> None:
        if self.predictor_noise < 0:
            raise ConfigError(f"predictor_noise must be >= 0, got {self.predictor_noise}")
        if not self.poll_interval_s > 0:
            raise ConfigError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")
        key = self.engine_api_key
        if key is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
            # it goes into a header of every engine request: refused here, not at the first request
            raise ConfigError("engine_api_key (CALROUTE_ENGINE_API_KEY) contains a control character")
