"""The text a reward judges in a TRL completion, plain or conversational; shared by the math and code rewards."""


def completion_text(completion) -> str:
    """The text to judge: a plain completion itself, or the content of a conversation's last assistant message."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
                content = "".join(part.get("text") or "" for part in content if part.get("type") == "text")
            return content
    return ""
