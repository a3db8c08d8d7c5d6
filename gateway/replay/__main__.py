"""``python -m gateway.replay``: run the replay upstream (same CLI as ``xrouter replay-upstream``)."""

from __future__ import annotations

import argparse

from gateway.replay.server import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.replay",
        description="OpenAI-compatible upstream that replays recorded model outcomes.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
