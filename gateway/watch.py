"""Hot reload by file watch: the config file and the router checkpoint are polled (stat in a
thread, every ``interval_s``); a change reloads the runtime without dropping requests. A
config that fails to load is logged and the previous runtime keeps serving."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from router.checkpoint import PACKAGED_PREFIX, checkpoint_location

if TYPE_CHECKING:
    from gateway.services import Services

log = logging.getLogger(__name__)


def fingerprint(paths: list[Path]) -> tuple[tuple[str, float, int], ...]:
    out = []
    for named in paths:
        # A checkpoint named by its run directory or checkpoint.json: watch the checkpoint
        # directory itself (not the run's caches and logs; its weights too).
        p = checkpoint_location(named)
        try:
            if p.is_dir():
                for f in sorted(p.rglob("*")):
                    if f.is_file():
                        st = f.stat()
                        out.append((str(f), st.st_mtime, st.st_size))
            else:
                st = p.stat()
                out.append((str(p), st.st_mtime, st.st_size))
        except OSError:
            out.append((str(p), -1.0, -1))
    return tuple(out)


class FileWatcher:
    def __init__(
        self,
        services: Services,
        config_path: str | os.PathLike[str] | None,
        interval_s: float = 2.0,
        config_seen: tuple[tuple[str, float, int], ...] | None = None,
    ) -> None:
        self.services = services
        self.config_path = Path(config_path) if config_path else None
        self.interval_s = interval_s
        # The config file's fingerprint from before its settings were read, if the caller
        # took one: a change made between that read and this watcher's first look (while
        # the worker started: opening the ledger, building the runtime) is one to load.
        self._config_seen = config_seen
        self._task: asyncio.Task[None] | None = None

    def _paths(self) -> list[Path]:
        paths = [self.config_path] if self.config_path else []
        ckpt = self.services.settings.router.checkpoint
        # A packaged checkpoint ships with the installed code: it changes only with it.
        if ckpt and not ckpt.startswith(PACKAGED_PREFIX):
            paths.append(Path(ckpt))
        return paths

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="xrouter-file-watch")

    async def _run(self) -> None:
        from gateway.settings import load_settings

        paths = self._paths()
        last = await asyncio.to_thread(fingerprint, paths)
        # A change seen, waiting for the files to settle (the config's entries come first).
        seen = self._config_seen
        pending = seen is not None and last[: len(seen)] != seen
        while True:
            await asyncio.sleep(self.interval_s)
            watched, paths = paths, self._paths()
            current = await asyncio.to_thread(fingerprint, paths)
            if paths != watched:
                # A reload or deploy switched checkpoints and has loaded the new one already:
                # watch it from here on without reloading for it, but a file watched before
                # and after (the config) that changed meanwhile still needs its reload.
                before = {f[0]: f[1:] for f in last}
                pending |= any(f[0] in before and before[f[0]] != f[1:] for f in current)
                last = current
                continue
            if current != last:
                # Reload once a poll finds nothing changed since the last: a checkpoint is
                # several files written one after another, and one caught half-written
                # would load as a checkpoint that never existed.
                pending, last = True, current
                continue
            if not pending:
                continue
            pending = False
            try:
                settings = (
                    await asyncio.to_thread(load_settings, self.config_path)
                    if self.config_path
                    else None
                )
                await self.services.reload(settings)
            except Exception as exc:
                log.error(
                    "reload after file change failed; still serving the previous config: %s", exc
                )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
