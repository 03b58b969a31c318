"""A generator for tests whose reply to each request is `script(role, prompt)` (an Exception is raised);
it keeps every batch it was sent, so a test can check that questions advance together."""

from __future__ import annotations

from knowtrace_train.generation.base import Completion


class Scripted:
    """Answers each request from `script(role, prompt)`; keeps every batch it was sent."""

    def __init__(self, script) -> None:
        self.script = script
        self.batches: list[list] = []

    def generate(self, requests):
        self.batches.append(list(requests))
        out = []
        for r in requests:
            text = self.script(r.role, r.prompt)
            if isinstance(text, Exception):
                raise text
            out.append(Completion(text=text, prompt_tokens=len(r.prompt.split()), output_tokens=len(text.split()),
                                  finish_reason="stop"))
        return out

    def count_tokens(self, text):
        return len(text.split())

    def close(self):
        pass
