"""How a Responses request's tools map onto chat tools, and the model's calls back.

- ``function`` tools are chat function tools as they are.
- ``namespace`` tools group function tools (Codex sends its sub-agent tools this way): each
  becomes a chat function named ``<namespace>__<name>``, and a call to it comes back as a
  ``function_call`` with its ``namespace`` and ``name`` again.
- Anything else is a tool OpenAI runs itself (web or file search, code interpreter, image
  generation, computer use, remote MCP) or a non-function tool (``custom``): no model behind
  a chat API can call it, so it is left out and named in the response's
  ``xrouter.ignored_tools``, as a model without that capability would answer. Codex, for
  one, offers ``web_search`` on every request. Forcing such a tool with ``tool_choice`` is
  refused instead (``gateway.responses.request``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.echo import echo
from gateway.errors import bad_request

_SEP = "__"  # chat function names allow [A-Za-z0-9_-]: no dot
_MAX_NAME = 64  # a chat function name's length, as OpenAI (and the chat schema) allow


@dataclass(frozen=True, slots=True)
class ToolMap:
    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    # each chat tool's place in the request (``tools[1].tools[0]``), by chat tool index: a
    # chat-layer error about a chat tool names the tool the client sent
    sources: list[str] = field(default_factory=list)
    # chat function name -> (namespace, name), for namespaced functions
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    # types of the tools left out (hosted by OpenAI, or not functions), in request order
    ignored: list[str] = field(default_factory=list)

    def call_name(self, chat_name: str) -> tuple[str | None, str]:
        """(namespace, name) of a chat function the model called."""
        ns, name = self.namespaced.get(chat_name, (None, chat_name))
        return ns, name


def chat_name(namespace: str | None, name: str) -> str:
    return f"{namespace}{_SEP}{name}" if namespace else name


def _unique(seen: dict[str, str], function: dict[str, Any], where: str) -> None:
    """``function`` is the only one of its chat name so far (``seen``: chat name -> where
    it was given): a namespace's function named as a plain one (``ns__f``), or two
    namespaces that join alike (``a__b``/``c`` and ``a``/``b__c``), would make a call to
    that name ambiguous."""
    name = function["function"]["name"]
    source = seen.setdefault(name, where)
    if source != where:
        raise bad_request(
            f"{where}.name: offered to chat models as {echo(name)}, as {source} is: "
            "function names must be unique",
            param=f"{where}.name",
        )


def map_tools(tools: list[dict[str, Any]] | None) -> ToolMap:
    out = ToolMap()
    seen: dict[str, str] = {}
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        kind = tool.get("type")
        if kind == "function":
            out.chat_tools.append(_function(tool, where, None))
            _unique(seen, out.chat_tools[-1], where)
            out.sources.append(where)
        elif kind == "namespace":
            ns = tool.get("name")
            if not isinstance(ns, str) or not ns:
                raise bad_request(f"{where}.name: a string is required", param=f"{where}.name")
            inner_tools = tool.get("tools") or []
            if not isinstance(inner_tools, list):
                raise bad_request(
                    f"{where}.tools: a list of tools is required", param=f"{where}.tools"
                )
            for j, inner in enumerate(inner_tools):
                at = f"{where}.tools[{j}]"
                if not isinstance(inner, dict):
                    raise bad_request(f"{at}: a tool (an object) is required", param=at)
                if inner.get("type") != "function":
                    out.ignored.append(str(inner.get("type")))
                    continue
                chat_tool = _function(inner, at, ns)
                out.chat_tools.append(chat_tool)
                _unique(seen, chat_tool, at)
                out.sources.append(at)
                out.namespaced[chat_tool["function"]["name"]] = (ns, inner["name"])
        else:
            out.ignored.append(str(kind))
    return out


def _function(tool: dict[str, Any], where: str, namespace: str | None) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.name: a string is required", param=f"{where}.name")
    function: dict[str, Any] = {"name": chat_name(namespace, name)}
    if namespace and len(function["name"]) > _MAX_NAME:
        # Chat checks the name it is offered, which this name is part of: say so, rather
        # than report a length this name does not have.
        raise bad_request(
            f"{where}.name: a function in a namespace is offered to chat models as "
            f"<namespace>{_SEP}<name>, at most {_MAX_NAME} characters "
            f"({len(function['name'])} here)",
            param=f"{where}.name",
        )
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}
