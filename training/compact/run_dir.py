"""A training run's directory: claimed for one run at a time, replaced only by a run that
finishes, and never left without a checkpoint a gateway may be serving.

A run directory's ``checkpoint`` is what ``xrouter deploy`` names and what a gateway's
file watcher reloads when it changes. So ``--overwrite`` leaves the earlier checkpoint in
place while the new run lasts (the rest of the earlier run is set aside), the new one is
swapped in whole when the run finishes (``router.checkpoint.save_checkpoint``), and the
earlier run is kept as ``previous/`` — the checkpoint to deploy to go back.
"""

from __future__ import annotations

import contextlib
import filecmp
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

# What a run writes into its directory; its feature cache (``cache/``) is not among them, so
# a re-run with --overwrite keeps the embeddings it already computed.
RUN_OUTPUTS = ("checkpoint", "checkpoints", "config.json", "metrics.jsonl", "summary.json")

# Where --overwrite keeps the earlier run while the new one lasts: ``.replaced-<pid>``.
_ASIDE_PREFIX = ".replaced-"
# Where the earlier run is kept once the new one has finished.
PREVIOUS = "previous"


@contextlib.contextmanager
def claimed_run_dir(out: Path, *, overwrite: bool) -> Iterator[None]:
    """Make ``out`` ready for a new run for as long as the run lasts, refusing to mix it
    into an earlier one's files.

    Without ``overwrite`` a directory that already holds a run is an error: the new run
    would replace its checkpoint (which a gateway may serve or the registry list) and leave
    step checkpoints of the old one beside its own. With it, the earlier run's outputs are
    set aside — its checkpoint copied, and left where it is until the new one replaces it,
    so a gateway that serves it (or restarts meanwhile) still finds it — and kept as
    ``previous/`` once the new run has succeeded (replacing an older ``previous/``): a run
    that fails (a typo in its settings, a table it cannot use) leaves the earlier one as it
    was. Either way a run that fails leaves none of its own outputs behind (its feature
    cache stays). An earlier run set aside by a process that died without putting it back
    is dealt with first (``_recover_stale_asides``)."""
    if out.exists() and not out.is_dir():
        # mkdir's "[Errno 17] File exists" would name neither the option nor the remedy.
        raise ValueError(f"{out} is a file, not a run directory: choose another --out")
    _recover_stale_asides(out)
    existed = out.exists()
    present = [name for name in RUN_OUTPUTS if (out / name).exists()]
    if present and not overwrite:
        raise ValueError(
            f"{out} already holds a training run ({', '.join(present)}): pass --overwrite "
            "to replace it (its feature cache is kept; the earlier run is kept as "
            f"{PREVIOUS}/), or choose another --out"
        )
    aside = out / f"{_ASIDE_PREFIX}{os.getpid()}" if present else None
    started = False
    try:
        # Inside the try: a signal turned into an exception (xrouter train's SIGTERM) may
        # land between two renames, and what was moved must still go back.
        if aside is not None:
            aside.mkdir()
            for name in present:
                if name == "checkpoint" and (out / name).is_dir():
                    shutil.copytree(out / name, aside / name, symlinks=True)
                else:
                    (out / name).rename(aside / name)
        started = True
        yield
    except BaseException:
        if started:  # before, ``out`` holds only the earlier run's files: none to remove
            _remove_outputs(out, keep_checkpoint_of=aside)
        if aside is not None and aside.is_dir():
            _put_back(aside, out)
            logger.info("the run failed: the earlier run in %s is kept", out)
        if not existed and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # made for this run, and nothing (no feature cache) worth keeping
        raise
    if aside is not None:
        _keep_as_previous(aside, out)
        logger.warning(
            "replaced the training run in %s (%s); the earlier one is kept in %s: "
            "`xrouter deploy %s` goes back to it (a gateway whose file watcher is on "
            "reloads the new checkpoint if it serves %s)",
            out,
            ", ".join(present),
            out / PREVIOUS,
            out / PREVIOUS / "checkpoint",
            out / "checkpoint",
        )


def _same_checkpoint(a: Path, b: Path) -> bool:
    """Whether two checkpoint directories hold the same files, byte for byte."""
    if not (a.is_dir() and b.is_dir()):
        return False
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def _keep_as_previous(aside: Path, out: Path) -> None:
    """The earlier run, set aside in ``aside``, becomes ``out/previous`` (an older one goes)."""
    previous = out / PREVIOUS
    if previous.is_dir() and not previous.is_symlink():
        shutil.rmtree(previous)
    elif previous.exists() or previous.is_symlink():
        previous.unlink()
    aside.rename(previous)


def _put_back(aside: Path, out: Path) -> None:
    """Move everything set aside in ``aside`` back into ``out``, then remove ``aside``. A
    checkpoint still in ``out`` is the earlier one, left in place (``_remove_outputs``
    kept it): its copy goes."""
    for path in aside.iterdir():
        target = out / path.name
        if target.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        else:
            path.rename(target)
    aside.rmdir()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # an earlier process that had our pid (pids repeat in containers)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _recover_stale_asides(out: Path) -> None:
    """An earlier run that an ``--overwrite`` run set aside, left behind because that run's
    process died (SIGKILL, a crash, a power cut) before it could either put it back or
    keep it as ``previous/``: without this it stayed hidden in ``.replaced-<pid>`` for ever.

    If ``out``'s checkpoint is the one set aside (or there is none), the dead run never
    finished: its partial outputs are removed and the earlier run is put back, as the dead
    run itself would have done on an error. If ``out`` holds another checkpoint, the dead
    run got as far as its final checkpoint (written last but for summary.json, and swapped
    in whole): it is the run ``--overwrite`` asked for, and the earlier one becomes
    ``previous/``, as the dead run would have done next. Either way nothing is lost that
    the dead run would have kept, and a checkpoint is never replaced by an unfinished run.
    A directory whose process still lives (another run in progress in ``out``), or whose
    name is not ours, is left alone."""
    if not out.is_dir():
        return
    stale: list[Path] = []
    for path in out.iterdir():
        suffix = path.name.removeprefix(_ASIDE_PREFIX)
        if path.name.startswith(_ASIDE_PREFIX) and suffix.isdigit() and path.is_dir():
            if not _pid_alive(int(suffix)):
                stale.append(path)
    for aside in sorted(stale, key=lambda p: p.stat().st_mtime):
        checkpoint = out / "checkpoint"
        if checkpoint.exists() and not _same_checkpoint(checkpoint, aside / "checkpoint"):
            _keep_as_previous(aside, out)
            logger.warning(
                "kept %s as %s: a run that replaced it finished but died before doing so",
                aside,
                PREVIOUS,
            )
        else:
            _remove_outputs(out, keep_checkpoint_of=aside)
            _put_back(aside, out)
            logger.warning(
                "put back the earlier training run in %s from %s: the run that set it aside "
                "died before finishing",
                out,
                aside.name,
            )


def _remove_outputs(out: Path, keep_checkpoint_of: Path | None = None) -> None:
    """Remove a run's outputs from ``out``, but for a checkpoint that is still the one set
    aside in ``keep_checkpoint_of`` (the earlier run's, which a gateway may serve: left in
    place rather than removed and put back)."""
    for name in RUN_OUTPUTS:
        path = out / name
        if (
            name == "checkpoint"
            and keep_checkpoint_of is not None
            and _same_checkpoint(path, keep_checkpoint_of / name)
        ):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
