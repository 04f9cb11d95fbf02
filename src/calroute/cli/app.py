"""The calroute command line: thin wrappers over library functions; logging and output live here only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calroute.cli.bench import bench
from calroute.cli.calibrate import calibrate
from calroute.cli.common import exit_on_error
from calroute.cli.engines import engines_app
from calroute.cli.experiment import experiment, report
from calroute.cli.run import run
from calroute.cli.serve import serve
from calroute.cli.simulate import profile_cmd, simulate
from calroute.cli.tune import tune
from calroute.cluster.procs import stop_on_sigterm
from calroute.errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.add_typer(engines_app, name="engines")
app.command()(simulate)
app.command()(serve)
app.command()(experiment)
app.command()(run)
app.command()(bench)
app.command()(calibrate)
app.command()(tune)
app.command("report")(report)
app.command("profile")(profile_cmd)


@app.command()
def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="where the report goes")] = Path("out/demo"),
    seeds: Annotated[int, typer.Option(help="arrival traces, run live and on the simulator")] = 1,
) -> None:
    """The main job: an emulated 2P+4D cluster, calibrated; five routers on shared prefixes, live."""
    from calroute.cli.demo import run_demo

    with exit_on_error():
        if not 1 <= seeds <= 10:
            raise ConfigError(f"--seeds must be in [1, 10], got {seeds}")
        run_demo(out_dir, seeds)


def main() -> None:
    # Long-running subcommands that serve (`serve`, `engines emulate`) install their own SIGTERM handlers.
    stop_on_sigterm()
    app()
