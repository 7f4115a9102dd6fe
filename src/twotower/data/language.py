"""Which language a set of texts is written in, from their scripts and commonest words: ``detect_language``.

BM25's ``auto`` language (:mod:`twotower.retrieval.analyzers`), the fit's label-free choices and the encoders'
language-bias removal (:mod:`twotower.encoders.language_bias`) all detect with it, so it lies on the data floor
beneath them. ``normalize`` (NFKC and case folding) and ``WORD`` (the regex module's ``\\w+``: letters with their
combining marks) are the analyzers' first steps too.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Sequence

import regex

WORD = regex.compile(r"\w+")  # the regex module's \w: letters, combining marks, digits, connectors


def normalize(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


# script (Unicode name as the regex module spells it) -> language code, for scripts one language dominates
_SCRIPT_LANGUAGE = {
    "Han": "zh", "Hangul": "ko", "Thai": "th", "Lao": "lo", "Khmer": "km", "Myanmar": "my", "Greek": "el",
    "Cyrillic": "ru", "Arabic": "ar", "Devanagari": "hi", "Tamil": "ta", "Armenian": "hy",
}
_SCRIPTS = {name: regex.compile(rf"\p{{{name}}}") for name in (*_SCRIPT_LANGUAGE, "Latin", "Hiragana", "Katakana")}
# letters only Vietnamese uses among Latin-script languages (not ă, â, ê, ô: Romanian, French, Portuguese)
_VIETNAMESE = regex.compile(r"[đơưạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹ]")
# the commonest function words of Latin-script languages that have a stemmer, for a vote
_FUNCTION_WORDS = {
    "en": "the of and to in is was that for with as by on are from",
    "de": "der die und das ist nicht mit von den zu im ein eine des sich",
    "es": "el la de que y los las en del por una con para es se",
    "fr": "le la les et des est une du en que dans pour qui sur au",
    "it": "il di che la le per gli del della una non con sono è nel",
    "pt": "o a de que e do da em um uma os para com não no",
    "nl": "de het een van en in is dat op te zijn met voor niet die",
    "tr": "ve bir bu da de için ile olarak olan daha çok gibi en ise",
    "sv": "och att det som en på är av för med till den har inte om",
    "id": "yang dan di dari ini itu dengan untuk tidak dalam akan pada",
}
_FUNCTION_SETS = {code: frozenset(words.split()) for code, words in _FUNCTION_WORDS.items()}


def detect_language(texts: Sequence[str], *, sample: int = 2000) -> str:
    """A language code from the scripts of ``texts`` (``sample`` of them, evenly spread): the language of
    the script that holds ≥ 80% of the letters; among Latin-script languages, Vietnamese by its letters, else
    a vote of function words; ``multi`` when no script dominates or nothing matches."""
    letters: Counter[str] = Counter()
    words: list[str] = []
    for text in texts[:: max(1, len(texts) // sample)]:
        text = normalize(text)
        for name, pattern in _SCRIPTS.items():
            letters[name] += len(pattern.findall(text))
        words.extend(WORD.findall(text))
    total = sum(letters.values())
    if not total:
        return "multi"
    kana = letters["Hiragana"] + letters["Katakana"]
    if (kana + letters["Han"]) / total >= 0.8 and kana >= 0.1 * (kana + letters["Han"]):
        return "ja"
    script, count = max(((s, c) for s, c in letters.items() if s not in ("Hiragana", "Katakana")),
                        key=lambda sc: sc[1])
    if count / total < 0.8:
        return "multi"
    if script != "Latin":
        return _SCRIPT_LANGUAGE[script]
    if words and sum(1 for w in words if _VIETNAMESE.search(w)) / len(words) >= 0.1:
        return "vi"
    votes = {code: sum(1 for w in words if w in s) for code, s in _FUNCTION_SETS.items()}
    best = max(votes, key=votes.__getitem__)
    return best if words and votes[best] / len(words) >= 0.05 else "multi"
