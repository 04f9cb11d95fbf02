"""The docs name only files that exist, and nothing committed names a path of the machine it was made on.

A path counts when it starts at a root of the repository (``src/``, ``docs/``, ``tests/``, ``benchmarks/``,
``scripts/``, ``data/``), when it is a package-relative file the docs write short (``proxy/app.py``, read as
``src/calroute/proxy/app.py``), when it is a Markdown link's target (relative to the doc that holds it), or
when it starts with ``../shared/`` (the design folder beside the clone, checked where it is there). A doc that
needs an example path that does not exist names it in ``EXAMPLES``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "calroute"
# The design folder lives beside the repository, here and in CI (../shared); absent, its paths go unchecked.
SHARED = ROOT.parent / "shared"

DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# Paths the docs give as examples of what a user writes or a command makes: none of them is in the repository.
EXAMPLES = frozenset(
    {
        "docs/results/tuning/W.json",  # one file per family: W stands for the family's name
        "docs/results/tuning/clairvoyant-W.json",
        "docs/results/tuning/oracle-W.json",  # its name before the rename, in docs/journal/tuning.md
        "src/calroute/policies/least_kv.py",  # the policy docs/guides/add-a-policy.md walks through
        "tests/policies/test_least_kv.py",
    }
)

REPO_ROOTS = ("src", "docs", "tests", "benchmarks", "scripts", "data")
# Package parts the layout has retired: a short form naming one is stale, so it is checked like a live one.
RETIRED_PARTS = ("engines",)
_PARTS = tuple(sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")))  # the subpackages

# A path token: not glued to a word, a dot, a slash or a dash before it; ends on a word character (a
# sentence's full stop or a closing bracket is not part of it).
_ROOTED = re.compile(rf"(?<![\w./~-])((?:{'|'.join(REPO_ROOTS)})/[\w./-]*[\w/])")
_SHORT = re.compile(rf"(?<![\w./~-])((?:{'|'.join(_PARTS + RETIRED_PARTS)})/[\w/]*\.(?:py|c))\b")
# A module by its import path (``calroute.results.stats``) or an object in one (``calroute.types.Admission``).
_MODULE = re.compile(r"(?<![\w./-])calroute((?:\.\w+)+)")
_SHARED_REF = re.compile(r"(?<![\w./~-])\.\./shared/([\w./-]*\w)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")

# A machine's own folders: a file that names one was made on that machine and points nowhere on another.
_ABSOLUTE = re.compile(r"(?<![\w.~:/-])/(?:tmp|root|home|work|Users|mnt|scratch)/[\w.-]")
TEXT_SUFFIXES = frozenset({".md", ".json", ".jsonl", ".csv", ".txt", ".yaml", ".yml", ".py", ".sh", ".toml"})


def _is_experiment_section(doc: Path) -> bool:
    """An experiment's report section as committed: docs/results/<backend>/<experiment>/report.md."""
    return doc.name == "report.md" and doc.parent.parent.parent == ROOT / "docs" / "results"


def _module_file(names: list[str]) -> Path:
    """The file (or package) behind a dotted name under calroute, whose last part may be an object in it;
    where the module would be when there is none."""
    module = PACKAGE.joinpath(*names)
    for candidate in (module.with_suffix(".py"), module, PACKAGE.joinpath(*names[:-1]).with_suffix(".py")):
        if candidate.exists():
            return candidate
    return module.with_suffix(".py")


def paths_in(text: str, doc: Path) -> list[tuple[int, str, Path | None]]:
    """Every path ``text`` (the text of ``doc``) names, in reading order: (line, as written, where it must
    exist; None when it cannot be checked here)."""
    found: list[tuple[int, int, str, Path | None]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _ROOTED.finditer(line):
            found.append((number, match.start(), match.group(1), ROOT / match.group(1)))
        for match in _SHORT.finditer(line):
            found.append((number, match.start(), match.group(1), PACKAGE / match.group(1)))
        for match in _MODULE.finditer(line):
            found.append((number, match.start(), match.group(0), _module_file(match.group(1)[1:].split("."))))
        for match in _SHARED_REF.finditer(line):
            where = SHARED / match.group(1) if SHARED.is_dir() else None
            found.append((number, match.start(), match.group(0), where))
        for match in _LINK.finditer(line):
            target = match.group(1)
            relative = target.split("#", 1)[0]
            if not relative or "://" in relative or relative.startswith("mailto:"):
                continue
            if _is_experiment_section(doc) and relative.endswith(".png"):
                # A section links its plots as `calroute report` assembles it (DIR/report.md, plots in
                # DIR/<experiment>/); a committed section keeps its plots in its own folder.
                relative = Path(relative).name
            found.append((number, match.start(), target, (doc.parent / relative).resolve()))
    return [(number, written, where) for number, _, written, where in sorted(found, key=lambda f: f[:2])]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = [
        f"{doc.relative_to(ROOT)}:{line}: {written}"
        for line, written, path in paths_in(doc.read_text(encoding="utf-8"), doc)
        if path is not None and written not in EXAMPLES and not path.exists()
    ]
    assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)


def _repository_files(under: str) -> list[Path]:
    """The files git keeps (or would add) under ``under``: build output and ignored scratch are not
    committed."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", under],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        target = ROOT / under
        return [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


@pytest.mark.parametrize("under", ["README.md", "docs", "benchmarks"])
def test_no_committed_file_names_an_absolute_path_of_a_machine(under: str) -> None:
    offending: list[str] = []
    for path in _repository_files(under):
        if path.suffix not in TEXT_SUFFIXES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _ABSOLUTE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            offending.append(f"{path.relative_to(ROOT)}:{line}: {text[match.start() : match.start() + 60]!r}")
    assert not offending, "absolute paths of the machine a file was made on:\n" + "\n".join(offending)


def test_the_path_reader_finds_each_form() -> None:
    """The forms the docs use, read as the checks read them (a reader that finds nothing passes every doc)."""
    text = (
        "See `src/calroute/proxy/app.py`, docs/prefix.md. and proxy/generate.py, a [link](../README.md#x),\n"
        "the notes in ../shared/reference/paper-notes.md, and not vllm/distributed/kv_events.py nor /tmp/x.\n"
        "`calroute.results.stats`, calroute.types.Admission.\n"
    )
    doc = ROOT / "docs" / "_reader_example.md"
    found = paths_in(text, doc)
    written = [w for _, w, _ in found]
    assert written == [
        "src/calroute/proxy/app.py",
        "docs/prefix.md",
        "proxy/generate.py",
        "../README.md#x",
        "../shared/reference/paper-notes.md",
        "calroute.results.stats",
        "calroute.types.Admission",
    ]
    where = {w: p for _, w, p in found}
    assert where["proxy/generate.py"] == PACKAGE / "proxy" / "generate.py"
    assert where["../README.md#x"] == ROOT / "README.md"
    assert where["calroute.types.Admission"] == PACKAGE / "types.py"
    assert _ABSOLUTE.findall("out: /tmp/run, https://host/home/x, ipc:///tmp/s") == ["/tmp/r"]


def test_the_readme_layout_lists_every_part() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listed = {line.split()[0].rstrip("/") for line in layout.splitlines() if line.startswith("  ")}
    assert set(_PARTS) <= listed, f"parts missing from the README's Layout: {sorted(set(_PARTS) - listed)}"
