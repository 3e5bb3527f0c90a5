"""``conveyor run`` and ``conveyor plan``: the command line handed to Hydra (its flags before the
overrides, its mode taken from the command line), one composed config planned or run, its outcome
printed, a composition error said as one line and a hint, and Ctrl-C / SIGTERM cancelling the run."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from conveyor import cliout
from conveyor.cliout import EXIT_CONFIG, quiet_libraries, report_error, stderr_line

REPORT_PATH: list[str] = []  # --report PATH, taken off the command line by main()


def _on_signal(signum: int, frame: Any) -> None:
    """First Ctrl-C / SIGTERM: stop starting partitions, roll back the running ones. Second: the process
    ends at once, by the signal's default action (however busy the main thread is in a native call; open
    transactions roll back with their connections)."""
    import signal

    from conveyor.core import request_cancel

    signal.alarm(0)  # an alarm a native library armed on the signal (absl's: abort in 3 s) would end the stop
    stderr_line("interrupted: cancelling the running partitions (again to quit at once: they roll back with their connections)")
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

    from conveyor.log import event, json_lines
    from conveyor.pipelines.report import plan_table, summary_table
    from conveyor.pipelines.run import RunPlace, plan_run, run
    from conveyor.submit import emit_run_files

    quiet_libraries()
    console = cliout.console()
    try:
        if mode == "plan":
            plan = plan_run(cfg)
            cliout.print_table(console, plan_table(plan))
            for text in plan.lines:  # what the plan says after its table (a sync job: its slot and its targets' positions)
                console.print(text, highlight=False)
            return 0
        if mode == "verify":
            from conveyor.pipelines.compare import verify_job

            return verify_job(cfg, console)
        place = RunPlace(run_dir=_hydra_dir(), report_path=Path(REPORT_PATH[0]) if REPORT_PATH else None)
        _keep_config(cfg, place.run_dir)
        try:
            with _signals():
                report = run(cfg, place, progress=lambda plan: _progress(console, plan))
        finally:
            emit_run_files(place.run_dir)  # a job sent by conveyor submit: its files go back with the log
        if json_lines():  # the summary as one event (report.json has the rest)
            verified = report.verification.as_dict() if report.verification is not None else None
            event("summary", f"{report.rows:,} rows into {report.target} in {report.seconds:.2f} s", status="ok", rows=report.rows,
                  bytes=report.bytes, partitions=len(report.results), seconds=round(report.seconds, 3), target=report.target,
                  verification=verified, phases=report.phases)
        else:
            cliout.print_table(console, summary_table(report))
        for text in report.lines():  # what the run says after its table (a sync job: where its targets are now)
            if json_lines():
                event("summary", text, status="ok")
            else:
                console.print(text, highlight=False)
        return 0
    except Exception as exc:  # the CLI's boundary: one line, an exit code
        return report_error(exc, verbose)


def _progress(console: Any, plan: Any) -> Any:
    from conveyor.runtime.progress import LogProgress, RichProgress

    collector_back()

    info = plan.info
    if console.is_terminal:
        return RichProgress(console, info.estimated_rows, len(plan.partitions), total_bytes=info.estimated_bytes)
    return LogProgress(info.estimated_rows, len(plan.partitions), total_bytes=info.estimated_bytes)


def collector_back() -> None:
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


def cmd_hydra(mode: str, overrides: list[str], verbose: bool) -> int:
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
    if mode in ("plan", "verify"):  # planning and verifying write nothing: no run directory, no log file
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


def _raised(lines: list[str]) -> tuple[str, str] | None:
    """(the message, a hint) of the exception a traceback ends with: a YAML file that does not parse names its file,
    line and column."""
    import re

    at = next((i for i in range(len(lines) - 1, -1, -1) if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", lines[i])), None)
    if at is None:
        return None
    kind, _, message = lines[at].partition(": ")
    if kind.rsplit(".", 1)[-1] in ("FileNotFoundError", "PermissionError", "OSError", "NotADirectoryError", "IsADirectoryError"):
        return (f"cannot write a file or folder the run needs: {message}",
                "hydra.run.dir (the run's folder) and --report must be places this user can write")
    where = next((m for m in (re.match(r'^in "(.+)", line (\d+), column (\d+)', line) for line in lines[at + 1:]) if m), None)
    if kind.startswith("yaml."):
        place = f"{where.group(1)} (line {where.group(2)}, column {where.group(3)})" if where else "a config file"
        return (f"{place} is not valid YAML: {message}",
                "fix it at that line: a key: value a line, nested keys indented by the same number of spaces")
    return f"the config could not be composed: {kind.rsplit('.', 1)[-1]}: {message}", "run again with --verbose for Hydra's full message"


def _hydra_error(text: str) -> None:
    """Hydra's multi-line composition error as Conveyor's one line and a hint."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    first = lines[0] if lines else "the config could not be composed"
    low = text.lower()
    raised = _raised(lines) if first.startswith("Traceback") else None
    if raised is not None:  # an exception while Hydra composed: its own last line, not the traceback's first
        first, hint = raised
    elif "available options" in low:
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
    stderr_line(f"error: {first}")
    stderr_line(f"hint: {hint}")
