"""The package's import boundaries, read from the sources with ast: nothing here imports the modules checked.

Every ``import`` and ``from ... import`` of calroute counts, wherever it stands: at module level, inside a
function (the CLI's lazy imports) or under ``if TYPE_CHECKING:``. ``from calroute.a import b`` depends on
``calroute.a`` and, when ``b`` is a module, on ``calroute.a.b`` too.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "calroute"

# The only modules at the package root; everything else lives in a part (a subpackage).
ROOT_MODULES = {
    "__init__": "the package (empty)",
    "__main__": "`python -m calroute`: the CLI",
    "types": "the values every part shares",
    "errors": "the exceptions every part raises",
    # the uvloop runner the three event-loop servers share (the proxy, the engine emulator, the load
    # generator): below all three of them, so at the root
    "aio": "the shared uvloop runner (and running until SIGINT or SIGTERM)",
    # one seeded 64-bit mixer for the random policies' picks, the workload's prompts and the emulator's tokens
    "splitmix": "the splitmix64 mixing function every seeded stream derives from",
}

# Lowest first. A part imports only parts of lower layers (and itself): parts of one layer are independent.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "types", "errors", "aio", "splitmix"),
    # report/: plots from numbers, nothing of calroute above the root; executors/: where work runs;
    # kvcache/: an engine's KV blocks and prefix cache, the one model the simulator and the emulator share
    ("costmodel", "workload", "report", "executors", "kvcache"),
    ("policies", "results"),
    ("routing",),  # router, ledger, seeds: what the simulator and the proxy share
    # contract/: what calroute promises vLLM and reads from it (handoff bodies, KV events, blocks, metric
    # names, the tokenizer interface), below everything that talks to an engine
    ("contract",),
    # cluster/: the cluster file and the engines' launchers; tokenizer/: the served model's own tokenizer
    ("sim", "cluster", "tokenizer"),
    # emulator/: a test double and a demo of a vLLM engine, beside the proxy so that neither imports the other
    ("proxy", "calibrate", "emulator"),
    ("harness",),  # live runs: a proxy in front of engines, the load generator
    ("experiments",),
    ("tuning",),  # searches a policy's parameters on the simulator: runs experiments' simulated runs
    ("cli",),
    ("__main__",),
)
LAYER = {part: i for i, layer in enumerate(LAYERS) for part in layer}


@dataclass(frozen=True)
class Import:
    module: str  # the importer, e.g. calroute.proxy.app
    target: str  # a calroute module it depends on
    line: int

    def __str__(self) -> str:
        return f"{self.module} imports {self.target} (line {self.line})"


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports_of(module: str, source: str, is_package: bool, modules: set[str]) -> list[Import]:
    """Every import of calroute in ``source`` (the module ``module``), at any depth of the tree."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..a import b
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append(Import(module, base, node.lineno))
            found += [
                Import(module, f"{base}.{a.name}", node.lineno)
                for a in node.names
                if f"{base}.{a.name}" in modules
            ]
    return [i for i in found if i.target.split(".")[0] == "calroute" and i.target != module]


def part(module: str) -> str:
    """calroute.proxy.http.client -> proxy; calroute.types -> types; calroute -> __init__."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def _package() -> tuple[dict[str, Path], list[Import]]:
    paths = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
    found = [
        i for m, p in paths.items() for i in imports_of(m, p.read_text(), p.name == "__init__.py", set(paths))
    ]
    return paths, found


MODULES, IMPORTS = _package()


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, as the modules along it (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


# ---- the reader itself -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("calroute.a.x", "import calroute.b.y\nimport json", {"calroute.b.y"}),
        ("calroute.a.x", "from calroute.b import y, z", {"calroute.b", "calroute.b.y"}),
        ("calroute.a.x", "def f():\n    from calroute.c import k", {"calroute.c"}),
        (
            "calroute.a.x",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from calroute.c import k",
            {"calroute.c"},
        ),
        (
            "calroute.a.x",
            "from . import w\nfrom ..b.y import q",
            {"calroute.a", "calroute.a.w", "calroute.b.y"},
        ),
    ],
    ids=["import", "from, a submodule", "in a function", "TYPE_CHECKING", "relative"],
)
def test_every_kind_of_import_is_seen(module: str, source: str, expected: set[str]) -> None:
    known = {"calroute.b.y", "calroute.a.w"}
    assert {i.target for i in imports_of(module, source, False, known)} == expected


def test_the_reader_sees_the_package() -> None:
    assert "calroute.proxy.app" in MODULES
    assert any(i.module == "calroute.cli.app" and i.target == "calroute.cli.demo" for i in IMPORTS)  # lazy


# ---- the boundaries ----------------------------------------------------------------------------------


def test_no_import_cycle_between_modules() -> None:
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if i.target in MODULES:
            edges.setdefault(i.module, set()).add(i.target)
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_only_the_root_modules_at_the_root() -> None:
    at_root = {p.stem for p in SRC.glob("*.py")}
    assert at_root == set(ROOT_MODULES), (
        f"move into a part, or add to ROOT_MODULES: {at_root ^ set(ROOT_MODULES)}"
    )


def test_every_part_has_a_layer() -> None:
    parts = {part(m) for m in MODULES}
    assert parts == set(LAYER), (
        f"place in LAYERS: {sorted(parts - set(LAYER))}; gone: {sorted(set(LAYER) - parts)}"
    )


Forbidden = Callable[[str, str], bool]  # (importer's part, imported part) -> forbidden

BOUNDARIES: dict[str, Forbidden] = {
    "policies/ imports only the root modules, costmodel/ and policies/": lambda src, dst: (
        src == "policies" and dst not in {"types", "errors", "splitmix", "costmodel", "policies"}
    ),
    "routing/ never imports proxy, sim, harness, calibrate, cli, experiments or emulator": lambda src, dst: (
        src == "routing" and dst in {"proxy", "sim", "harness", "calibrate", "cli", "experiments", "emulator"}
    ),
    # The emulator is a test double and a demo: what the proxy needs of an engine is in contract/ (and a
    # tokenizer is handed to it), so the proxy runs the same in front of real vLLM.
    "nothing but cli/ imports the emulator": lambda src, dst: (
        dst == "emulator" and src not in {"emulator", "cli", "__main__"}
    ),
    "nothing outside cli/ imports cli/ (but __main__)": lambda src, dst: (
        dst == "cli" and src not in {"cli", "__main__"}
    ),
    "a part imports only parts of lower layers (LAYERS)": lambda src, dst: (
        src != dst and LAYER.get(dst, len(LAYERS)) >= LAYER.get(src, -1)
    ),
}


@pytest.mark.parametrize(
    ("rule", "importer", "imported"),
    [
        ("nothing but cli/ imports the emulator", "proxy", "emulator"),
        ("nothing but cli/ imports the emulator", "harness", "emulator"),
        ("a part imports only parts of lower layers (LAYERS)", "proxy", "emulator"),
        ("a part imports only parts of lower layers (LAYERS)", "contract", "proxy"),
        ("a part imports only parts of lower layers (LAYERS)", "cluster", "emulator"),
        ("nothing outside cli/ imports cli/ (but __main__)", "experiments", "cli"),
        ("policies/ imports only the root modules, costmodel/ and policies/", "policies", "routing"),
        ("policies/ imports only the root modules, costmodel/ and policies/", "policies", "workload"),
    ],
)
def test_a_forbidden_import_breaks_its_rule(rule: str, importer: str, imported: str) -> None:
    assert BOUNDARIES[rule](importer, imported)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [("proxy", "contract"), ("emulator", "contract"), ("proxy", "cluster"), ("cli", "emulator")],
)
def test_the_allowed_imports_break_no_rule(importer: str, imported: str) -> None:
    assert not any(forbidden(importer, imported) for forbidden in BOUNDARIES.values())


@pytest.mark.parametrize("rule", BOUNDARIES)
def test_boundary(rule: str) -> None:
    forbidden = BOUNDARIES[rule]
    crossing = [str(i) for i in IMPORTS if forbidden(part(i.module), part(i.target))]
    assert not crossing, f"{rule}:\n" + "\n".join(crossing)


def test_every_folder_is_a_package() -> None:
    # setuptools' package discovery (pyproject: packages.find) skips a folder without __init__.py, so a
    # namespace package would import from a checkout and be missing from an install or the compiled build.
    folders = {p.parent for p in SRC.rglob("*.py")}
    assert sorted(str(f.relative_to(SRC)) for f in folders if not (f / "__init__.py").exists()) == []
