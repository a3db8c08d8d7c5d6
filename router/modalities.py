"""What kinds of input a request carries and of output it asks for, and which pool models
can take or give them.

Chat messages carry text, and content parts may add images (``image_url``; ``input_image``
and ``image`` as other APIs spell it) or audio (``input_audio``). A model that cannot read a
part fails the call upstream, or worse, answers without it; so the gateway only routes a
request to models whose configured ``input_modalities`` cover what it carries. A model that
does not declare its modalities is assumed to take anything, as before they existed.

Output likewise: a chat request may ask for spoken answers (``modalities: ["text",
"audio"]``, with its ``audio`` voice and format), which only audio models give — a text
model would answer in text alone, or fail the call — so such a request is routed only to
models whose ``output_modalities`` include audio, or that declare none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

Modality = Literal["text", "image", "audio"]
# What a chat completion can answer with (OpenAI's ``modalities`` request field).
OutputModality = Literal["text", "audio"]

_PART_MODALITY: dict[str, Modality] = {
    "image_url": "image",
    "input_image": "image",
    "image": "image",
    "input_audio": "audio",
    "audio": "audio",
}


def request_modalities(messages: Sequence[Mapping[str, Any]]) -> frozenset[Modality]:
    """The input kinds in ``messages``: always text, plus image and audio if any content
    part carries them."""
    found: set[Modality] = {"text"}
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping):
                    kind = _PART_MODALITY.get(str(part.get("type")))
                    if kind is not None:
                        found.add(kind)
    return frozenset(found)


def accepts(declared: Iterable[Modality] | None, needed: Iterable[Modality]) -> bool:
    """Whether a model with ``declared`` input modalities (None: not declared, taken to
    accept anything) can read a request that carries ``needed``."""
    return declared is None or set(needed) <= set(declared)


def requested_outputs(modalities: Iterable[OutputModality] | None) -> frozenset[OutputModality]:
    """The output kinds a request's ``modalities`` field asks for: text unless it says
    otherwise."""
    return frozenset(modalities) if modalities else frozenset({"text"})


def produces(declared: Iterable[OutputModality] | None, needed: Iterable[OutputModality]) -> bool:
    """Whether a model with ``declared`` output modalities (None: not declared, taken to
    give anything asked) can answer with ``needed``."""
    return declared is None or set(needed) <= set(declared)
