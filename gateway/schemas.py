"""Wire formats of the OpenAI-compatible API (requests are validated, then forwarded as the
client sent them so that fields we don't model still reach the provider)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gateway.echo import echo
from pricing.money import MAX_USD
from router.outcomes import MAX_COST_WEIGHT


class _Open(BaseModel):
    # Unknown fields are tolerated (and logged by the route), as OpenAI adds fields often.
    # Known ones are checked strictly, as OpenAI checks them: the body is forwarded as sent,
    # so a value pydantic would coerce ("true" for a boolean) would reach the provider
    # unconverted and come back as an upstream 4xx, after the gateway had acted on its
    # coerced reading (``stream_options.include_usage: "false"`` counted as true).
    model_config = ConfigDict(extra="allow", strict=True)


class ImageURL(_Open):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class InputAudio(_Open):
    data: str
    format: str


class FileRef(_Open):
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = None


class TextPart(_Open):
    type: Literal["text"]
    text: str


class ImagePart(_Open):
    type: Literal["image_url"]
    image_url: ImageURL


class AudioPart(_Open):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FilePart(_Open):
    type: Literal["file"]
    file: FileRef

    @model_validator(mode="after")
    def _names_a_file(self) -> FilePart:
        if self.file.file_data is None and self.file.file_id is None:
            raise PydanticCustomError("missing", "a 'file' part needs 'file_data' or 'file_id'")
        return self


class RefusalPart(_Open):
    type: Literal["refusal"]
    refusal: str


# Content parts of the types OpenAI defines are checked for their payload, as OpenAI checks
# them: a part without it would be forwarded, refused by the provider, and reach the client
# as a 502. The tags are class names, which error locations leave out (``loc_to_param``).
_PART_TAGS = {
    "text": "TextPart",
    "image_url": "ImagePart",
    "input_audio": "AudioPart",
    "file": "FilePart",
    "refusal": "RefusalPart",
}
OPENAI_PART_TYPES = frozenset(_PART_TAGS)


class OtherPart(_Open):
    """A part of a type OpenAI does not define, forwarded unchecked: providers behind LiteLLM
    take their own (``video_url``, ``document``), and only they know what those need."""

    # In the JSON schema (the OpenAPI document), the types that have a model of their own
    # are excluded, so that a part matches exactly one member of the union, as it does here.
    type: str = Field(
        json_schema_extra={"not": {"enum": list[JsonValue](sorted(OPENAI_PART_TYPES))}}
    )


def _part_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _PART_TAGS.get(kind, "OtherPart") if isinstance(kind, str) else "OtherPart"


ContentPart = Annotated[
    Annotated[TextPart, Tag("TextPart")]
    | Annotated[ImagePart, Tag("ImagePart")]
    | Annotated[AudioPart, Tag("AudioPart")]
    | Annotated[FilePart, Tag("FilePart")]
    | Annotated[RefusalPart, Tag("RefusalPart")]
    | Annotated[OtherPart, Tag("OtherPart")],
    Discriminator(_part_tag),
]


class FunctionCall(_Open):
    name: str = Field(min_length=1)
    arguments: str  # JSON text, as the model wrote it (not an object)


class ToolCallItem(_Open):
    """A call in an assistant message of the history, as OpenAI checks it: the body is
    forwarded as sent, and a provider's 400 for it would reach the client as a 502."""

    id: str = Field(min_length=1)
    type: Literal["function"]
    function: FunctionCall


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None


# OpenAI's chat API takes at most this many ``stop`` sequences.
MAX_STOP_SEQUENCES = 4

# OpenAI's rule for a function's name (its 400: "does not match pattern").
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class FunctionDef(_Open):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool | None = None


class UsageAccounting(_Open):
    """OpenRouter's ``"usage": {"include": true}``: asks for the cost in ``usage``, which every
    answer here carries anyway (as ``stream_options.include_usage`` changes nothing). Taken
    and not forwarded: OpenAI's API refuses a request field it does not know
    ("Unrecognized request argument supplied: usage"), so a client moved from OpenRouter
    with it got that upstream 400 from every OpenAI model."""

    include: bool | None = None


class JsonSchemaFormat(_Open):
    """``response_format.json_schema`` as OpenAI checks it: a provider would refuse what this
    refuses, and its 400 would reach the client as a 502 (which the SDKs retry)."""

    name: str = Field(pattern=FUNCTION_NAME)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a json_schema object (with its name) is required for this type")
        return self


class CacheControls(BaseModel):
    """Per-request answer-cache controls: ``"xrouter": {"cache": {...}}`` (as LiteLLM's
    ``cache`` parameter and HTTP's Cache-Control directives)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    no_cache: bool = False  # don't answer from the cache (a fresh answer is still stored)
    no_store: bool = False  # don't store this request's answer
    ttl_s: float | None = Field(default=None, gt=0)  # shorter than the configured TTL only
    max_age_s: float | None = Field(default=None, ge=0)  # accept only answers this fresh


MAX_TAGS = 16
MAX_TAG_CHARS = 64


class XRouterControls(BaseModel):
    """Per-request routing controls: ``"xrouter": {...}`` in the body."""

    model_config = ConfigDict(extra="forbid", strict=True)

    cost_weight: float | None = Field(default=None, ge=0, le=MAX_COST_WEIGHT)
    max_cost_usd: float | None = Field(default=None, gt=0, le=MAX_USD, allow_inf_nan=False)
    models: list[str] | None = Field(default=None, min_length=1)
    cache: CacheControls | None = None
    # What the caller files the request under (a feature, a team, an experiment): spend per
    # tag in /admin/spend. At most 16, each 1 to 64 characters.
    tags: list[str] | None = Field(default=None, max_length=MAX_TAGS)

    @field_validator("cost_weight")
    @classmethod
    def _no_negative_zero(cls, value: float | None) -> float | None:
        # -0.0 passes ``ge=0`` but would be logged, cached and shown to a router as "-0".
        return None if value is None else value + 0.0

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else checked_tags(value)


def checked_tags(value: list[str]) -> list[str]:
    """Tags as a request files itself under them, each once; a ValueError for a bad one."""
    for tag in value:
        if not tag or len(tag) > MAX_TAG_CHARS or "\x00" in tag:
            raise ValueError(f"a tag is 1 to {MAX_TAG_CHARS} characters, without NUL characters")
    return list(dict.fromkeys(value))  # repeats count once


class LiteLLMMetadata(_Open):
    """A chat request's ``metadata``: any object, as LiteLLM's proxy takes it (OpenAI types
    its values as strings; LiteLLM's clients send lists in it), of which only ``tags`` is
    read — what LiteLLM's proxy files spend under, here the request's tags when
    ``xrouter.tags`` does not set them."""

    tags: list[str] | None = Field(default=None, max_length=MAX_TAGS)

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else checked_tags(value)


class ChatCompletionRequest(_Open):
    # Strict, as every part of it (``_Open``): ``"stream": "false"`` streamed before.
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # What the answer may be given in: ["text"], or ["text", "audio"] for a spoken answer
    # (routed only to models that declare audio output, router.modalities).
    modalities: list[Literal["text", "audio"]] | None = None
    user: str | None = None
    # OpenAI's newer name for the end user (abuse detection), forwarded as ``user`` is; the
    # ledger's end user when ``user`` is absent (gateway.chat).
    safety_identifier: str | None = None
    # Taken and not forwarded, as the Responses API takes them: ``store: true`` would keep
    # the client's conversation in the operator's provider account (and ``metadata`` with
    # it), which the gateway never offers (it answers Responses requests with store: false).
    store: bool | None = None
    metadata: LiteLLMMetadata | None = None
    usage: UsageAccounting | None = None  # OpenRouter's usage accounting: always on here
    xrouter: XRouterControls | None = None

    @field_validator("stream", "n", mode="before")
    @classmethod
    def _null_is_the_default(cls, v: Any, info: ValidationInfo) -> Any:
        # OpenAI documents both as "or null", defaulting, and its SDKs send ``null`` for an
        # argument passed as None (``n=None``, ``stream=None``).
        if v is None:
            return cls.model_fields[info.field_name or ""].default
        return v

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        # As OpenAI and vLLM: an option of a stream that is not one is a client mistake
        # (usually ``stream`` forgotten), not something to drop silently.
        if v is not None and not info.data.get("stream", True):  # absent: invalid
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[Tool] | None) -> list[Tool] | None:
        # Two tools of one name make a call to it ambiguous (Anthropic's API refuses them:
        # "Tool names must be unique").
        first: dict[str, int] = {}
        for i, tool in enumerate(v or ()):
            j = first.setdefault(tool.function.name, i)
            if j != i:
                raise ValueError(
                    f"tools[{i}] and tools[{j}] are both named {echo(tool.function.name)}: "
                    "tool names must be unique"
                )
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(v, str) and v not in ("none", "auto", "required"):
            raise ValueError("tool_choice must be 'none', 'auto', 'required' or a named tool")
        # Only function tools are served, so an object of another type (`allowed_tools`,
        # `custom`, none at all) can force nothing here: refused before any model is asked,
        # not sent to each model in turn to be refused by every one.
        if isinstance(v, dict) and v.get("type") != "function":
            raise ValueError(
                f"tool_choice of type {echo(v.get('type'))} is not supported: name a function "
                "tool as {'type': 'function', 'function': {'name': ...}}"
            )
        return v


_REQUEST_ID = re.compile(r"^[0-9A-Za-z_.:-]{1,128}$")


def request_id_from(value: str) -> str:
    """The request an id names: ``xrouter.request_id`` itself, or the completion's ``id``
    (``chatcmpl-<request id>``, what an OpenAI client shows first), the Responses API's
    (``resp_<request id>``) or the Messages API's (``msg_<request id>``)."""
    if not _REQUEST_ID.match(value):
        raise ValueError("a request id is 1 to 128 letters, digits and _.:- characters")
    for prefix in ("chatcmpl-", "resp_", "msg_"):
        if value.startswith(prefix) and len(value) > len(prefix):
            return value[len(prefix) :]
    return value


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[0-9A-Za-z_.:-]+$")
    # Strict, as chat's numbers are: "1" and true are not scores.
    score: float = Field(ge=0, le=1, strict=True)

    comment: str | None = Field(default=None, max_length=4000)
    source: str = Field(default="user", max_length=64)

    @property
    def ledger_id(self) -> str:
        """The request ``request_id`` names (``chatcmpl-<id>`` names ``<id>``). The field
        keeps the id as the client sent it, for messages that must name what it sent."""
        return request_id_from(self.request_id)
