"""The replay index: an outcome table keyed by normalized prompt text.

The replay upstream answers a chat request by looking up the request's prompt (the last user
message, as ``router.outcomes.conversation_text`` defines it) in an outcome table. Prompts are
compared after collapsing whitespace, so a client that re-wraps or strips the prompt still
hits its record. The whole table is indexed once at startup; a lookup is one dict access.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pricing import estimate_tokens
from router.outcomes import OutcomeRecord, conversation_text, parse_record

log = logging.getLogger(__name__)

DEMO_TABLE_RESOURCE = ("router", "assets/demo_outcomes.jsonl")


def normalize_prompt(text: str) -> str:
    """The lookup key: whitespace runs collapsed to one space, ends stripped."""
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class RecordedAnswer:
    """One model's recorded answer to one prompt, with the token counts it really used."""

    response: str
    prompt_tokens: int
    completion_tokens: int


class ReplayTable:
    """Normalized prompt -> {model -> RecordedAnswer}, plus the set of models served."""

    def __init__(self, records: Iterable[OutcomeRecord]) -> None:
        self._index: dict[str, dict[str, RecordedAnswer]] = {}
        # The raw prompt text too: clients usually send it verbatim, and an exact hit skips
        # normalizing (which costs more than the rest of a lookup for a 1 KB prompt).
        self._exact: dict[str, dict[str, RecordedAnswer]] = {}
        models: dict[str, None] = {}  # insertion-ordered set: first-seen order is stable
        duplicates = 0
        for rec in records:
            for name in rec.outcomes:
                models.setdefault(name, None)
            key = normalize_prompt(rec.text)
            if key in self._index:
                # First record wins, so the answer for a prompt does not depend on which of
                # several copies happened to be loaded last.
                duplicates += 1
                continue
            answers: dict[str, RecordedAnswer] = {}
            for name, outcome in rec.outcomes.items():
                if outcome.response is None:
                    continue  # no text to replay: this model falls back for this prompt
                answers[name] = RecordedAnswer(
                    response=outcome.response,
                    prompt_tokens=(
                        outcome.prompt_tokens
                        if outcome.prompt_tokens is not None
                        else estimate_tokens(rec.text)
                    ),
                    completion_tokens=(
                        outcome.completion_tokens
                        if outcome.completion_tokens is not None
                        else estimate_tokens(outcome.response)
                    ),
                )
            self._index[key] = answers
            self._exact.setdefault(rec.text, answers)
        self._models: tuple[str, ...] = tuple(models)
        self._model_set = frozenset(self._models)
        if duplicates:
            log.warning(
                "replay table: %d records repeat an earlier prompt; kept the first", duplicates
            )

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_lines(cls, lines: Iterable[bytes | str], where: str = "<table>") -> ReplayTable:
        return cls(
            parse_record(line, f"{where}:{n}") for n, line in enumerate(lines, 1) if line.strip()
        )

    @classmethod
    def load(cls, path: str | Path) -> ReplayTable:
        """Load an outcome table file (blocking; call it at startup, not on a request path)."""
        p = Path(path)
        with p.open("rb") as fh:
            table = cls.from_lines(fh, str(p))
        log.info("replay table %s: %d prompts, %d models", p, len(table), len(table.models))
        return table

    @classmethod
    def load_default(cls) -> ReplayTable:
        """The packaged demo table (router/assets/demo_outcomes.jsonl)."""
        package, name = DEMO_TABLE_RESOURCE
        data = resources.files(package).joinpath(name).read_bytes()
        return cls.from_lines(data.splitlines(), f"{package}/{name}")

    # -- queries ------------------------------------------------------------------------
    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    def has_model(self, model: str) -> bool:
        return model in self._model_set

    def __len__(self) -> int:
        return len(self._index)

    def lookup(self, prompt: str, model: str) -> RecordedAnswer | None:
        """The recorded answer of ``model`` to ``prompt`` (raw text; normalized here)."""
        answers = self._exact.get(prompt)
        if answers is None:
            answers = self._index.get(normalize_prompt(prompt))
        return None if answers is None else answers.get(model)

    def lookup_messages(
        self, messages: Sequence[dict[str, Any]], model: str
    ) -> RecordedAnswer | None:
        return self.lookup(conversation_text(messages), model)
