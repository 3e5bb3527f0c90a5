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
import traceback
from collections.abc import Iterator
from typing import Any

EXIT_INTERNAL = 1
EXIT_CONFIG = 2

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
}


class _Parser(argparse.ArgumentParser):
    """argparse with Conveyor's way of saying no: one line, a hint, exit code 2."""

    def error(self, message: str) -> Any:
        _stderr(f"error: {self.prog}: {message}")
        _stderr(f"hint: {self.prog} --help lists the options")
        sys.exit(EXIT_CONFIG)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of the non-Hydra commands (run and plan are listed and handed to Hydra)."""
    from conveyor import __version__

    parser = _Parser(prog="conveyor", description="Move tables between databases and files, in parallel, from YAML configs.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"conveyor {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and debug logging (anywhere on the line)")
    parser.add_argument("--report", metavar="PATH", help="run: also write report.json to PATH (anywhere on the line)")
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
        return _cmd_hydra("run", args, verbose)
    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    if len(words) < 2 or (len(words) == 2 and not line.endswith(" ")):
        prefix = words[1] if len(words) == 2 else ""
        print(" ".join(c for c in (*HYDRA_COMMANDS, *OTHER_COMMANDS) if c.startswith(prefix)))
        return 0
    if words[1] not in HYDRA_COMMANDS:
        return 0
    os.environ["COMP_LINE"] = line.replace(f" {words[1]}", "", 1)  # Hydra strips the program's name, not the command's
    return _cmd_hydra(words[1], args, verbose)

def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def report_error(exc: BaseException, verbose: bool) -> int:
    """Print an error as one line plus its hint; return the exit code."""
    from conveyor.errors import ConveyorError, JobFailed, missing_extra

    if isinstance(exc, JobFailed):  # a failed run: say what stopped it
        exc = exc.cause
    if isinstance(exc, BrokenPipeError):  # the reader went away (conveyor plugins | head): nothing more to say
        with contextlib.suppress(Exception):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a process ended by SIGPIPE
    exc = missing_extra(exc) or exc
    if isinstance(exc, ConveyorError):
        if verbose:
            _stderr("".join(traceback.format_exception(exc)).rstrip())
            if exc.task_traceback:
                _stderr("in the task:\n" + exc.task_traceback.rstrip())
        _stderr(f"error: {exc.message}")
        if exc.hint:
            _stderr(f"hint: {exc.hint}")
        return exc.exit_code
    if verbose:
        _stderr("".join(traceback.format_exception(exc)).rstrip())
    first = (str(exc).splitlines() or [""])[0]
    _stderr(f"error: internal error: {type(exc).__name__}: {first}")
    _stderr("hint: run again with --verbose for the traceback, and please report it")
    return EXIT_INTERNAL


def _cmd_clean(overrides: list[str], drop: bool) -> int:
    """List a sink's leftovers (staging tables of runs that are gone); ``--drop`` removes them."""
    from conveyor.config import build_job
    from conveyor.core import SupportsCleanup
    from conveyor.submit import compose

    spec = build_job(compose(overrides), kinds=("sink",))
    if not isinstance(spec.sink, SupportsCleanup):
        print(f"sink {spec.names['sink']}: keeps no staging objects to clean")
        return 0
    found = spec.sink.leftovers(remove=drop)
    for line in found:
        print(line)
    if not found:
        print("no staging tables found")
    elif not drop:
        print("run again with --drop to remove the stale ones (tables in use by a running job are kept)")
    return 0


def _cmd_plugins() -> int:
    from conveyor import registry

    for kind, title in zip(registry.KINDS, ("sources", "sinks", "strategies", "runtimes")):
        print(f"{title}:")
        for entry in registry.available(kind):
            origin = "" if entry.distribution == "conveyor" else f"  [{entry.distribution}]"
            print(f"  {entry.name:<12} {entry.value}{origin}")
    return 0


def _console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def _quiet_libraries() -> None:
    """Drivers' INFO chatter (e.g. botocore's "Found credentials") is not the user's business."""
    import logging

    for name in ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


REPORT_PATH: list[str] = []  # --report PATH, taken off the command line by main()


def _on_signal(signum: int, frame: Any) -> None:
    """First Ctrl-C / SIGTERM: stop starting partitions, roll back the running ones. Second: the process
    ends at once, by the signal's default action (however busy the main thread is in a native call; open
    transactions roll back with their connections)."""
    import signal

    from conveyor.core import request_cancel

    signal.alarm(0)  # an alarm a native library armed on the signal (absl's: abort in 3 s) would end the stop
    _stderr("interrupted: cancelling the running partitions (again to quit at once: they roll back with their connections)")
    request_cancel()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """Ctrl-C / SIGTERM cancel the run while it runs (:func:`_on_signal`); the handlers that were there
    before are put back after it, so a program that calls :func:`main` keeps its own."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, _on_signal)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _hydra_dir() -> Any:
    from pathlib import Path

    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under hydra.main
        return None


def _keep_config(cfg: Any, run_dir: Any) -> None:
    """The run's composed config and its command-line overrides in ``<run dir>/.hydra/`` (where Hydra keeps
    them), with every secret masked: Hydra's own copies are switched off (``hydra.output_subdir: null``),
    since they hold a secret resolved into the config as it is."""
    from omegaconf import OmegaConf

    from conveyor.secrets import mask, mask_override

    if run_dir is None:
        return
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
        if hydra.output_subdir is not None:  # the user asked Hydra for its copies: they are its own
            return
        overrides = list(hydra.overrides.task)
    except Exception:  # not under hydra.main
        return
    folder = run_dir / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    plain = OmegaConf.to_container(cfg, resolve=False)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(mask(plain))))
    (folder / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create([mask_override(o) for o in overrides])))


def _run_one(cfg: Any, mode: str, verbose: bool) -> int:
    """One composed config: plan it, or run it (conveyor.pipelines.run owns the run); print the outcome."""
    from pathlib import Path

    from conveyor.pipelines.report import plan_table, summary_table
    from conveyor.pipelines.run import RunPlace, plan_run, run
    from conveyor.submit import emit_run_files

    _quiet_libraries()
    console = _console()
    try:
        if mode == "plan":
            console.print(plan_table(plan_run(cfg)))
            return 0
        place = RunPlace(run_dir=_hydra_dir(), report_path=Path(REPORT_PATH[0]) if REPORT_PATH else None)
        _keep_config(cfg, place.run_dir)
        try:
            with _signals():
                report = run(cfg, place, progress=lambda plan: _progress(console, plan))
        finally:
            emit_run_files(place.run_dir)  # a job sent by conveyor submit: its files go back with the log
        console.print(summary_table(report))
        return 0
    except Exception as exc:  # the CLI's boundary: one line, an exit code
        return report_error(exc, verbose)


def _progress(console: Any, plan: Any) -> Any:
    from conveyor.runtime.progress import LogProgress, RichProgress

    _collector_back()

    info = plan.info
    if console.is_terminal:
        return RichProgress(console, info.estimated_rows, len(plan.partitions), total_bytes=info.estimated_bytes)
    return LogProgress(info.estimated_rows, len(plan.partitions), total_bytes=info.estimated_bytes)


def _collector_back() -> None:
    """The job is planned: what start-up made is frozen (never scanned again) and the garbage
    collector :func:`entry` held back runs again."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()


_HYDRA_VALUED = {"--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn", "--cfg", "-c", "--package", "-p",
                 "--experimental-rerun"}
_HYDRA_INFO = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def _hydra_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the overrides), wherever the flags were written."""
    flags, rest, i = [], [], 0
    while i < len(args):
        arg = args[i]
        takes_value = arg in _HYDRA_VALUED or (arg in ("--info", "-i") and i + 1 < len(args) and args[i + 1] in _HYDRA_INFO)
        if arg.startswith("-") and takes_value and i + 1 < len(args):
            flags += args[i:i + 2]
            i += 2
            continue
        (flags if arg.startswith("-") else rest).append(arg)
        i += 1
    return flags, rest


#: Hydra flags that bring configs from elsewhere (a primary config or a search path of the user's)
_HYDRA_ELSEWHERE = {"--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn"}


def _mode_is_the_command_lines(flags: list[str], overrides: list[str]) -> bool:
    """Whether only the command line can choose run or sweep (``-m``): ``hydra.mode`` is set by no
    config Conveyor composes. True where every config comes from Conveyor's own package and Hydra's
    (neither sets ``hydra.mode``: tests/unit/test_hydra_mode.py composes every shipped config to check):
    no ``--config-dir``/``--config-path``/``--config-name``, no ``hydra.searchpath`` or
    ``hydra.mode`` override (nor the whole ``hydra`` node), no plugin adding a config package, and
    no third-party Hydra plugin (``hydra_plugins``, whose search paths could add configs)."""
    import importlib.util

    from conveyor import registry

    if any(flag.split("=", 1)[0] in _HYDRA_ELSEWHERE or flag.startswith(("-cd", "-cp", "-cn")) for flag in flags):
        return False  # --config-dir x, --config-dir=x, -cd x, -cdx
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0].strip()
        if key == "hydra" or key.startswith(("hydra.mode", "hydra.searchpath")):
            return False
    return importlib.util.find_spec("hydra_plugins") is None and not registry.config_packages()


@contextlib.contextmanager
def _hydra_mode_from_command_line(flags: list[str], overrides: list[str]) -> Iterator[None]:
    """Hydra composes the whole config twice for every run: once only to read ``hydra.mode`` (a
    config may set MULTIRUN), then for the run itself. Where no config can set it
    (:func:`_mode_is_the_command_lines`) that first composition can only find it unset: Hydra is told
    so (compat.hydra_mode_unset), and then runs or sweeps by ``-m`` as always, composing once."""
    from conveyor.compat import hydra_mode_unset

    if not _mode_is_the_command_lines(flags, overrides):
        yield
        return
    with hydra_mode_unset():
        yield


def _cmd_hydra(mode: str, overrides: list[str], verbose: bool) -> int:
    import io

    import hydra

    from conveyor.config import hydra_overrides

    codes: list[int] = []
    real_stderr = sys.stderr
    held = io.StringIO()  # what Hydra says before the job starts: a composition error, condensed below

    @hydra.main(version_base="1.3", config_path="pkg://conveyor.configs", config_name="config")
    def _task(cfg: Any) -> None:
        sys.stderr = real_stderr
        codes.append(_run_one(cfg, mode, verbose))

    flags, overrides = _hydra_flags(overrides)
    if mode == "plan":  # planning writes nothing: no run directory, no log file
        overrides = ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none", "hydra/hydra_logging=none", *overrides]
    overrides = [*flags, *hydra_overrides(overrides)]  # Hydra's parser takes its flags before the overrides, not among them
    if verbose:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    saved = sys.argv
    sys.argv = ["conveyor", *overrides]  # the program completion registers
    if not verbose:
        sys.stderr = held
    try:
        with _hydra_mode_from_command_line(flags, overrides):
            _task()
    except SystemExit as exc:  # Hydra exits 1 after printing a composition error
        code = exc.code if isinstance(exc.code, int) else EXIT_CONFIG
        sys.stderr = real_stderr
        unloadable = _unloadable_plugin(held.getvalue())
        if unloadable is not None:
            return report_error(unloadable, verbose)
        if held.getvalue().strip():
            _hydra_error(held.getvalue())
        return EXIT_CONFIG if code == 1 else code
    finally:
        sys.stderr = real_stderr
        sys.argv = saved
    if held.getvalue().strip():  # said before the job ran, and not an error: pass it on
        real_stderr.write(held.getvalue())
    return max(codes, default=0)


def _unloadable_plugin(text: str) -> Exception | None:
    """Why a plugin the job names does not load, where Hydra said only "Could not load
    'conveyor_defaults/<kind>/<name>'" (an installed plugin whose module fails to import registers
    no defaults): the registry's own error, which names the package to install."""
    import re

    from conveyor import registry

    found = re.search(r"Could not load 'conveyor_defaults/(\w+)/([^'/]+)'", text)
    if found is None:
        return None
    try:
        registry.load(found[1], found[2])
    except Exception as exc:  # the reason, said as the registry says it
        return exc
    return None


def _hydra_error(text: str) -> None:
    """Hydra's multi-line composition error as Conveyor's one line and a hint."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    first = lines[0] if lines else "the config could not be composed"
    low = text.lower()
    if "available options" in low:
        at = next(i for i, line in enumerate(lines) if line.lower().startswith("available options"))
        names = []
        for line in lines[at + 1:]:
            if line.endswith(":") or " " in line or "=" in line:  # the next section (Hydra's search path)
                break
            names.append(line)
        hint = f"{lines[at].rstrip(':')}: {', '.join(names)}"
    elif "error parsing override" in low:
        hint = "overrides are key=value; quote a value with spaces, commas or parentheses: key='...'"
    elif "not in struct" in low or "could not override" in low:
        hint = "check the key's spelling (`conveyor run ... --cfg job` prints the composed config); +key=value adds a new one"
    else:
        hint = "run again with --verbose for Hydra's full message"
    _stderr(f"error: {first}")
    _stderr(f"hint: {hint}")


OTHER_COMMANDS = ("plugins", "report", "clean", "serve", "submit", "new")


def arrow_allocator_default() -> None:
    """The allocator pyarrow gives a ``conveyor`` process (and the Ray workers its private instance
    starts, which inherit its environment): the system's, unless ``ARROW_DEFAULT_MEMORY_POOL`` names
    one. pyarrow's own default (mimalloc here) kept 40-50 MB more at its peak on the same jobs,
    at the same CPU (lineitem SF1, degree 2, 3-4 alternating runs each: Parquet -> PostgreSQL 293 ->
    247 MB, PostgreSQL -> Parquet 577 -> 540 MB, the Arrow path of PostgreSQL -> PostgreSQL 406 ->
    411 MB). Set before pyarrow is imported: it reads the variable once. A library user's process is
    left as it is (``run_job`` sets nothing); a joined cluster's workers keep their own."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def blas_threads_default() -> None:
    """One OpenBLAS thread for a ``conveyor`` process (and the Ray workers its private instance
    starts), unless ``OPENBLAS_NUM_THREADS`` says otherwise. Nothing of Conveyor does linear algebra,
    but pyarrow imports numpy where it is installed (Ray needs it), and numpy's OpenBLAS then starts
    a thread per further core that spins for a while before it sleeps: 0.10 CPU-s per process here,
    taken from the database servers on the same cores (pg_to_pg orders, 8 alternating runs: client
    CPU 0.96 -> 0.83 s, wall 1.73 -> 1.68 s on average). Set before numpy is imported: OpenBLAS
    reads it once. A library user's process is left as it is, as with the allocator."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def entry() -> None:
    """The ``conveyor`` command (the console script): :func:`main`, then a quick exit.

    What a normal interpreter exit does for the job's sake is done first: the threads it waits for
    are joined (a joined Ray cluster being left), the exit handlers run (Ray's, logging's flush of
    Hydra's log file, weakref finalizers), and Python's and C's output buffers are flushed. Then
    ``os._exit`` skips only the teardown of every module and object one by one, which took 0.12-0.18 s
    of a 10-row job's ~0.9 s here, and ~0.2 s more once Ray's gRPC clients are loaded. ``main`` itself
    returns as before (tests and library callers run it in their own process).

    ``run`` and ``plan`` start without Python's cyclic garbage collector: importing, composing,
    describing and planning make a few hundred thousand long-lived objects and next to no garbage,
    and its passes over them took ~0.04 s of a 10-row job here. Once the job is planned they are
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
    REPORT_PATH[:] = [report] if report else []
    from conveyor.log import set_level

    set_level(verbose)
    first = args[0] if args else ""
    if first and not first.startswith("-") and first not in HYDRA_COMMANDS and first not in OTHER_COMMANDS:
        _stderr(f"error: unknown command {first!r}")
        _stderr(f"hint: commands are {', '.join((*HYDRA_COMMANDS, *OTHER_COMMANDS))} (conveyor --help)")
        return EXIT_CONFIG
    try:
        if first in ("-sc", "--shell-completion") or first.startswith("--shell-completion="):
            return _cmd_completion(args, verbose)
        if first in HYDRA_COMMANDS:
            return _cmd_hydra(first, args[1:], verbose)
        if not args:
            build_parser().print_help(sys.stderr)
            return EXIT_CONFIG
        ns = parse_command(args)
        return _dispatch(ns)
    except KeyboardInterrupt:
        _stderr("error: cancelled (Ctrl-C)")
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
    if ns.command == "new":
        from conveyor.scaffold import new_connector

        print(new_connector(ns.name, ns.dir, sink=ns.sink))
        return 0
    _quiet_libraries()
    if ns.command == "serve":
        from conveyor import serve

        return serve.serve(serve.ServeArgs(overrides=ns.overrides, host=ns.host, port=ns.port, name=ns.name, token_env=ns.token_env))
    from conveyor import submit

    return submit.submit(submit.SubmitArgs(overrides=ns.overrides, address=ns.address, wait=ns.wait, follow=ns.follow, timeout=ns.timeout,
                                           run_dir=ns.run_dir))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
