"""``xrouter deploy <checkpoint>``: make a running gateway hot-load a router checkpoint.

A checkpoint on this machine is validated here first (it loads, and says which pool it was
trained on); an absolute path that is not here is taken for one on the gateway's machine.
Then the gateway is asked to switch to it through the admin API; the gateway refuses it,
and keeps serving the old one, if it does not load there or does not fit its pool."""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from router.url_secrets import mask_url, redact, split_userinfo

log = logging.getLogger(__name__)

# Statuses of a server that has no ``POST /admin/reload`` at that URL (most often a ``--url``
# that ends in ``/v1``): the gateway itself answers a checkpoint it refuses with 400.
_NOT_THE_ADMIN_API = frozenset({404, 405, 501})
# How much of an answer that is not the gateway's JSON error (an HTML page from a proxy, an
# unknown server's body) is shown: enough for any one-line reason, not a whole page.
_FOREIGN_BODY_CHARS = 1000
# The exit status of a deploy that lost to another that overlapped it (409
# deployment_superseded): not 1, which says the checkpoint or the gateway is at fault, so a
# script can tell "deploy again, or leave the winner" from "fix something first".
EXIT_SUPERSEDED = 3


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: the request carries the admin key, and urllib would send it
    on to whatever host the Location names (turning the POST into a GET, too). Declining
    (None) makes urllib raise the 3xx as an ``HTTPError``, which ``run_deploy`` reports."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> None:
        return None


def _one_line(body: bytes) -> str:
    """A response body as one line: the gateway's error as its code and its whole message
    (a refused checkpoint's reason names both pools, and cut it explained nothing); anything
    else — an HTML error page is dozens of lines that bury the message, an unknown server's
    body may be anything — cut at ``_FOREIGN_BODY_CHARS``."""
    try:
        error = json.loads(body)["error"]
        text = f"{error['code']}: {error['message']}" if error.get("code") else error["message"]
        return " ".join(str(text).split())
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    text = " ".join(body.decode(errors="replace").split())
    if len(text) <= _FOREIGN_BODY_CHARS:
        return text
    return text[: _FOREIGN_BODY_CHARS - 3] + "..."


def _header_safe(value: str) -> bool:
    """Whether ``value`` can go in an HTTP header as it is: Latin-1, no control characters."""
    return all(" " <= c <= "\xff" and c != "\x7f" for c in value)


def _url_problem(url: str) -> str | None:
    """What makes ``url`` no gateway base URL urllib can send to (None: nothing), said with
    its password masked: found before anything is sent, where urllib's own errors came
    after the checkpoint was loaded, as "cannot reach the gateway" (``unknown url type``)."""
    schemeless = "://" not in url
    # Masked as the URL would be with a scheme: ``admin:pw@host:8000`` has no scheme either.
    shown = mask_url(f"http://{url}").removeprefix("http://") if schemeless else mask_url(url)
    if any(c <= " " or c == "\x7f" for c in url):
        return f"--url {shown!r} holds a space or a control character"
    if schemeless:
        return f"--url {shown} has no scheme: give the gateway's URL as http://{shown}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is not one, an unbalanced IPv6 bracket
        return f"--url {shown} is not a URL: {redact(str(exc), url)}"
    if parts.scheme not in ("http", "https"):
        return f"--url {shown}: the gateway's URL starts with http:// or https://"
    if not parts.hostname:
        return f"--url {shown} names no host"
    if port == 0:
        return f"--url {shown} names port 0"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        # The request goes to the URL with /admin/reload appended: after a query, it is
        # part of the query.
        return f"--url {shown} has a query or fragment: give the gateway's base URL"
    return None


def run_deploy(args: argparse.Namespace) -> int:
    from router.checkpoint import PACKAGED_PREFIX, CheckpointError, load_checkpoint

    url = mask_url(args.url)  # as messages show it
    if split_userinfo(args.url) is not None:
        # urllib would take "user:pw@host" for the host name (and say "Name or service not
        # known"); and the admin key is the one credential this request carries.
        log.error(
            "--url %s names a user: the admin key is what authenticates a deploy "
            "(Authorization: Bearer); give the gateway's URL without 'user:password@'",
            url,
        )
        return 2
    problem = _url_problem(args.url)
    if problem is not None:
        log.error("%s", problem)
        return 2
    # ``packaged:<name>`` names a checkpoint shipped with xrouter: the gateway resolves it in
    # its own installation, so it is sent as written.
    packaged = str(args.checkpoint).startswith(PACKAGED_PREFIX)
    given = Path(args.checkpoint)
    checkpoint_pool: list[str] | None = None
    if not packaged and not given.exists():
        # A path on the gateway's machine (a volume its pods mount), not this one: the
        # gateway loads and checks it, and refuses it with the reason if it cannot.
        if not given.is_absolute():
            log.error(
                "%s: no such checkpoint here; for one on the gateway's filesystem, give its "
                "absolute path there",
                given,
            )
            return 2
        log.info("%s is not on this machine: sent as the gateway's path, which it checks", given)
        path: str | Path = given
    else:
        path = args.checkpoint if packaged else given.resolve()
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as exc:
            log.error("%s", exc)
            return 2
        checkpoint_pool = ckpt.pool
        if not packaged and ckpt.path is not None:
            path = ckpt.path  # the checkpoint itself, where a run directory was named
    # Stripped as the gateway strips its own (``AuthSettings``): a key read from a file or
    # `$(cat key)` often ends with a newline.
    admin_key = (args.admin_key or "").strip()
    if not admin_key:
        log.error("an admin key is needed: --admin-key or XROUTER_ADMIN_KEY")
        return 2
    if not _header_safe(admin_key):
        # http.client would refuse the header with a ValueError that quotes it, key and all.
        log.error(
            "the admin key holds a character an HTTP header cannot carry (a control "
            "character, or one outside Latin-1): check --admin-key or XROUTER_ADMIN_KEY"
        )
        return 2
    # No redirects: see _RefuseRedirects. Proxies from the environment still apply.
    opener = urllib.request.build_opener(_RefuseRedirects)
    try:
        req = urllib.request.Request(
            f"{args.url.rstrip('/')}/admin/reload",
            data=json.dumps({"checkpoint": str(path)}).encode(),
            headers={
                "Authorization": f"Bearer {admin_key}",
                "Content-Type": "application/json",
            },
            method="POST",
        )
        with opener.open(req, timeout=60) as resp:
            body = json.loads(resp.read())
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except urllib.error.HTTPError as exc:
        try:
            detail = redact(_one_line(exc.read()), args.url)
        except (OSError, http.client.HTTPException):
            detail = ""  # the body was cut short: the status says enough
        if 300 <= exc.code < 400:
            where = exc.headers.get("Location") if exc.headers is not None else None
            log.error(
                "the gateway URL %s redirected (%d) to %s; not following it, so as not to send "
                "the admin key there: give --url as the gateway's own address",
                url,
                exc.code,
                redact(str(where), args.url) if where else "(no Location)",
            )
        elif exc.code == 401:
            log.error("the gateway refused the admin key (401): %s", detail)
        elif exc.code == 403:
            # Not the checkpoint's fault: the admin API is off (no auth.admin_key).
            log.error("the gateway refused the admin call (403): %s", detail)
        elif exc.code == 409 and detail.startswith("deployment_superseded"):
            # A deploy that overlapped this one was recorded first and is what serves: this
            # checkpoint is not, whatever it is worth (the line names the one that is).
            log.error("not deployed, another deploy won (409): %s", detail)
            return EXIT_SUPERSEDED
        elif exc.code in _NOT_THE_ADMIN_API:
            log.error(
                "%s does not serve POST /admin/reload (%d): --url is the gateway's base URL, "
                "without /v1 (e.g. http://127.0.0.1:8000)",
                url,
                exc.code,
            )
        else:
            log.error("the gateway refused the checkpoint (%s): %s", exc.code, detail)
        return 1
    except urllib.error.URLError as exc:
        log.error("cannot reach the gateway at %s: %s", url, redact(str(exc.reason), args.url))
        return 1
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        log.error(
            "no answer from the gateway at %s: %s",
            url,
            redact(str(exc) or type(exc).__name__, args.url),
        )
        return 1
    except ValueError as exc:  # an answer that is not the gateway's (--url is checked above)
        # Whatever the message quotes, never the key (a header error would).
        detail = redact(str(exc), args.url).replace(admin_key, "***")
        log.error("%s did not answer as an xrouter gateway: %s", url, detail)
        return 1
    # The gateway's answer names its own pool ("pool"); the checkpoint's, what it was
    # trained on, is said apart rather than overwritten by it.
    print(json.dumps({"deployed": str(path), "checkpoint_pool": checkpoint_pool, **body}, indent=2))
    return 0
