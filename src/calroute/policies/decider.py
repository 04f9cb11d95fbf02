"""The conditional-disaggregation deciders' shared base: an inner policy picks the pair, the decider says
whether the chosen decode engine prefills the prompt itself (a local decision, RouteDecision.local).

This is how the peers do it: llm-d picks the decode pod first and its P/D decider then adds a prefill pod or
not; Dynamo's prefill router peeks at the decode worker its decode router would pick, then asks its
conditional-disaggregation policy; vllm-router's P/D bypass looks at the decode worker its policy picked.
Here the inner policy picks both engines as it always does (a pure function of the view, so the prefill pick
does not depend on whether it is used), and a decider (``decide``) keeps the decode pick either way:

- local: ``local_decision(decode_id, reason, decode_scores)``, the inner's decode scores kept;
- disaggregated: the inner decision with the decider's ``reason``.

An inner decision that is local already (marginal_cost with ``local_prefill``) is returned as it is. The inner
policy is any registered policy but a simulator-only one and a decider (deciders do not nest). Its parameters
come as one string, ``inner_params`` = "NAME=VALUE,NAME=VALUE", checked against the inner policy's Params
when the decider's are (a --param, a params file): ``--param pd_llmd.inner_params=w_prefix=2,w_queue=1``.
A seeded inner policy (random, power_of_two) keeps its own ``seed`` (0 unless ``inner_params`` names one):
the run's policy seed goes only to a policy registered as seeded, which no decider is.

What the router reads off a policy, the decider forwards from its inner one: ``reads_engine_samples`` (the
proxy scrapes the engines' metrics only for a policy that reads them; an instance attribute here, where the
policies' own is a class attribute, since it depends on the inner policy), ``reads_active_blocks`` and
``prefix_source`` (routing/router.py, ``_follow_policy``). The deciders read only the ledger's fields and
``cached_tokens`` themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies.base import parse_params
from calroute.policies.catalog import inner_policy, make_inner
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision, local_decision


def parse_inner_params(spec: str) -> dict[str, str]:
    """``NAME=VALUE,NAME=VALUE`` as a mapping of raw values (an empty string: none); a ValueError names what
    is wrong."""
    out: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"inner_params: expected NAME=VALUE[,NAME=VALUE...], got {item!r} in {spec!r}")
        if key in out:
            raise ValueError(f"inner_params: {key!r} given twice in {spec!r}")
        out[key] = value.strip()
    return out


def check_inner(inner: str, inner_params: str) -> None:
    """The inner policy and its parameters, checked as the decider's Params are (a ValueError, which
    parse_params turns into a ConfigError naming the decider)."""
    r = inner_policy(inner)
    raw = parse_inner_params(inner_params)
    try:
        parse_params(inner, r.params, raw)
    except ConfigError as e:
        raise ValueError(f"inner_params: {e}") from e


@dataclass(frozen=True)
class DeciderParams:
    """The parameters every decider has: its inner policy (each decider's Params sets its own default) and
    that policy's parameters."""

    inner: str = ""
    inner_params: str = ""

    def __post_init__(self) -> None:
        check_inner(self.inner, self.inner_params)


def member(pool: tuple[InstanceState, ...], instance_id: str) -> InstanceState:
    """The member of ``pool`` named ``instance_id`` (one the inner policy chose from it)."""
    for s in pool:
        if s.instance_id == instance_id:
            return s
    raise ValueError(f"{instance_id!r} is not in the pool the inner policy chose from")


def uncached_tokens(prompt_tokens: int, cached_tokens: int) -> int:
    """The prompt's tokens an engine expected to hold ``cached_tokens`` of would compute (never below 0)."""
    return prompt_tokens - cached_tokens if cached_tokens < prompt_tokens else 0


class Decider:
    """An inner policy's pair, then ``decide``: local on its decode engine, or the pair as it is.

    Subclasses set ``name`` and implement ``decide``; ``local`` and ``remote`` build its two answers.
    """

    name: ClassVar[str]

    def __init__(self, params: DeciderParams, calibration: Calibration) -> None:
        self.params = params
        self.inner = make_inner(params.inner, parse_inner_params(params.inner_params), calibration)
        inner: Any = self.inner
        self.reads_engine_samples: bool = bool(inner.reads_engine_samples)
        self.reads_active_blocks: bool = bool(getattr(inner, "reads_active_blocks", False))
        self.prefix_source: str | None = getattr(inner, "prefix_source", None)

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        d = self.inner.route(adm, view)
        if d.local:
            return d
        return self.decide(adm, view, d)

    def decide(self, adm: Admission, view: ClusterView, d: RouteDecision) -> RouteDecision:
        """Local on ``d.decode_id`` (``local``) or disaggregated as ``d`` (``remote``)."""
        raise NotImplementedError

    @staticmethod
    def local(d: RouteDecision, reason: str) -> RouteDecision:
        return local_decision(d.decode_id, reason, d.decode_scores)

    @staticmethod
    def remote(d: RouteDecision, reason: str) -> RouteDecision:
        return d.replace(reason=reason)
