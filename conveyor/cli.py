"""The ``conveyor`` command: run | plan | plugins | report | clean | serve | submit | new.

``run`` and ``plan`` hand their arguments to Hydra (overrides ``source.path=... degree=4``, ``-m``
sweeps, ``--cfg job``, ``--help``); the other commands are argparse subcommands. Errors print as
one line and a hint on stderr with the error's exit code; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any

from conveyor import clihydra
from conveyor.clihydra import cmd_hydra
from conveyor.cliout import EXIT_CONFIG, quiet_libraries, report_error, stderr_line

EPILOG = """\
run and plan take Hydra overrides (source.path=... degree=4) and Hydra's own options
(conveyor run --help lists them; --cfg job prints the composed config; -m sweeps).

exit codes: 0 ok, 1 internal error, 2 config/plugin/planning, 3 connection, 4 schema, 5 transfer,
6 verification, 130 cancelled. A run writes report.json in its Hydra run directory (or --report PATH).
"""

#: the commands whose arguments go to Hydra as they are (listed by --help, parsed by Hydra)
HYDRA_COMMANDS = {
    "run": "run a job: conveyor run pipeline=demo degree=4 (-m sweeps: -m strategy=none,files)",
    "plan": "print the partitions and what each reads; moves nothing",
    "verify": "compare a job's target with its source, row for row by key and checksum (any engines); moves nothing",
}


class _Parser(argparse.ArgumentParser):
    """argparse with Conveyor's way of saying no: one line, a hint, exit code 2."""

    def error(self, message: str) -> Any:
        stderr_line(f"error: {self.prog}: {message}")
        stderr_line(f"hint: {self.prog} --help lists the options")
        sys.exit(EXIT_CONFIG)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of the non-Hydra commands (run and plan are listed and handed to Hydra)."""
    from conveyor import __version__

    parser = _Parser(prog="conveyor", description="Move tables between databases and files, in parallel, from YAML configs.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"conveyor {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and debug logging (anywhere on the line)")
    parser.add_argument("--report", metavar="PATH", help="run: also write report.json to PATH (anywhere on the line)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="json: every line on stderr one JSON object, for log shippers (also CONVEYOR_LOG_FORMAT=json)")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name, text in HYDRA_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    sub.add_parser("plugins", help="list installed sources, sinks, strategies and runtimes")
    p = sub.add_parser("report", help="a table of a sweep's jobs, and a plot of rows/s against degree (report.png)")
    p.add_argument("multirun_dir", help="the directory of a `conveyor run -m` sweep")
    p.add_argument("--png", metavar="PATH", help="where the plot goes (default: <multirun dir>/report.png; none: no plot)")
    p = sub.add_parser("clean", help="list staging tables left by runs that are gone (--drop removes them)")
    p.add_argument("--drop", action="store_true", help="remove the stale ones (tables in use by a running job are kept)")
    p.add_argument("overrides", nargs="*", help="sink=... and sink.* overrides, as for run")
    p = sub.add_parser("serve", help="serve a source as Arrow Flight, one endpoint per partition")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8815, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--name", default="data", help="the flight's descriptor path (default: %(default)s)")
    p.add_argument("--token-env", metavar="VAR", help="require `authorization: Bearer $VAR` on every call")
    p.add_argument("overrides", nargs="*", help="source=... strategy=... degree=... overrides, as for run")
    p = sub.add_parser("submit", help="send a job to a Ray cluster through Ray's job submission API")
    p.add_argument("--address", help="the cluster's dashboard URL (default: $RAY_API_SERVER_ADDRESS, else http://127.0.0.1:8265)")
    p.add_argument("--follow", action="store_true", help="print the job's log as it runs")
    p.add_argument("--no-wait", dest="wait", action="store_false", help="return once the job is submitted")
    p.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS", help="stop the job after this long (default: %(default)s)")
    p.add_argument("--run-dir", metavar="DIR", help="where the run's report.json and manifest.json come back to "
                   "(default: outputs/submitted/<job id>; resume=DIR submits a resume of that run)")
    p.add_argument("overrides", nargs="*", help="the job's overrides, as for run")
    p = sub.add_parser("init", help="write a job of your own as YAML: conveyor init jobs/nightly.yaml pipeline=pg_to_pg ...")
    p.add_argument("path", help="the YAML file to write (its folder is the --config-dir that runs it)")
    p.add_argument("overrides", nargs="*", help="the job's overrides, as for run")
    p.add_argument("--force", action="store_true", help="replace the file if it exists")
    p = sub.add_parser("new", help="start a package: conveyor new connector NAME")
    p.add_argument("what", choices=["connector"], help="what to create")
    p.add_argument("name", help="the connector's name (a Python identifier)")
    p.add_argument("--dir", default=".", help="where to create conveyor-NAME/ (default: the current directory)")
    p.add_argument("--sink", action="store_true", help="a sink too, beside the source")
    return parser


def _global_flags(args: list[str]) -> tuple[list[str], bool, str | None]:
    """-v/--verbose and --report PATH wherever they are written (also after run's overrides)."""
    from conveyor.errors import ConfigError

    verbose, report, rest, i = False, None, [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("-v", "--verbose"):
            verbose = True
        elif arg == "--report":
            if i + 1 >= len(args):
                raise ConfigError("--report needs a path", key="--report")
            report = args[i + 1]
            i += 1
        elif arg.startswith("--report="):
            report = arg.split("=", 1)[1]
        elif arg == "--log-format" or arg.startswith("--log-format="):
            fmt = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if "=" in arg else 1
            if fmt not in ("text", "json"):
                raise ConfigError(f"--log-format: {fmt!r} is not text or json", key="--log-format")
            from conveyor.log import set_format

            set_format(fmt)
        else:
            rest.append(arg)
        i += 1
    return rest, verbose, report


def parse_command(args: list[str]) -> argparse.Namespace:
    """A non-Hydra command's arguments; options may come before, between or after the overrides."""
    parser = build_parser()
    ns, extra = parser.parse_known_args(args)
    unknown = [a for a in extra if a.startswith("-")]
    if unknown or (extra and not hasattr(ns, "overrides")):
        _Parser(prog=f"conveyor {ns.command}").error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        ns.overrides = [*ns.overrides, *extra]
    return ns


def _cmd_completion(args: list[str], verbose: bool) -> int:
    """``conveyor -sc install=bash`` prints Hydra's script, which completes ``conveyor`` by calling
    ``conveyor -sc query=bash`` with the whole line in COMP_LINE: while the first word is typed this
    answers the command names; after run or plan, Hydra completes the overrides."""
    what = args[1] if len(args) > 1 else args[0].partition("=")[2]
    if not what.startswith("query"):
        return cmd_hydra("run", args, verbose)
    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    if len(words) < 2 or (len(words) == 2 and not line.endswith(" ")):
        prefix = words[1] if len(words) == 2 else ""
        print(" ".join(c for c in (*HYDRA_COMMANDS, *OTHER_COMMANDS) if c.startswith(prefix)))
        return 0
    if words[1] not in HYDRA_COMMANDS:
        return 0
    os.environ["COMP_LINE"] = line.replace(f" {words[1]}", "", 1)  # Hydra strips the program's name, not the command's
    return cmd_hydra(words[1], args, verbose)





def _cmd_clean(overrides: list[str], drop: bool) -> int:
    """List what a job left behind (staging tables of runs that are gone; a sync job's slot and state); ``--drop`` removes them."""
    from conveyor.pipelines.run import clean
    from conveyor.submit import compose

    for line in clean(compose(overrides), drop):
        print(line)
    return 0


def _cmd_plugins() -> int:
    from conveyor import registry

    for kind, title in zip(registry.KINDS, ("sources", "sinks", "strategies", "runtimes")):
        print(f"{title}:")
        for entry in registry.available(kind):
            origin = "" if entry.distribution == "conveyor" else f"  [{entry.distribution}]"
            print(f"  {entry.name:<12} {entry.value}{origin}")
    return 0






































OTHER_COMMANDS = ("plugins", "report", "clean", "serve", "submit", "init", "new")


def arrow_allocator_default() -> None:
    """The allocator pyarrow gives a ``conveyor`` process (and the Ray workers its private instance
    starts, which inherit its environment): the system's, unless ``ARROW_DEFAULT_MEMORY_POOL`` names
    one: pyarrow's own default (mimalloc) kept more memory at its peak at the same CPU
    (benchmarks/results/design-measurements.md, "Arrow's allocator"). Set before pyarrow is
    imported: it reads the variable once. A library user's process is left as it is (``run_job``
    sets nothing); a joined cluster's workers keep their own."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def blas_threads_default() -> None:
    """One OpenBLAS thread for a ``conveyor`` process (and the Ray workers its private instance
    starts), unless ``OPENBLAS_NUM_THREADS`` says otherwise. Nothing of Conveyor does linear algebra,
    but pyarrow imports numpy where it is installed (Ray needs it), and numpy's OpenBLAS then starts
    a thread per further core that spins for a while before it sleeps, CPU taken from the database
    servers on the same cores (benchmarks/results/design-measurements.md, "OpenBLAS threads").
    Set before numpy is imported: OpenBLAS reads it once. A library user's process is left as it is, as with the allocator."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def entry() -> None:
    """The ``conveyor`` command (the console script): :func:`main`, then a quick exit.

    What a normal interpreter exit does for the job's sake is done first: the threads it waits for
    are joined (a joined Ray cluster being left), the exit handlers run (Ray's, logging's flush of
    Hydra's log file, weakref finalizers), and Python's and C's output buffers are flushed. Then
    ``os._exit`` skips only the teardown of every module and object one by one, a noticeable share of
    a small job's time (benchmarks/results/design-measurements.md, "Interpreter exit"). ``main`` itself
    returns as before (tests and library callers run it in their own process).

    ``run`` and ``plan`` start without Python's cyclic garbage collector: importing, composing,
    describing and planning make a few hundred thousand long-lived objects and next to no garbage,
    and its passes over them cost a small job time for nothing. Once the job is planned they are
    frozen out of its sight (``gc.freeze``) and it runs again for the transfer (:func:`_progress`)."""
    import gc

    with contextlib.suppress(Exception):  # main() says what is wrong with the arguments
        rest = _global_flags(sys.argv[1:])[0]
        if rest and rest[0] in HYDRA_COMMANDS:
            gc.disable()
    code = main()
    try:
        _before_exit()
    finally:
        os._exit(code)


def _before_exit() -> None:
    """Python's exit steps that matter to the job, in its order: threading's own shutdown (its exit
    callbacks, which tell idle thread-pool workers to stop, then every non-daemon thread joined: a
    library's pool left open would otherwise be waited for for ever), then the atexit handlers."""
    from conveyor.compat import interpreter_exit_steps

    interpreter_exit_steps()  # what the interpreter itself runs at exit (os._exit does not run them again)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (conveyor plan | head): nothing left to say
            stream.flush()
    with contextlib.suppress(Exception):  # what native libraries wrote through C's stdio
        import ctypes

        ctypes.CDLL(None).fflush(None)


def main(argv: list[str] | None = None) -> int:
    arrow_allocator_default()
    blas_threads_default()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        args, verbose, report = _global_flags(args)
    except Exception as exc:
        return report_error(exc, False)
    clihydra.REPORT_PATH[:] = [report] if report else []
    from conveyor.log import set_level

    set_level(verbose)
    first = args[0] if args else ""
    if first and not first.startswith("-") and first not in HYDRA_COMMANDS and first not in OTHER_COMMANDS:
        stderr_line(f"error: unknown command {first!r}")
        stderr_line(f"hint: commands are {', '.join((*HYDRA_COMMANDS, *OTHER_COMMANDS))} (conveyor --help)")
        return EXIT_CONFIG
    try:
        if first in ("-sc", "--shell-completion") or first.startswith("--shell-completion="):
            return _cmd_completion(args, verbose)
        if first in HYDRA_COMMANDS:
            from conveyor.telemetry import from_environment

            with from_environment():  # OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER: the job's trace and metrics
                return cmd_hydra(first, args[1:], verbose)
        if not args:
            build_parser().print_help(sys.stderr)
            return EXIT_CONFIG
        ns = parse_command(args)
        return _dispatch(ns)
    except KeyboardInterrupt:
        stderr_line("error: cancelled (Ctrl-C)")
        return 130
    except Exception as exc:
        return report_error(exc, verbose)


def _dispatch(ns: argparse.Namespace) -> int:
    if ns.command == "plugins":
        return _cmd_plugins()
    if ns.command == "report":
        from pathlib import Path

        from conveyor.pipelines.report import multirun_markdown, multirun_plot

        print(multirun_markdown(ns.multirun_dir))
        if ns.png != "none":
            print(f"plot: {multirun_plot(ns.multirun_dir, ns.png or Path(ns.multirun_dir) / 'report.png')}")
        return 0
    if ns.command == "clean":
        return _cmd_clean(ns.overrides, ns.drop)
    if ns.command == "init":
        from conveyor.scaffold import new_job

        print(new_job(ns.path, ns.overrides, ns.force))
        return 0
    if ns.command == "new":
        from conveyor.scaffold import new_connector

        print(new_connector(ns.name, ns.dir, sink=ns.sink))
        return 0
    quiet_libraries()
    if ns.command == "serve":
        from conveyor import serve

        return serve.serve(serve.ServeArgs(overrides=ns.overrides, host=ns.host, port=ns.port, name=ns.name, token_env=ns.token_env))
    from conveyor import submit

    return submit.submit(submit.SubmitArgs(overrides=ns.overrides, address=ns.address, wait=ns.wait, follow=ns.follow, timeout=ns.timeout,
                                           run_dir=ns.run_dir))


if __name__ == "__main__":  # pragma: no cover - python -m conveyor.cli: the same exit as the conveyor command
    entry()
