"""The outcome table: what routers are trained and evaluated on (stable contract).

One JSON object per line::

    {"id": "...", "task": "gsm8k", "prompt": "..."  (or "messages": [...]),
     "outcomes": {"<model>": {"score": 0.0-1.0, "cost_usd": 0.0012,
                              "prompt_tokens": 123, "completion_tokens": 456,
                              "response": "..."}}}

An optional ``group`` keeps records together when a table is split: records sharing one
fall in the same part (``split_key``). The ledger export sets it to the prompt's hash, since
logged traffic repeats prompts under distinct request ids, and a repeat on each side of the
split would score a router on prompts it was trained on.

Logged gateway traffic has *partial feedback*: only the chosen model's outcome is known,
and the record says which action was taken with which propensity (``logged``). This module
has no heavy dependencies so the replay upstream (gateway) and the trainers share it.
"""

from __future__ import annotations

import codecs
import errno
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pricing.money import MAX_USD


class OutcomeTableError(ValueError):
    """A line of an outcome table is malformed; the message names the file and line."""


class ModelOutcome(BaseModel):
    model_config = ConfigDict(extra="allow")

    # Not inf or NaN: orjson writes both as null, so such a value would be silently lost
    # (or turn into an unknown cost) the next time the table is written and read.
    score: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    # At most MAX_USD, the most any amount the gateway and its ledger hold: a finite cost
    # past it (1e308) is no cost a prompt ever had, but a sentinel or unit slip, and it
    # overflowed float64 in evaluation (normalized, summed, times λ), far from this line.
    cost_usd: float | None = Field(default=None, ge=0.0, le=MAX_USD, allow_inf_nan=False)
    prompt_tokens: int | None = Field(default=None, ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    response: str | None = None
    latency_ms: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)


MIN_PROPENSITY = 1e-12
# The largest cost weight (λ) a request may ask for: the gateway's bound.
MAX_COST_WEIGHT = 1e6


class LoggedAction(BaseModel):
    """How a logged request was routed: needed for off-policy learning."""

    model_config = ConfigDict(extra="allow")

    action: str
    # Not merely positive: an action taken with a probability below MIN_PROPENSITY would
    # carry an importance weight past 1e12 (and underflow to 0 in the trainer's float32,
    # its weight infinite), which no estimate survives — a logging bug, not traffic.
    propensity: float = Field(ge=MIN_PROPENSITY, le=1.0)
    # The request's λ, bounded as the gateway bounds it (``gateway.schemas``): a negative,
    # huge or non-finite one is no traffic the gateway could have logged, and would
    # otherwise fail late in evaluation with no line to point at.
    cost_weight: float | None = Field(default=None, ge=0.0, le=MAX_COST_WEIGHT, allow_inf_nan=False)
    policy: str | None = None
    # Every model called, in order, when the policy made more than one call (a cascade's
    # plan). The outcome is then the whole trajectory's, not ``action``'s alone.
    actions: list[str] | None = None
    # The content version of the checkpoint that decided, when one did.
    checkpoint: str | None = None

    @property
    def multi_call(self) -> bool:
        """Whether the logged outcome is a multi-call trajectory's: learners and estimators
        over single-model actions must skip it (no one model's outcome was observed)."""
        return self.actions is not None and len(self.actions) > 1


class OutcomeRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    # Records sharing a group are split together (see the module docstring).
    group: str | None = Field(default=None, min_length=1)
    task: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    outcomes: dict[str, ModelOutcome]
    logged: LoggedAction | None = None

    @model_validator(mode="after")
    def _check(self) -> OutcomeRecord:
        if self.prompt is None and not self.messages:
            raise ValueError("needs `prompt` or `messages`")
        if not self.outcomes:
            raise ValueError("`outcomes` is empty")
        if self.logged is not None and self.logged.action not in self.outcomes:
            raise ValueError(f"logged action {self.logged.action!r} has no outcome")
        return self

    @property
    def split_key(self) -> str:
        """What the train/validation/test split hashes: the group, or the id alone."""
        return self.group if self.group is not None else self.id

    @property
    def text(self) -> str:
        """The prompt as one string (the last user message for chat records)."""
        if self.prompt is not None:
            return self.prompt
        return conversation_text(self.messages or [])

    @property
    def partial_feedback(self) -> bool:
        """Logged traffic: the outcome of the action the logging policy took, and no other
        (what ``xrouter export`` writes). A table of such records needs off-policy
        estimates, however few models it holds: one model's column of them is not that
        model's outcome on every prompt a router would see, but on the prompts sent to it."""
        return self.logged is not None and self.outcomes.keys() <= {self.logged.action}

    @property
    def has_prompt(self) -> bool:
        """False for a ledger export of a request whose content the gateway did not log
        (``content_logged``: ``none`` or ``hash``, from ``ledger.log_content``): its prompt
        is a placeholder, the same for every such request, so a router that reads the
        prompt can neither learn from it nor be judged on it."""
        return (self.model_extra or {}).get("content_logged") not in ("none", "hash")

    def chat_messages(self) -> list[dict[str, Any]]:
        if self.messages:
            return self.messages
        return [{"role": "user", "content": self.prompt or ""}]


def content_text(content: Any) -> str:
    """Text of an OpenAI message ``content`` (a string or a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


def conversation_text(messages: Iterable[dict[str, Any]]) -> str:
    """The text routers key on: the last user message (what the seed and the outcome data
    call the prompt)."""
    last = ""
    for m in messages:
        if m.get("role") == "user":
            last = content_text(m.get("content"))
    return last


def parse_record(line: str | bytes, where: str = "<input>") -> OutcomeRecord:
    # A UTF-8 byte order mark, which editors and pandas' utf-8-sig put at the start of a
    # file (and ``cat`` then in the middle of one): no JSON, but no reason to refuse it.
    line = line.removeprefix(codecs.BOM_UTF8) if isinstance(line, bytes) else line.lstrip("\ufeff")
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise OutcomeTableError(f"{where}: not valid JSON ({exc})") from None
    return validate_record(data, where)


def validate_record(data: Any, where: str = "<input>") -> OutcomeRecord:
    try:
        return OutcomeRecord.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(record)"
        if isinstance(data, dict) and data.get("scored") is False and loc.endswith(".score"):
            # `xrouter export --include-unscored`: the request has no feedback yet.
            raise OutcomeTableError(
                f"{where}: record {data.get('id')!r} is unscored (exported with "
                "--include-unscored): give it a score (feedback or a judge) first, or "
                "export without --include-unscored"
            ) from None
        raise OutcomeTableError(f"{where}: {loc}: {first['msg']}") from None


class UniqueIds:
    """Rejects a second record with an id already seen, naming both places. Ids are what
    records are split by and counted as prompts, so a repeated one would weigh that prompt
    twice (or put its copies in different splits, were they to differ)."""

    # What a duplicate raises: the converters raise their own error type.
    error: ClassVar[type[ValueError]] = OutcomeTableError

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def check(self, record_id: str, where: str) -> None:
        first = self._seen.get(record_id)
        if first is not None:
            raise self.error(f"{where}: duplicate id {record_id!r} (first at {first})")
        self._seen[record_id] = where


def iter_outcome_table(path: str | Path) -> Iterator[OutcomeRecord]:
    """JSONL, one record per line; or a ledger export in Parquet (``.parquet``). Ids must
    be unique."""
    p = Path(path)
    ids = UniqueIds()
    if p.suffix == ".parquet":
        from router.export_parquet import read_parquet_records

        if not p.is_file():
            # Said as the OS says it, as for a JSONL table: the Parquet reader's own error
            # read as "not a ledger export in Parquet" for a file that is not there at all.
            code = errno.EISDIR if p.is_dir() else errno.ENOENT
            raise OSError(code, os.strerror(code), str(p))

        try:
            rows = read_parquet_records(p)
        except ImportError:
            raise OutcomeTableError(
                f"{p}: reading Parquet needs pyarrow (pip install 'xrouter[train]')"
            ) from None
        except Exception as exc:  # pyarrow's errors for a file that is not this layout
            raise OutcomeTableError(f"{p}: not a ledger export in Parquet ({exc})") from None
        for i, row in enumerate(rows, 1):
            where = f"{p}: row {i}"
            record = validate_record(row, where)
            ids.check(record.id, where)
            yield record
        return
    with p.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                where = f"{p}:{lineno}"
                record = parse_record(line, where)
                ids.check(record.id, where)
                yield record


def load_outcome_table(path: str | Path) -> list[OutcomeRecord]:
    return list(iter_outcome_table(path))


def write_outcome_table(records: Iterable[OutcomeRecord], path: str | Path) -> int:
    n = 0
    with Path(path).open("wb") as fh:
        for r in records:
            fh.write(orjson.dumps(r.model_dump(exclude_none=True)))
            fh.write(b"\n")
            n += 1
    return n
