"""The cluster file: which engines exist, their roles and URLs, written by `calroute engines up` and read
by the proxy and the harness. YAML, one mapping; unknown or missing fields are errors naming the field."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from calroute.errors import ConfigError
from calroute.types import InstanceSpec, Role

SCHEMA_VERSION = 1
KINDS = ("emulated", "vllm", "external")
EMULATOR_TOKENIZER = "emulator"  # the tokenizer field's value naming the emulator's tokenizer
ENGINE_TOKENIZER = "engine"  # ... naming the engines' own /tokenize endpoint (vLLM's)
NAMED_TOKENIZERS = (EMULATOR_TOKENIZER, ENGINE_TOKENIZER)


@dataclass(frozen=True)
class ClusterEngine:
    id: str
    role: Role
    url: str
    kv_capacity_tokens: int
    # Where the engine publishes its KV events (vLLM's --kv-events-config endpoint, as the proxy connects
    # to it: tcp://127.0.0.1:5557); None: the proxy's prefix index uses its own placements for it.
    kv_events_endpoint: str | None = None


@dataclass(frozen=True)
class ClusterFile:
    kind: str
    model: str
    max_model_len: int
    engines: tuple[ClusterEngine, ...]
    profile: str | None = None  # emulated clusters: the hardware profile they run
    time_scale: float = 1.0  # emulated clusters: every modelled duration is multiplied by this
    pgids: tuple[int, ...] = ()  # process groups to stop on `engines down`
    logs: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    # The engines' KV block size in tokens, when known: the proxy's prefix index hashes prompts in it, so its
    # counts of cached tokens land on the engines' block boundaries (None: the emulator's 16).
    block_tokens: int | None = None
    # The served model's tokenizer, which the proxy prices and hashes prompts with (docs/proxy.md,
    # "Tokens"): "emulator" (the emulator's), "engine" (each request's prompt tokenized by an engine's own
    # /tokenize, vLLM's, over HTTP), or a folder in Hugging Face's layout (tokenizer.json and
    # tokenizer_config.json or chat_template.jinja; a relative one is read from the cluster file's folder).
    # None: the proxy estimates text prompts' lengths and matches only token-id prompts against the caches.
    # A file without the field reads as "emulator" for an emulated cluster, None otherwise.
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            raise ConfigError(f"tokenizer must be 'emulator', 'engine' or a folder, got {self.tokenizer!r}")
        if self.block_tokens is not None and self.block_tokens < 1:
            raise ConfigError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.kind not in KINDS:
            raise ConfigError(f"cluster kind must be one of {KINDS}, got {self.kind!r}")
        ids = [e.id for e in self.engines]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"cluster engine ids must be unique, got {ids}")
        if not self.prefill or not self.decode:
            raise ConfigError("a cluster needs at least one prefill and one decode engine")

    @property
    def prefill(self) -> list[ClusterEngine]:
        return [e for e in self.engines if e.role is Role.PREFILL]

    @property
    def decode(self) -> list[ClusterEngine]:
        return [e for e in self.engines if e.role is Role.DECODE]

    def instance_specs(self) -> list[InstanceSpec]:
        return [InstanceSpec(e.id, e.role, e.kv_capacity_tokens) for e in self.engines]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engines"] = [
            {k: v for k, v in {**asdict(e), "role": e.role.value}.items() if v is not None}
            for e in self.engines
        ]
        d["pgids"] = list(self.pgids)
        d["logs"] = list(self.logs)
        return {"version": SCHEMA_VERSION, **d}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# calroute cluster file\n" + yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, d: Any, source: str = "cluster file") -> ClusterFile:
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a mapping")
        d = dict(d)
        if "tokenizer" not in d and d.get("kind") == "emulated":
            d["tokenizer"] = EMULATOR_TOKENIZER
        version = d.pop("version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ConfigError(f"{source}: unsupported version {version}")
        try:
            engines = tuple(
                ClusterEngine(
                    id=str(e["id"]),
                    role=Role(e["role"]),
                    url=str(e["url"]).rstrip("/"),
                    kv_capacity_tokens=int(e["kv_capacity_tokens"]),
                    kv_events_endpoint=None
                    if e.get("kv_events_endpoint") is None
                    else str(e["kv_events_endpoint"]),
                )
                for e in d.pop("engines")
            )
            return cls(
                engines=engines,
                pgids=tuple(int(p) for p in d.pop("pgids", ())),
                logs=tuple(str(x) for x in d.pop("logs", ())),
                **d,
            )
        except KeyError as e:
            raise ConfigError(f"{source}: missing field {e.args[0]!r}") from e
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: {e}") from e

    @classmethod
    def load(cls, path: Path) -> ClusterFile:
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read cluster file {path}: {e}") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"cluster file {path} is not YAML: {e}") from e
        file = cls.from_dict(data, str(path))
        tokenizer = file.tokenizer
        if tokenizer is not None and tokenizer not in NAMED_TOKENIZERS and not Path(tokenizer).is_absolute():
            file = replace(file, tokenizer=str((path.parent / tokenizer).resolve()))
        return file
