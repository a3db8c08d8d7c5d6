"""``xrouter deploy <checkpoint>``: make a running gateway hot-load a router checkpoint.

The checkpoint is validated locally first (it loads, and says which pool it was trained on),
then the gateway is asked to switch to it through the admin API; the gateway refuses it,
and keeps serving the old one, if it does not fit its pool."""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)


def run_deploy(args: argparse.Namespace) -> int:
    from router.checkpoint import PACKAGED_PREFIX, CheckpointError, load_checkpoint

    # ``packaged:<name>`` names a checkpoint shipped with xrouter: the gateway resolves it in
    # its own installation, so it is sent as written.
    packaged = str(args.checkpoint).startswith(PACKAGED_PREFIX)
    path = args.checkpoint if packaged else Path(args.checkpoint).resolve()
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as exc:
        log.error("%s", exc)
        return 2
    if not packaged and ckpt.path is not None:
        path = ckpt.path  # the checkpoint itself, where a run directory was named
    if not args.admin_key:
        log.error("an admin key is needed: --admin-key or XROUTER_ADMIN_KEY")
        return 2
    try:
        req = urllib.request.Request(
            f"{args.url.rstrip('/')}/admin/reload",
            data=json.dumps({"checkpoint": str(path)}).encode(),
            headers={
                "Authorization": f"Bearer {args.admin_key}",
                "Content-Type": "application/json",
            },
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = json.loads(resp.read())
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        if exc.code == 401:
            log.error("the gateway refused the admin key (401): %s", detail)
        elif exc.code == 403:
            # Not the checkpoint's fault: the admin API is off (no auth.admin_key).
            log.error("the gateway refused the admin call (403): %s", detail)
        else:
            log.error("the gateway refused the checkpoint (%s): %s", exc.code, detail)
        return 1
    except urllib.error.URLError as exc:
        log.error("cannot reach the gateway at %s: %s", args.url, exc.reason)
        return 1
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        log.error("no answer from the gateway at %s: %s", args.url, exc or type(exc).__name__)
        return 1
    except ValueError as exc:  # a malformed --url, or an answer that is not the gateway's
        log.error("%s did not answer as an xrouter gateway: %s", args.url, exc)
        return 1
    # The gateway's answer names its own pool ("pool"); the checkpoint's, what it was
    # trained on, is said apart rather than overwritten by it.
    print(json.dumps({"deployed": str(path), "checkpoint_pool": ckpt.pool, **body}, indent=2))
    return 0
