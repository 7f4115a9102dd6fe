"""Text analysis for BM25, chosen per language: text in, the terms BM25 indexes out.

Every language but ``en`` is analysed the same way, in four steps:

1. normalize: Unicode NFKC (full-width forms, ligatures, presentation forms folded) and case folding;
2. split by script: Unicode words (letters *with their combining marks*, digits) where words are written
   apart; character uni+bi-grams for Chinese, Japanese and Korean; bigrams of grapheme clusters for Thai,
   Lao, Khmer and Burmese (written without spaces between words);
3. drop the language's stopwords where bm25s ships a list;
4. stem with the language's Snowball stemmer where PyStemmer has one.

``en`` keeps bm25s' own tokenizer exactly as twotower used it before languages existed (lowercase, the
``\\b\\w\\w+\\b`` regex, bm25s' English stopwords, Snowball english): English indexes, old and new, give the
same results. That regex is what failed elsewhere: Chinese has no spaces (a whole clause became one term),
and Python's ``\\w`` leaves out combining marks, which cut Hindi and Thai words apart at every vowel sign.

``multi`` is for collections mixing languages: words for spaced scripts, uni+bi-grams for Han/kana/Hangul,
grapheme bigrams for Thai-like scripts, no stopwords, and a stemmer chosen by each word's script (Cyrillic:
Russian, Greek, Arabic, Devanagari: Hindi, Latin: English; :class:`ScriptStemmer`).

``auto`` (see :func:`twotower.data.language.detect_language`, importable from here) picks a code from the
documents' scripts.

Each choice was measured on XQuAD-R (question → answer sentence, 1190 questions per language, NDCG@10;
``benchmarks/experiments/bm25_analyzer_choices.py``): for zh, character uni+bi-grams 0.817 against unigrams 0.815,
bigrams 0.799, the jieba segmenter 0.801, and jieba's words plus their characters 0.820 (not significantly
better: paired randomization p = 0.38, for a 42 MB dependency); for th, grapheme bigrams 0.810 against
grapheme uni+bi-grams 0.804, code-point bigrams 0.799, code-point unigrams 0.339 and pythainlp's newmm
segmenter 0.798 (a 67 MB dependency); the Snowball stemmers gained 0.02–0.12 in each of ar de el es hi ru tr.
On the 11-language pool ``multi`` reached 0.189 with its script stemmers, 0.182 without, 0.169 with ``en``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import bm25s.stopwords as bm25s_stopwords
import regex
import Stemmer
from bm25s.tokenization import Tokenizer

from twotower.data.language import WORD, detect_language, normalize
from twotower.errors import TwoTowerError

# bm25s' default pattern, kept for ``en``: runs of two or more \w characters (Python's re: no combining marks)
EN_PATTERN = r"(?u)\b\w\w+\b"

_SPACELESS_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u30FC"  # ー: kana's long-vowel mark
_SPACELESS_SEA = r"\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
# one match per run of: CJK characters | Thai-like characters | any other word characters
_RUNS = regex.compile(
    rf"(?P<cjk>[{_SPACELESS_CJK}]+)|(?P<sea>[{_SPACELESS_SEA}]+)|(?P<word>[\w--[{_SPACELESS_CJK}{_SPACELESS_SEA}]]+)",
    regex.V1,
)
_GRAPHEME = regex.compile(r"\X")

# bm25s' stopword lists by language code
STOPWORDS: dict[str, tuple[str, ...]] = {
    "en": bm25s_stopwords.STOPWORDS_EN, "de": bm25s_stopwords.STOPWORDS_GERMAN,
    "nl": bm25s_stopwords.STOPWORDS_DUTCH, "fr": bm25s_stopwords.STOPWORDS_FRENCH,
    "es": bm25s_stopwords.STOPWORDS_SPANISH, "pt": bm25s_stopwords.STOPWORDS_PORTUGUESE,
    "it": bm25s_stopwords.STOPWORDS_ITALIAN, "ru": bm25s_stopwords.STOPWORDS_RUSSIAN,
    "sv": bm25s_stopwords.STOPWORDS_SWEDISH, "no": bm25s_stopwords.STOPWORDS_NORWEGIAN,
    "zh": bm25s_stopwords.STOPWORDS_CHINESE, "tr": bm25s_stopwords.STOPWORDS_TURKISH,
    "ko": bm25s_stopwords.STOPWORDS_KOREAN, "da": bm25s_stopwords.STOPWORDS_DANISH,
}


@dataclass(frozen=True)
class Language:
    code: str
    name: str
    split: str = "words"  # en | words | cjk | graphemes | multi
    stemmer: str | None = None  # PyStemmer algorithm, or BY_SCRIPT
    stopwords: str | None = None  # key of STOPWORDS


def _snowball(code: str, algorithm: str, stop: bool = False) -> Language:
    return Language(code, algorithm.capitalize(), "words", algorithm, code if stop else None)


LANGUAGES: dict[str, Language] = {
    lang.code: lang
    for lang in (
        Language("en", "English (bm25s tokenizer, as before)", "en", "english", "en"),
        _snowball("ar", "arabic"), _snowball("hy", "armenian"), _snowball("eu", "basque"),
        _snowball("ca", "catalan"), _snowball("cs", "czech"), _snowball("da", "danish", True),
        _snowball("nl", "dutch", True), _snowball("eo", "esperanto"), _snowball("et", "estonian"),
        _snowball("fi", "finnish"), _snowball("fr", "french", True), _snowball("de", "german", True),
        _snowball("el", "greek"), _snowball("hi", "hindi"), _snowball("hu", "hungarian"),
        _snowball("id", "indonesian"), _snowball("ga", "irish"), _snowball("it", "italian", True),
        _snowball("lt", "lithuanian"), _snowball("ne", "nepali"), _snowball("no", "norwegian", True),
        _snowball("fa", "persian"), _snowball("pl", "polish"), _snowball("pt", "portuguese", True),
        _snowball("ro", "romanian"), _snowball("ru", "russian", True), _snowball("sr", "serbian"),
        _snowball("st", "sesotho"), _snowball("es", "spanish", True), _snowball("sv", "swedish", True),
        _snowball("ta", "tamil"), _snowball("tr", "turkish", True), _snowball("yi", "yiddish"),
        Language("vi", "Vietnamese"),
        Language("zh", "Chinese (character uni+bi-grams)", "cjk"),
        Language("ja", "Japanese (character uni+bi-grams)", "cjk"),
        Language("ko", "Korean (character uni+bi-grams)", "cjk"),
        Language("th", "Thai (grapheme bigrams)", "graphemes"),
        Language("lo", "Lao (grapheme bigrams)", "graphemes"),
        Language("km", "Khmer (grapheme bigrams)", "graphemes"),
        Language("my", "Burmese (grapheme bigrams)", "graphemes"),
        Language("multi", "any mix of languages (stemmed by script)", "multi", "by-script"),
    )
}
AUTO = "auto"


def language_codes() -> str:
    return ", ".join(sorted(LANGUAGES))


def check_language(code: str) -> str:
    """``code`` if it names a language (or ``auto``), else an error listing the ones there are."""
    if code == AUTO or code in LANGUAGES:
        return code
    raise TwoTowerError(
        f"unknown BM25 language '{code}': use an ISO 639-1 code among {language_codes()}; "
        f"'multi' for mixed or other languages; or 'auto' to detect it from the documents"
    )


# ----------------------------------------------------------------------------- splitting


def _grams(chars: list[str], unigrams: bool) -> list[str]:
    bigrams = [a + b for a, b in zip(chars, chars[1:])]
    if unigrams or not bigrams:
        return chars + bigrams
    return bigrams


def split_words(text: str) -> list[str]:
    return WORD.findall(normalize(text))


def split_runs(text: str) -> list[str]:
    """``multi``: words, CJK character uni+bi-grams, grapheme bigrams for Thai-like scripts."""
    out: list[str] = []
    for m in _RUNS.finditer(normalize(text)):
        if m["cjk"]:
            out += _grams(list(m["cjk"]), unigrams=True)
        elif m["sea"]:
            out += _grams(_GRAPHEME.findall(m["sea"]), unigrams=False)
        else:
            out.append(m["word"])
    return out


SPLITTERS: dict[str, Callable[[str], list[str]]] = {
    "words": split_words, "cjk": split_runs, "graphemes": split_runs, "multi": split_runs,
}


# ----------------------------------------------------------------------------- stemming

BY_SCRIPT = "by-script"


class ScriptStemmer:
    """Stems a word with the Snowball stemmer of its first letter's script (``multi``): words in scripts that
    one language dominates get that language's; Latin gets English's, whose rules are light on the others."""

    SCRIPTS = (("Cyrillic", "russian"), ("Greek", "greek"), ("Arabic", "arabic"), ("Devanagari", "hindi"),
               ("Latin", "english"))

    def __init__(self) -> None:
        self._stemmers = [(regex.compile(rf"\p{{{script}}}"), Stemmer.Stemmer(algorithm))
                          for script, algorithm in self.SCRIPTS]

    def __call__(self, word: str) -> str:
        for pattern, stemmer in self._stemmers:
            if pattern.match(word):
                return stemmer.stemWord(word)
        return word


# ----------------------------------------------------------------------------- analyzers


@dataclass(frozen=True)
class Analyzer:
    """Splitting, stopwords and stemming for one language; :meth:`tokenizer` gives the bm25s tokenizer."""

    language: str
    split: str
    stemmer: str | None
    stopwords: tuple[str, ...]

    def tokenizer(self) -> Tokenizer:
        """A fresh bm25s tokenizer (its vocabulary grows as it tokenizes)."""
        if self.stemmer == BY_SCRIPT:
            stemmer = ScriptStemmer()
        else:
            stemmer = Stemmer.Stemmer(self.stemmer) if self.stemmer else None
        if self.split == "en":
            return Tokenizer(lower=True, splitter=EN_PATTERN, stopwords=list(self.stopwords), stemmer=stemmer)
        return Tokenizer(lower=False, splitter=SPLITTERS[self.split], stopwords=list(self.stopwords), stemmer=stemmer)

    def analyze(self, texts: Iterable[str]) -> list[list[str]]:
        """The terms of each text, in order (empty texts give ``[]``)."""
        texts = list(texts)
        tokens = self.tokenizer().tokenize(texts, update_vocab=True, return_as="string", show_progress=False,
                                           allow_empty=False)
        return [list(t) for t in tokens]


def analyzer_for(language: str, *, stopwords: str | None = None, stemmer: str | None = None) -> Analyzer:
    """The analyzer of ``language``; ``stopwords`` (a code of a bm25s list) and ``stemmer`` (a PyStemmer
    algorithm, or ``by-script``) replace the language's own when given, ``""`` meaning none."""
    lang = LANGUAGES[check_language(language)] if language != AUTO else None
    if lang is None:
        raise TwoTowerError("BM25 language 'auto' is resolved from the documents: index them first")
    stop_key = lang.stopwords if stopwords is None else stopwords
    if stop_key and stop_key not in STOPWORDS:
        raise TwoTowerError(f"no BM25 stopword list '{stop_key}': use one of {', '.join(sorted(STOPWORDS))}, "
                            "or '' for none")
    algorithm = lang.stemmer if stemmer is None else stemmer
    if algorithm and algorithm != BY_SCRIPT and algorithm not in Stemmer.algorithms():
        raise TwoTowerError(f"no Snowball stemmer '{algorithm}': use one of {', '.join(Stemmer.algorithms())}, "
                            f"{BY_SCRIPT}, or '' for none")
    return Analyzer(lang.code, lang.split, algorithm or None, STOPWORDS[stop_key] if stop_key else ())
