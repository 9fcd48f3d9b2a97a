"""Chat rendering and tool-call parsing, as the chat route imports them: the rendering of chat
messages into prompt ids lives in wharf/core/chat_template.py (convert renders text-only calls
with the same function), the tool-call formats in tool_parsers.py."""
from __future__ import annotations

from wharf.core.chat_template import (ChatError, normalize_messages, render_prompt_ids,  # noqa: F401 (re-exported)
                                 template_supports_tools, tools_system_block)
from .tool_parsers import HERMES_OPEN as TOOL_OPEN, parse_hermes as parse_tool_calls  # noqa: F401 (re-exported)
