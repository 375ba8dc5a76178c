"""Drafts copied from the context (prompt lookup): the tokens that followed the latest earlier
occurrence of the context's last few tokens.

Design decisions:
- Copied drafts cost no forward: `verified` proposes them instead of running the NAR drafting pass
  when the context has a match (policies.py), and verifies them like any draft, so the output stays
  exactly `ar`'s. Answers quote their prompt (names, code, phrases) and repeat themselves, which the
  NAR set, trained on other text, does not know; its misses and the copies' differ (issue 13: prompt
  lookup alone accepted 2.13 tokens per step on held-out code).
- An index from each n-gram (n = MIN_NGRAM..MAX_NGRAM) to the position after its latest occurrence,
  updated as tokens are committed: a lookup costs MAX_NGRAM dict probes, not a scan of the context
  (a Python scan of a few hundred tokens per step would be felt beside yue-code-mini's short steps:
  per-call overhead dominates them).
- The longest n-gram that occurred before wins (the most specific context); the continuation starts
  after its latest occurrence, the one most like the present.
"""

from __future__ import annotations

MIN_NGRAM, MAX_NGRAM = 2, 4


class NgramIndex:
    """One row's context and where each of its n-grams last occurred.

    Attributes:
        tokens: the context so far (prompt, then committed tokens).
        after: n-gram (tuple) -> index in `tokens` just past its latest occurrence, for every n-gram
            except the context's own trailing ones (a match must have a continuation).
    """

    def __init__(self, tokens: list[int]) -> None:
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, new: list[int]) -> None:
        """Append committed tokens; each n-gram that now has a continuation is (re)indexed."""
        for t in new:
            end = len(self.tokens)  # n-grams ending at end - 1 now have tokens[end] after them
            for n in range(MIN_NGRAM, MAX_NGRAM + 1):
                if end >= n:
                    self.after[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(t)

    def match(self, n: int) -> tuple[int, list[int]]:
        """(g, drafts): up to n tokens that followed the latest earlier occurrence of the longest
        trailing n-gram that occurred before, and its length g (a longer match is a surer copy: on
        yue-smol's calibration answers a draft's first token held 0.52 of the time after a 2-gram
        match, 0.83 after a 4-gram); (0, []) when none did."""
        for g in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
            if len(self.tokens) < g:
                continue
            start = self.after.get(tuple(self.tokens[-g:]))
            if start is not None:
                return g, self.tokens[start : start + n]
        return 0, []
