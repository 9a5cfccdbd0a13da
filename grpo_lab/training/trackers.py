"""Live logging: every step's metrics to TensorBoard, trackio or Weights & Biases (``report_to``).

``metrics.jsonl`` stays the record of a run; a tracker is a live view of the same numbers, as
TRL's ``report_to`` gives one. What each sink receives, at the step of the metrics row (-1 is
the evaluation of the base before training):

  * ``log(step, scalars)``: every number of the row (``scalars``: ints and floats, bools as
    0/1; None and the dict-valued rows ``resume/overrides`` and ``plugins/sha256`` stay in
    metrics.jsonl only);
  * ``log_text(step, "samples", rows)``: on an evaluation step, the rows ``samples.jsonl``
    holds (prompt, completion, answer, reward, ...), as a markdown table in TensorBoard's
    text tab, a ``wandb.Table``, a ``trackio.Table``.

Each sink is a record with one signature (``SINKS``): ``open(run_dir, config)`` -> a
``Writer`` of three functions, ``log``, ``log_text`` and ``close``. Adding a sink is adding
one function that opens it. The rules around them, in ``Trackers``:

  * nothing of a tracker is imported unless ``report_to`` names it; a package that is not
    installed is an error before any training (``check_installed``), naming the extra;
  * only rank 0 logs (the metrics are the same on every rank);
  * a sink that fails (a full disk, the package raising mid-run) never stops training: one
    ``TrackerFailed`` warning names the sink and the error, that sink is closed and skipped
    from then on; metrics.jsonl and the checkpoints are written as before.

Where they write: TensorBoard event files in ``out_dir/tensorboard`` (``tensorboard --logdir
runs``), W&B offline runs in ``out_dir/wandb`` (``wandb sync`` uploads one later; online only
when you set ``WANDB_MODE`` yourself), trackio its local database (``$TRACKIO_DIR``, default
``~/.cache/huggingface/trackio``; ``trackio show --project grpo_lab``). A fresh run empties
its own ``tensorboard`` and ``wandb`` folders; a resumed run adds to them from the step it
resumes at.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from grpo_lab.registry import lookup

PROJECT = "grpo_lab"                   # the W&B / trackio project every run is logged under


class TrackerFailed(RuntimeWarning):
    """A tracker raised during the run; training went on without it."""


class Writer(NamedTuple):
    """One open sink."""
    log: Callable[[int, dict], None]              # (step, {name: number})
    log_text: Callable[[int, str, list], None]    # (step, name, rows: list of dicts)
    close: Callable[[], None]


@dataclass(frozen=True)
class Sink:
    name: str
    package: str          # the import name checked before training (the extra is `name`)
    folder: str | None    # under out_dir, emptied at the start of a fresh run (None: elsewhere)
    open: Callable[[Path, dict], Writer]


def markdown_table(rows: list[dict]) -> str:
    """Sample rows -> a markdown table, one column per key of the first row."""
    cols = list(rows[0]) if rows else []
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", "⏎")  # noqa: E731
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows])


def open_tensorboard(run_dir: Path, config: dict) -> Writer:
    """Event files written in this thread (tensorboard's RecordWriter over a plain file),
    flushed every step: a failing write raises here, in the caller, not in a writer thread.
    The first row logged starts a session at its step, as torch's ``SummaryWriter(purge_step=)``
    does: TensorBoard hides what an earlier process wrote from that step on, so a run resumed
    after dying past its last checkpoint (a crash, kill -9, an ``on_step`` hook raising) shows
    each step once, not the lost steps twice."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter
    from torch.utils.tensorboard.summary import text

    folder = run_dir / "tensorboard"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}.{os.getpid()}.0"
    f = open(folder / name, "ab")
    out = RecordWriter(f)

    def write(step: int, summary) -> None:
        out.write(Event(wall_time=time.time(), step=step, summary=summary).SerializeToString())

    out.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
    started = []                    # the first row's step, once logged

    def log(step: int, scalars: dict) -> None:
        if not started:             # the config after the start: a start at step -1 (the base
            started.append(step)    # evaluation) would hide a config written before it at 0
            out.write(Event(wall_time=time.time(), step=step,
                            session_log=SessionLog(status=SessionLog.START)).SerializeToString())
            write(0, text("config", "```\n" + json.dumps(config, indent=1) + "\n```"))
        write(step, Summary(value=[Summary.Value(tag=k, simple_value=v)
                                   for k, v in scalars.items()]))
        out.flush()

    def log_text(step: int, tag: str, rows: list) -> None:
        write(step, text(tag, markdown_table(rows)))
        out.flush()

    return Writer(log, log_text, out.close)


def open_wandb(run_dir: Path, config: dict) -> Writer:
    """An offline W&B run in out_dir/wandb (WANDB_MODE, if you set it, decides instead).
    ``step`` is logged as a metric and made every chart's x axis: W&B's own step counts
    log calls from 0, and the base evaluation is step -1."""
    import wandb

    run = wandb.init(project=PROJECT, name=run_dir.name, dir=str(run_dir), config=config,
                     mode=os.environ.get("WANDB_MODE") or "offline",
                     settings=wandb.Settings(console="off", silent=True))
    run.define_metric("*", step_metric="step")

    def log_text(step: int, tag: str, rows: list) -> None:
        cols = list(rows[0]) if rows else []
        run.log({"step": step, tag: wandb.Table(columns=cols,
                                                data=[[r.get(c) for c in cols] for r in rows])})

    return Writer(lambda step, scalars: run.log({"step": step, **scalars}), log_text, run.finish)


def open_trackio(run_dir: Path, config: dict) -> Writer:
    """A local trackio run (its database under $TRACKIO_DIR; nothing is sent anywhere unless
    TRACKIO_SPACE_ID / TRACKIO_SERVER_URL say so), named after out_dir and the start time."""
    import trackio

    run = trackio.init(project=PROJECT, name=f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                       config=config, auto_log_cpu=False, auto_log_gpu=False)

    def log_text(step: int, tag: str, rows: list) -> None:
        cols = list(rows[0]) if rows else []
        run.log({tag: trackio.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])},
                step=step)

    return Writer(lambda step, scalars: run.log(dict(scalars), step=step), log_text, run.finish)


SINKS = {"tensorboard": Sink("tensorboard", "tensorboard", "tensorboard", open_tensorboard),
         "wandb": Sink("wandb", "wandb", "wandb", open_wandb),
         "trackio": Sink("trackio", "trackio", None, open_trackio)}


def sink_names(report_to: str) -> list[str]:
    """"tensorboard,wandb" -> ["tensorboard", "wandb"]; "none" or "" -> []; an unknown name
    or one given twice is an error naming it."""
    if not isinstance(report_to, str):
        raise ValueError(f"report_to must be a string of sink names, got {report_to!r}")
    names = [n.strip() for n in report_to.split(",")] if report_to.strip() not in ("", "none") \
        else []
    for n in names:
        lookup(SINKS, n, "report_to sink", 'several join by commas; "none" for no tracker')
    if len(set(names)) != len(names):
        raise ValueError(f"report_to={report_to!r} names a sink twice")
    return names


def check_installed(report_to: str) -> None:
    """An error naming the extra to install for each sink whose package is missing (nothing
    is imported: this runs before training, on every rank)."""
    for n in sink_names(report_to):
        if importlib.util.find_spec(SINKS[n].package) is None:
            pkg = SINKS[n].package
            raise ModuleNotFoundError(f"report_to={n!r} needs the {pkg!r} package, which is not "
                                      f"installed: pip install {pkg} (in a checkout: pip install "
                                      f"-e \".[{n}]\")")


def scalars(row: dict) -> dict:
    """The numbers of a metrics row, as floats (bools as 0/1), ``step`` left out (it is the x
    axis); None, strings and dicts left out."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, str)}


class Trackers:
    """The run's sinks, opened at the first row logged (so a run refused at setup opens
    none); a failing one is said once and skipped (see the module docstring).
    ``Trackers("none", ...)`` and ``Trackers(..., lead=False)`` (ranks > 0) hold none."""

    def __init__(self, report_to: str, run_dir: str | Path, config: dict, fresh: bool,
                 lead: bool = True):
        self.to_open = sink_names(report_to) if lead else []
        self.run_dir, self.config, self.fresh = Path(run_dir), config, fresh
        self.live: dict[str, Writer] = {}

    def _open(self) -> None:
        for name in self.to_open:
            sink = SINKS[name]
            if self.fresh and sink.folder:
                shutil.rmtree(self.run_dir / sink.folder, ignore_errors=True)
            try:
                self.live[name] = sink.open(self.run_dir, self.config)
            except Exception as e:
                self._failed(name, "opening it", e)
        self.to_open = []

    def log(self, row: dict, samples: list | None = None) -> None:
        """One metrics row (and, on an evaluation step, its sample rows) to every live sink."""
        self._open()
        if not self.live:
            return
        step, numbers = row["step"], scalars(row)
        for name, w in list(self.live.items()):
            try:
                w.log(step, numbers)
                if samples:
                    w.log_text(step, "samples", samples)
            except Exception as e:
                self._failed(name, f"step {step}", e)

    def close(self) -> None:
        self.to_open = []
        for name, w in list(self.live.items()):
            try:
                w.close()
            except Exception as e:
                self._failed(name, "closing it", e)
        self.live.clear()

    def _failed(self, name: str, when: str, e: Exception) -> None:
        w = self.live.pop(name, None)
        if w is not None:
            with contextlib.suppress(Exception):
                w.close()                # release what it holds; it failed already, say nothing
        from grpo_lab.errors import one_line
        warnings.warn(f"tracker {name!r} failed at {when}: {one_line(e)}; training goes on "
                      f"without it (metrics.jsonl and the checkpoints are unaffected)",
                      TrackerFailed, stacklevel=3)
