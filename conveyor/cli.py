"""The ``conveyor`` command: run | plan | plugins.

``run`` and ``plan`` take Hydra overrides (``source.path=... degree=4``), and ``run -m``
sweeps (``-m strategy=none,files``). Errors print as one line and a hint on stderr with the
error's exit code; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

USAGE = """\
usage: conveyor [--verbose] [--report PATH] <command> [hydra overrides...]

commands:
  run       run a job:   conveyor run pipeline=demo degree=4
            sweep jobs:  conveyor run -m strategy=none,files
  plan      print the partitions and what each reads; moves nothing
  plugins   list installed sources, sinks, strategies and runtimes
  submit    send a job to a Ray cluster: conveyor submit [--address URL] [--follow] [--no-wait] overrides...
  serve     serve a source as Arrow Flight: conveyor serve [--host H] [--port P] [--token-env VAR] overrides...
  clean     list staging tables left by runs that are gone: conveyor clean [--drop] sink=... (sink.* overrides)
  report    a table of a sweep's jobs: conveyor report <multirun dir>

Exit codes: 0 ok, 1 internal error, 2 config/plugin/planning, 3 connection, 4 schema, 5 transfer,
6 verification, 130 cancelled. A run writes report.json in its Hydra run directory (or --report PATH).
Hydra options work after run/plan: --cfg job (print the composed config), --config-dir DIR
(add your own configs, e.g. source/<plugin>.yaml), hydra.run.dir=..., --help.
"""

EXIT_INTERNAL = 1
EXIT_CONFIG = 2


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def report_error(exc: BaseException, verbose: bool) -> int:
    """Print an error as one line plus its hint; return the exit code."""
    from conveyor.errors import ConveyorError, JobFailed

    if isinstance(exc, JobFailed):  # a failed run: say what stopped it
        exc = exc.cause
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


def _cmd_clean(args: list[str]) -> int:
    """List a sink's leftovers (staging tables of runs that are gone); ``--drop`` removes them."""
    from conveyor.config import build_job
    from conveyor.core import SupportsCleanup
    from conveyor.submit import compose

    drop = "--drop" in args
    spec = build_job(compose([a for a in args if a != "--drop"]), kinds=("sink",))
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
    """First Ctrl-C / SIGTERM: stop starting partitions, roll back the running ones. Second: leave now."""
    import signal

    from conveyor.core import request_cancel

    _stderr("interrupted: cancelling the running partitions (again to quit at once)")
    request_cancel()
    signal.signal(signal.SIGINT, _quit_now)
    signal.signal(signal.SIGTERM, _quit_now)


def _quit_now(signum: int, frame: Any) -> None:
    """Second Ctrl-C / SIGTERM: leave at once, no traceback (open transactions roll back with their connections)."""
    _stderr("error: cancelled: quit at once (second interrupt); partitions that were running rolled back")
    os._exit(130)


def _install_signals() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)


def _hydra_dir() -> Any:
    from pathlib import Path

    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under hydra.main
        return None


def _run_one(cfg: Any, mode: str, verbose: bool) -> int:
    """One composed config: plan it, or run it (conveyor.pipelines.run owns the run); print the outcome."""
    from pathlib import Path

    from conveyor.pipelines.report import plan_table, summary_table
    from conveyor.pipelines.run import RunPlace, plan_run, run

    _quiet_libraries()
    console = _console()
    try:
        if mode == "plan":
            console.print(plan_table(plan_run(cfg)))
            return 0
        _install_signals()
        place = RunPlace(run_dir=_hydra_dir(), report_path=Path(REPORT_PATH[0]) if REPORT_PATH else None)
        report = run(cfg, place, progress=lambda plan: _progress(console, plan))
        console.print(summary_table(report))
        return 0
    except Exception as exc:  # the CLI's boundary: one line, an exit code
        return report_error(exc, verbose)


def _progress(console: Any, plan: Any) -> Any:
    from conveyor.runtime.progress import LogProgress, RichProgress

    if console.is_terminal:
        return RichProgress(console, plan.info.estimated_rows, len(plan.partitions))
    return LogProgress(plan.info.estimated_rows, len(plan.partitions))


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


def _cmd_hydra(mode: str, overrides: list[str], verbose: bool) -> int:
    import io

    import hydra

    from conveyor.config import register_defaults

    register_defaults()
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
    overrides = [*flags, *overrides]  # Hydra's parser takes its flags before the overrides, not among them
    if verbose:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    saved = sys.argv
    sys.argv = [f"conveyor {mode}", *overrides]
    if not verbose:
        sys.stderr = held
    try:
        _task()
    except SystemExit as exc:  # Hydra exits 1 after printing a composition error
        code = exc.code if isinstance(exc.code, int) else EXIT_CONFIG
        sys.stderr = real_stderr
        if held.getvalue().strip():
            _hydra_error(held.getvalue())
        return EXIT_CONFIG if code == 1 else code
    finally:
        sys.stderr = real_stderr
        sys.argv = saved
    if held.getvalue().strip():  # said before the job ran, and not an error: pass it on
        real_stderr.write(held.getvalue())
    return max(codes, default=0)


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


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = any(a in ("--verbose", "-v") for a in args)
    args = [a for a in args if a not in ("--verbose", "-v")]
    REPORT_PATH.clear()
    if "--report" in args:
        i = args.index("--report")
        if i + 1 >= len(args):
            _stderr("error: --report needs a path")
            return EXIT_CONFIG
        REPORT_PATH.append(args[i + 1])
        del args[i:i + 2]
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else EXIT_CONFIG
    command, rest = args[0], args[1:]
    try:
        if command == "plugins":
            return _cmd_plugins()
        if command in ("run", "plan"):
            return _cmd_hydra(command, rest, verbose)
        if command == "report":
            from conveyor.pipelines.report import multirun_markdown

            if len(rest) != 1:
                _stderr("error: conveyor report takes one path: the directory of a `conveyor run -m` sweep")
                return EXIT_CONFIG
            print(multirun_markdown(rest[0]))
            return 0
        if command == "clean":
            return _cmd_clean(rest)
        if command == "serve":
            from conveyor import serve

            _quiet_libraries()
            return serve.serve(serve.parse(rest))
        if command == "submit":
            from conveyor import submit

            _quiet_libraries()
            return submit.submit(submit.parse(rest))
    except KeyboardInterrupt:
        _stderr("error: cancelled (Ctrl-C)")
        return 130
    except Exception as exc:
        return report_error(exc, verbose)
    _stderr(f"error: unknown command {command!r}")
    _stderr("hint: commands are run, plan, plugins, submit, serve, report (conveyor --help)")
    return EXIT_CONFIG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
