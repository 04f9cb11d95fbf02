"""`calroute serve`: the router proxy in front of a cluster file's engines."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer

from calroute.cli.common import (
    PARAMS_HELP,
    SLO_DEFAULT,
    SLO_HELP,
    err,
    exit_on_error,
    load_profile,
    load_tokenizer,
    policy_params,
    slo_option,
)
from calroute.cluster.file import ClusterFile
from calroute.policies import policy_names
from calroute.proxy.config import AnswerLimits, ClientLimits, ProxyConfig
from calroute.types import SloClass

# The options whose name is not their config field's (their flags are older than the fields' units).
_FIELD_OF = {
    "poll_interval": "poll_interval_s",
    "stall_timeout": "stall_timeout_s",
    "log": "log_path",
    "decision_log": "decision_log_path",
}
# The options that are not config fields: read into one (the cluster file, the calibration, the policy's
# parameters), or the listener's.
_NOT_FIELDS = frozenset({"cluster", "calibration", "param", "params_file", "slo", "host", "port"})
# Every option's default is its field's, written once in the config (the limits': in their dataclasses).
_DEFAULT: dict[str, Any] = {f.name: f.default for f in fields(ProxyConfig)}


def _proxy_config(options: Mapping[str, Any], **read: Any) -> ProxyConfig:
    """The config of serve's ``options``: each one to its field, in ProxyConfig or in the limits nested in it.
    ``read``: the fields made from the other options and from the environment."""
    values = {_FIELD_OF.get(k, k): v for k, v in options.items() if k not in _NOT_FIELDS}
    nested: dict[str, Any] = {
        name: cls(**{f.name: values.pop(f.name) for f in fields(cls) if f.name in values})
        for name, cls in (("answer_limits", AnswerLimits), ("client_limits", ClientLimits))
    }
    return ProxyConfig(**values, **nested, **read)  # an option of no field: a TypeError, here


def serve(
    cluster: Annotated[Path, typer.Option(help="cluster file (calroute engines up)")],
    policy: Annotated[
        str,
        typer.Option(help=f"routing policy: {', '.join(policy_names())}"),
    ] = _DEFAULT["policy"],
    param: Annotated[list[str] | None, typer.Option(help="policy parameter NAME=VALUE (repeatable)")] = None,
    params_file: Annotated[Path | None, typer.Option("--params", help=PARAMS_HELP)] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(help="calibration JSON (router constants, SLO targets); default: the profile's"),
    ] = None,
    predictor: Annotated[
        str,
        typer.Option(
            help="output-length predictor: bucket, constant, or oracle (studies only: each request must "
            "carry its true length in the x-calroute-oracle-output-tokens header)"
        ),
    ] = _DEFAULT["predictor"],
    predictor_noise: Annotated[
        float, typer.Option(min=0.0, help="studies only: relative error injected into every prediction")
    ] = _DEFAULT["predictor_noise"],
    predictor_seed: Annotated[
        int,
        typer.Option(help="seed of the injected error"),
    ] = _DEFAULT["predictor_seed"],
    default_slo: Annotated[
        SloClass, typer.Option(help="SLO class of requests without an SLO header")
    ] = _DEFAULT["default_slo"],
    slo: Annotated[
        str,
        typer.Option(
            help=SLO_HELP + "; the proxy maps requests' target headers to a class by them (docs/proxy.md)"
        ),
    ] = SLO_DEFAULT,
    host: Annotated[str, typer.Option(help="address to bind (loopback unless told otherwise)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    log: Annotated[Path | None, typer.Option(help="per-request JSONL log")] = None,
    decision_log: Annotated[Path | None, typer.Option(help="JSONL of every decision and its view")] = None,
    max_attempts: Annotated[
        int,
        typer.Option(min=1, help="tries per request across engines"),
    ] = _DEFAULT["max_attempts"],
    online_calibration: Annotated[
        bool, typer.Option(help="refit the router's constants from routed requests as traffic flows")
    ] = _DEFAULT["online_calibration"],
    prefix_index: Annotated[
        bool,
        typer.Option(
            help="match prompts against the engines' prefix caches: their KV events where the cluster file "
            "names a kv_events_endpoint, the router's own placements elsewhere (docs/prefix.md)"
        ),
    ] = _DEFAULT["prefix_index"],
    poll_interval: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="seconds between /metrics scrapes of each engine; real vLLM sharing CPU cores stalls "
            "when scraped this often (docs/proxy.md)",
        ),
    ] = _DEFAULT["poll_interval_s"],
    stall_timeout: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="seconds of silence from a decode engine before its request counts as stalled: the engine "
            "goes out of routing and the request is retried on another one (docs/faults.md)",
        ),
    ] = _DEFAULT["stall_timeout_s"],
    # ---- engine answers: what an engine may make the proxy hold (docs/proxy.md) ----
    max_answer_bytes: Annotated[
        int,
        typer.Option(
            min=1024,
            help="largest prefill answer, non-streamed completion or engine error the proxy reads (16 MiB); "
            "a larger one is an engine failure, retried elsewhere",
        ),
    ] = AnswerLimits().max_answer_bytes,
    max_event_bytes: Annotated[
        int,
        typer.Option(
            min=1024, help="largest SSE event of a decode stream (1 MiB); a longer one ends the stream"
        ),
    ] = AnswerLimits().max_event_bytes,
    max_probe_bytes: Annotated[
        int,
        typer.Option(
            min=1024, help="largest /metrics or /health answer (4 MiB); a larger one fails the poll"
        ),
    ] = AnswerLimits().max_probe_bytes,
    # ---- client limits (docs/proxy.md, "Client limits") ----
    head_timeout_s: Annotated[
        float,
        typer.Option(min=0.001, help="seconds from a request's first byte to the end of its head (408)"),
    ] = ClientLimits().head_timeout_s,
    body_timeout_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="seconds a request body may take, at least (408); longer at --body-min-rate-bytes-s",
        ),
    ] = ClientLimits().body_timeout_s,
    body_min_rate_bytes_s: Annotated[
        float,
        typer.Option(min=1.0, help="a body gets max(--body-timeout-s, its bytes / this rate) to arrive"),
    ] = ClientLimits().body_min_rate_bytes_s,
    keepalive_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="seconds an idle client connection stays open")
    ] = ClientLimits().keepalive_timeout_s,
    max_client_connections: Annotated[
        int, typer.Option(min=1, help="client connections open at once; past it a new one gets 503")
    ] = ClientLimits().max_client_connections,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="bytes of one request's body (413)")
    ] = ClientLimits().max_body_bytes,
    max_buffered_body_bytes: Annotated[
        int,
        typer.Option(
            min=1, help="bytes of request bodies being read, all connections together (503 past it)"
        ),
    ] = ClientLimits().max_buffered_body_bytes,
) -> None:
    """Route OpenAI-compatible requests to a vLLM prefill/decode cluster with the chosen policy.

    Admin endpoints (/state, /admin/policy) need CALROUTE_ADMIN_TOKEN set; engines' API key, if they want
    one, comes from CALROUTE_ENGINE_API_KEY.
    """
    options = dict(locals())  # before any other local: the config is made of the options, by name
    from calroute.proxy.app import Proxy

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with exit_on_error():
        slo_spec = slo_option(slo)
        # parameters first: a bad --param or --params file fails before the cluster is read
        params = policy_params(param or [], [policy], params_file, qualified=False).get(policy, {})
        c = ClusterFile.load(cluster)
        # no --calibration: the constants of the profile the engines were started with, else the default's
        named = c.profile if c.profile is not None and not c.profile.startswith("calibration:") else None
        cal = load_profile(None if calibration is not None else named, calibration, slo_spec).calibration
        if calibration is None and named is None:
            err.print(
                "[yellow]warning:[/] no --calibration: pricing with the a40-qwen2.5-3b profile's constants"
            )
        cfg = _proxy_config(
            options,
            cluster=c,
            calibration=cal,
            policy_params=params,
            admin_token=os.environ.get("CALROUTE_ADMIN_TOKEN") or None,
            engine_api_key=os.environ.get("CALROUTE_ENGINE_API_KEY") or None,
        )
        tokenizer = load_tokenizer(c, cfg.engine_api_key)
        if tokenizer is None:
            err.print(
                "[yellow]warning:[/] the cluster file names no tokenizer: text and chat prompts' lengths are "
                "estimated from their characters and not matched against the engines' caches (docs/proxy.md, "
                '"Tokens"; calroute_prompt_length_estimated_total counts them)'
            )
        else:
            err.print(f"tokenizer: {tokenizer.name}")
        proxy = Proxy(tokenizer=tokenizer, cfg=cfg)
    from calroute.aio import run_until_signalled

    # A full garbage collection walks every object the process holds: 15 - 18 ms once the proxy's libraries
    # are loaded, a pause added to the TTFT of every request in flight. What exists now (modules, the app)
    # lives as long as the process: frozen, it leaves later collections only the objects made while serving.
    gc.collect()
    gc.freeze()
    try:
        run_until_signalled(
            lambda: proxy.start(host, port),
            proxy.stop,
            lambda bound: err.print(
                f"calroute proxy on http://{host}:{bound} ({policy}, {len(c.prefill)}P+{len(c.decode)}D)"
            ),
        )
    except OSError as e:  # the address is taken, or not this machine's
        err.print(f"[red]error:[/] cannot listen on {host}:{port} (--host, --port): {e}")
        raise typer.Exit(2) from e
