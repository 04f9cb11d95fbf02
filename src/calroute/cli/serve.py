"""`calroute serve`: the router proxy in front of a cluster file's engines."""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from calroute.cli.common import (
    PARAMS_HELP,
    SLO_DEFAULT,
    SLO_HELP,
    err,
    exit_on_error,
    load_profile,
    policy_params,
    slo_option,
)
from calroute.cluster.file import ClusterFile
from calroute.policies import policy_names
from calroute.proxy.config import MAX_ANSWER_BYTES, MAX_EVENT_BYTES, MAX_PROBE_BYTES
from calroute.types import SloClass


def serve(
    cluster: Annotated[Path, typer.Option(help="cluster file (calroute engines up)")],
    policy: Annotated[
        str, typer.Option(help=f"routing policy: {', '.join(policy_names())}")
    ] = "marginal_cost",
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
    ] = "bucket",
    predictor_noise: Annotated[
        float, typer.Option(min=0.0, help="studies only: relative error injected into every prediction")
    ] = 0.0,
    predictor_seed: Annotated[int, typer.Option(help="seed of the injected error")] = 0,
    default_slo: Annotated[SloClass, typer.Option(help="SLO class of requests without an SLO header")] = (
        SloClass.LOOSE
    ),
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
    max_attempts: Annotated[int, typer.Option(min=1, help="tries per request across engines")] = 3,
    online_calibration: Annotated[
        bool, typer.Option(help="refit the router's constants from routed requests as traffic flows")
    ] = False,
    prefix_index: Annotated[
        bool,
        typer.Option(
            help="match prompts against the engines' prefix caches: their KV events where the cluster file "
            "names a kv_events_endpoint, the router's own placements elsewhere (docs/prefix.md)"
        ),
    ] = False,
    poll_interval: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="seconds between /metrics scrapes of each engine; real vLLM sharing CPU cores stalls "
            "when scraped this often (docs/proxy.md)",
        ),
    ] = 0.05,
    stall_timeout: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="seconds of silence from a decode engine before its request counts as stalled: the engine "
            "goes out of routing and the request is retried on another one (docs/faults.md)",
        ),
    ] = 60.0,
    # ---- engine answers: what an engine may make the proxy hold (docs/proxy.md) ----
    max_answer_bytes: Annotated[
        int,
        typer.Option(
            min=1024,
            help="largest prefill answer, non-streamed completion or engine error the proxy reads (16 MiB); "
            "a larger one is an engine failure, retried elsewhere",
        ),
    ] = MAX_ANSWER_BYTES,
    max_event_bytes: Annotated[
        int,
        typer.Option(
            min=1024, help="largest SSE event of a decode stream (1 MiB); a longer one ends the stream"
        ),
    ] = MAX_EVENT_BYTES,
    max_probe_bytes: Annotated[
        int,
        typer.Option(
            min=1024, help="largest /metrics or /health answer (4 MiB); a larger one fails the poll"
        ),
    ] = MAX_PROBE_BYTES,
    # ---- client limits (docs/proxy.md, "Client limits") ----
    head_timeout_s: Annotated[
        float,
        typer.Option(min=0.001, help="seconds from a request's first byte to the end of its head (408)"),
    ] = 10.0,
    body_timeout_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="seconds a request body may take, at least (408); longer at --body-min-rate-bytes-s",
        ),
    ] = 10.0,
    body_min_rate_bytes_s: Annotated[
        float,
        typer.Option(min=1.0, help="a body gets max(--body-timeout-s, its bytes / this rate) to arrive"),
    ] = 64 * 1024,
    keepalive_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="seconds an idle client connection stays open")
    ] = 75.0,
    max_client_connections: Annotated[
        int, typer.Option(min=1, help="client connections open at once; past it a new one gets 503")
    ] = 1024,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="bytes of one request's body (413)")] = 8
    * 1024
    * 1024,
    max_buffered_body_bytes: Annotated[
        int,
        typer.Option(
            min=1, help="bytes of request bodies being read, all connections together (503 past it)"
        ),
    ] = 64 * 1024 * 1024,
) -> None:
    """Route OpenAI-compatible requests to a vLLM prefill/decode cluster with the chosen policy.

    Admin endpoints (/state, /admin/policy) need CALROUTE_ADMIN_TOKEN set; engines' API key, if they want
    one, comes from CALROUTE_ENGINE_API_KEY.
    """
    from calroute.emulator.api import EmulatorTokenizer
    from calroute.proxy.app import Proxy
    from calroute.proxy.config import ProxyConfig

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
        proxy = Proxy(
            # The emulator's tokenizer for every cluster, as before the tokenizer interface: the served
            # model's own is the next step (docs/status.md).
            tokenizer=EmulatorTokenizer(),
            cfg=ProxyConfig(
                cluster=c,
                calibration=cal,
                policy=policy,
                policy_params=params,
                predictor=predictor,
                predictor_noise=predictor_noise,
                predictor_seed=predictor_seed,
                default_slo=default_slo,
                log_path=log,
                decision_log_path=decision_log,
                max_attempts=max_attempts,
                online_calibration=online_calibration,
                prefix_index=prefix_index,
                poll_interval_s=poll_interval,
                stall_timeout_s=stall_timeout,
                max_answer_bytes=max_answer_bytes,
                max_event_bytes=max_event_bytes,
                max_probe_bytes=max_probe_bytes,
                head_timeout_s=head_timeout_s,
                body_timeout_s=body_timeout_s,
                body_min_rate_bytes_s=body_min_rate_bytes_s,
                keepalive_timeout_s=keepalive_timeout_s,
                max_client_connections=max_client_connections,
                max_body_bytes=max_body_bytes,
                max_buffered_body_bytes=max_buffered_body_bytes,
                admin_token=os.environ.get("CALROUTE_ADMIN_TOKEN") or None,
                engine_api_key=os.environ.get("CALROUTE_ENGINE_API_KEY") or None,
            ),
        )
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
