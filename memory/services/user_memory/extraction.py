"""Extracting memories about a user from the turns of their sessions.

An append that holds a user turn queues one `user_memory.extract` job for its session
(`extraction_queue`, a job record in the append's transaction, coalesced per session: a burst of
appends queues one run). The run (`session_memories_extract`) reads the turns after the session's
watermark, at most BATCH_TURNS of them, extracts candidate memories and records each one through
`memory_record`, the one write path, at the time the turn was said: a newer value of a subject
supersedes the older one, a repeat only adds its source, and a statement older than the current
value is dropped (Conflict). The watermark advances in the same transaction, so a retried run
never records a turn twice.

Two extractors, one contract (a list of `Candidate`):
- offline (default, no model): patterns over the USER's own sentences (`offline_candidates`).
  Assistant turns are never read as facts about the user; acknowledgements and small talk match
  no pattern, and questions only count for a statement made in the same sentence.
- the configured chat endpoint (CTXAPP_SUMMARISER_*, when its URL is set): ONE call per
  batch of turns, never per turn. The reply must be a JSON object of memories whose subjects,
  types, turn numbers and texts pass `parse_model_output`; a malformed reply is shown back to the
  model once per retry, and a batch the endpoint cannot answer is extracted offline instead.

What the offline rules will not extract is listed in docs/memory.md ("Extraction").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from memory.exceptions import Conflict
from memory.models import (
    Message,
    MessageRole,
    Session,
    Tenant,
    UserMemoryExtraction,
    UserMemoryOrigin,
    UserMemoryType,
)
from memory.services import jobs
from memory.services.chat_endpoint import chat_parsed
from memory.services.user_memory.store import memories_of, memory_record

EXTRACT_JOB = jobs.USER_MEMORY_EXTRACT
BATCH_TURNS = 200  # turns read per run; a longer backlog queues the next run
MAX_MEMORY_CHARS = 300
_SUBJECT = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+){0,3}$")


@dataclass(frozen=True)
class Turn:
    seq: int
    role: str  # "user" | "assistant" (other roles are not read)
    text: str
    at: datetime | None = None


@dataclass(frozen=True)
class Candidate:
    subject: str
    text: str
    memory_type: str
    seq: int
    confidence: float


# --- the offline extractor ---------------------------------------------------------------------

_NAME = r"([A-Z][\w'\u2019-]+(?: (?:[A-Z][\w'\u2019-]+|La|de|del|von|van))*)"
_ORG = r"((?:the )?[A-Z][\w&'\u2019.-]*(?: (?:[A-Z][\w&'\u2019.-]*|of|de|la|La))*)"
_MONTHS = {
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december", "monday", "tuesday", "wednesday", "thursday", "friday",
    "saturday", "sunday", "christmas", "easter",
}  # fmt: skip
_DIETS = "vegetarian|vegan|pescatarian|keto|paleo|flexitarian|carnivore"
_SPECIES = {
    "dog": "dog", "puppy": "dog", "mutt": "dog", "cat": "cat", "kitten": "cat", "rabbit": "rabbit",
    "bunny": "rabbit", "parrot": "parrot", "hamster": "hamster", "tortoise": "tortoise",
    "turtle": "turtle", "horse": "horse", "greyhound": "dog", "budgie": "bird", "tabby": "cat",
    "elkhound": "dog", "terrier": "dog", "labrador": "dog",
}  # fmt: skip
_PARTNERS = {"partner", "girlfriend", "boyfriend", "fiance", "fiancé", "fiancee", "fiancée"}
_FAMILY = {
    "sister", "brother", "mother", "father", "mum", "mom", "dad", "daughter", "son", "wife",
    "husband", "grandmother", "grandfather", "aunt", "uncle", "cousin", "niece", "nephew",
}  # fmt: skip
_PLAN_TOPICS = {
    "trip": "trip", "holiday": "trip", "vacation": "trip", "journey": "trip", "course": "course",
    "class": "course", "classes": "course", "lessons": "course", "marathon": "race",
    "race": "race", "triathlon": "race", "wedding": "wedding", "promotion": "promotion",
    "renovation": "renovation", "renovate": "renovation", "move": "move", "moving": "move",
    "degree": "study", "exam": "exam", "restaurant": "business", "business": "business",
    "truck": "business", "shop": "business", "cafe": "business", "bakery": "business",
    "cabin": "home_project", "kitchen": "home_project", "house": "home_project",
    "pet": "pet", "cat": "pet", "dog": "pet", "puppy": "pet", "kitten": "pet",
}  # fmt: skip
_BUSINESS = re.compile(r"\b(food truck|restaurant|caf[eé]|shop|bakery|bar|studio|business)\b")
# Words a sentence of small talk is made of: a sentence of only these is never a memory.
_SMALL_TALK = re.compile(
    r"^(?:(?:hi|hello|hey|hola|hei|thanks?|thank you|cheers|ok(?:ay)?|cool|great|good|perfect|"
    r"sure|yes|yeah|no|nope|got it|will do|sounds good|good (?:idea|point|plan)|ha|haha|lol|"
    r"nice|awesome|bye|goodbye|morning|merry christmas|happy new year|anything else|"
    r"that's all|that's it|that's helpful|you're welcome|maybe|sad update|big news|"
    r"quick one|no,? that's all)[\s,.!?]*)+$",
    re.IGNORECASE,
)
_QUESTION_OPENERS = re.compile(
    r"^(?:can|could|would|will|should|do|does|did|is|are|what|which|how|why|when|where|who|any)\b",
    re.IGNORECASE,
)


def is_small_talk(text: str) -> bool:
    """An acknowledgement, a greeting or a closing ("Thanks. Anything else before we close?")."""
    cleaned = re.sub(r"\b(?:so|then|just|really|very|much|for now|before we close|for today)\b", "", text)
    return bool(_SMALL_TALK.match(cleaned.strip())) or not re.search(r"[A-Za-z]{3}", text)


def _clauses(text: str) -> list[str]:
    """The turn's sentences, then each sentence's clauses that are not questions to the assistant."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+|\s*;\s*|\s+-{1,2}\s+", text):
        sentence = sentence.strip()
        if not sentence or is_small_talk(sentence):
            continue
        parts = [p.strip() for p in re.split(r",\s+(?:and |but |so |by the way,?\s*)?", sentence)]
        kept = [p for p in parts if p and not _QUESTION_OPENERS.match(p)]
        if kept:
            out.append(", ".join(kept).rstrip(".!?"))
    return out


def _clean_value(value: str) -> str:
    value = re.split(r"\s+(?:and|but|so|because) (?:I|we)\b", value)[0]
    value = re.sub(r"\s+", " ", value).strip(" ,.!?;:")
    return value[:MAX_MEMORY_CHARS]


def _is_place(name: str) -> bool:
    return bool(name) and name.split()[0].casefold() not in _MONTHS


def _first_person(clause: str) -> bool:
    """Whether the clause is said of the user (I, we, my, our), not of someone else."""
    return bool(re.search(r"\b(?:I|I'm|I've|I'll|I'd|we|we're|we've|we'll|my|our)\b", clause, re.I))


def _topic(words: str) -> str:
    for word in re.findall(r"[a-z]+", words.casefold()):
        if word in _PLAN_TOPICS:
            return _PLAN_TOPICS[word]
    return ""


def _slug(words: str, limit: int = 2) -> str:
    stop = {"a", "an", "the", "my", "our", "to", "of", "for", "in", "on", "with", "and", "some", "more"}
    kept = [w for w in re.findall(r"[a-z0-9]+", words.casefold()) if w not in stop][:limit]
    return "_".join(kept)


def _third_person(verb: str) -> str:
    verb = verb.casefold()
    irregular = {"can't stand": "can't stand", "prefer": "prefers", "love": "loves", "like": "likes"}
    if verb in irregular or verb.endswith("s"):
        return irregular.get(verb, verb)
    return verb[:-1] + "ies" if re.search(r"[^aeiou]y$", verb) else verb + "s"


class _Rules:
    """The patterns, applied to one user turn. Each rule returns (subject, text, type, confidence)."""

    def __init__(self, current: dict[str, str]) -> None:
        self.current = current  # subject → the current text (for "… instead" and "changed my mind")
        self.offer = ""  # a role the user was offered, until they say whether they take it

    def turn(self, text: str) -> list[tuple[str, str, str, float]]:
        found: dict[str, tuple[str, str, str, float]] = {}
        if self.offer and re.match(
            r"^(?:yes|yeah|yep)\b|.*\bI(?:'ll| will) take it\b|.*\bI accepted\b", text, re.I
        ):
            found["work.role"] = ("work.role", f"Works as {self.offer}", UserMemoryType.PROFILE, 0.7)
            self.offer = ""
        if m := re.search(
            r"\b(?:I've|I have|I was|I got) (?:been )?offered (the|an?) ([\w -]+?) (?:job|role|position)\b",
            text,
        ):
            self.offer = f"{'a' if m[1] == 'the' else m[1]} {m[2]}".replace("a a", "an a")
        for clause in _clauses(text):
            for item in self.clause(clause):
                found.setdefault(item[0], item)  # one value per subject per turn: the first said
        return list(found.values())

    def clause(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        profile, pref, plan = UserMemoryType.PROFILE, UserMemoryType.PREFERENCE, UserMemoryType.PLAN
        constraint, fact = UserMemoryType.CONSTRAINT, UserMemoryType.FACT
        # --- home
        if (
            m := re.search(
                r"\b(?:[Ww]e|I)(?:'ve| have)? (?:just |finally |now |all )?(?:moved|relocated) to " + _NAME, c
            )
        ) and _is_place(m[1]):
            yield "home.city", f"Lives in {m[1]}", profile, 0.9
        if (m := re.search(r"\b(?:[Ww]e|I) (?:now )?live (?:now )?in " + _NAME, c)) and _is_place(m[1]):
            yield "home.city", f"Lives in {m[1]}", profile, 0.9
        # --- work: "I'm a product designer at Lumen Studio (in London)"
        role_at = r"\bI(?:'m| am) (?:now )?an? ([a-z][a-z -]+?) (?:at|for) " + _ORG
        if m := re.search(role_at, c):
            yield "work.role", f"Works as a {m[1]}", profile, 0.85
            yield "work.employer", f"Works at {m[2]}", profile, 0.85
            if (home := re.search(r" at [^,]+? in " + _NAME + r"[\s.!]*$", c)) and _is_place(home[1]):
                yield "home.city", f"Lives in {home[1]}", profile, 0.7
        elif m := re.search(r"\bI(?:'m| am) now an? ([a-z][a-z -]+)", c):
            role = m[1].strip()
            yield "work.role", f"Works as a {role}", profile, 0.8
            if re.search(r"\b(?:freelance|self-employed|independent)\b", role):
                yield "work.employer", "Self-employed (freelance)", profile, 0.75
        if m := re.search(r"\bI work (?:at|for) " + _ORG, c):
            yield "work.employer", f"Works at {m[1]}", profile, 0.85
        if (
            (
                m := re.search(
                    r"\bI (?:start|started|begin|began|joined|am joining|'m joining) (?:at )?" + _ORG, c
                )
            )
            and _is_place(m[1])
            and m[1].casefold() not in {"i", "the"}
        ):
            yield "work.employer", f"Works at {m[1]}", profile, 0.8
            if role := re.search(r"\bas an? ([a-z][a-z -]+)", c):
                yield "work.role", f"Works as a {role[1].strip()}", profile, 0.8
        if m := re.search(r"\boffer from " + _ORG + r".*\b(?:accepted|taken|took|signed)\b", c):
            yield "work.employer", f"Works at {m[1].split(' in ')[0]}", profile, 0.8
        if m := re.search(r"\bI'll be an? ([a-z][a-z -]+?) there\b", c):
            yield "work.role", f"Works as a {m[1]}", profile, 0.75
        # --- family and partner
        for m in re.finditer(r"\bmy (\w+) " + _NAME, c):
            relation = m[1].casefold()
            if relation in _PARTNERS:
                yield "partner.name", f"Partner: {m[2]}", profile, 0.85
            elif relation in _FAMILY:
                yield f"family.{relation}.name", f"{relation.capitalize()}: {m[2]}", profile, 0.85
        if m := re.search(r"\bseeing someone(?: new)?,? (?:(?:her|his|their) name is )?" + _NAME, c):
            yield "partner.name", f"Partner: {m[1]}", profile, 0.8
            yield "relationship.status", "Relationship: dating", profile, 0.75
        if re.search(r"\b(?:we're|we are|we got|I got|I'm|I am) (?:now )?engaged\b", c):
            yield "relationship.status", "Relationship: engaged", profile, 0.9
        if re.search(r"\b(?:and I|we) (?:have )?broke(?:n)? up\b", c):
            yield "relationship.status", "Relationship: single (broke up)", profile, 0.85
        if re.search(r"\b(?:we|I) got married\b", c):
            yield "relationship.status", "Relationship: married", profile, 0.9
        yield from self._more(c)
        # --- pets
        yield from self._pets(c)
        # --- diet and constraints
        if m := re.search(
            r"\b(?:I'm|I am|we're|we are|I've|we've)(?: \w+)?(?: now)? (?:going |gone |been )?("
            + _DIETS
            + r")\b",
            c,
            re.I,
        ):
            yield "diet", f"Diet: {m[1].casefold()}", constraint, 0.85
        elif m := re.search(r"\bon an? (" + _DIETS + r") diet\b", c, re.I):
            yield "diet", f"Diet: {m[1].casefold()}", constraint, 0.8
        if re.search(r"\bI (?:stopped|quit|gave up|dropped) (?:" + _DIETS + r")\b", c, re.I) or re.search(
            r"\beating normally\b", c
        ):
            yield "diet", "Diet: no special diet", constraint, 0.75
        if m := re.search(r"\ballergic to ([a-z][a-z ,-]*?)(?:,|$| so\b| and\b)", c + ","):
            yield "constraint.allergy", f"Allergic to {m[1].strip()}", constraint, 0.9
        if m := re.search(r"\b(lactose|gluten) intolerant\b", c, re.I):
            yield "constraint.diet", f"{m[1].capitalize()} intolerant", constraint, 0.9
        if (
            m := re.search(r"\b(?:fully |strictly |completely )?(dairy|gluten|lactose|nut)-free\b", c, re.I)
        ) and _first_person(c):
            yield "constraint.diet", f"{m[1].capitalize()}-free", constraint, 0.8
        if m := re.search(r"\bI (?:only )?eat (halal|kosher)\b", c, re.I):
            yield "constraint.diet", m[1].capitalize(), constraint, 0.9
        # --- preferences
        yield from self._preferences(c, pref)
        # --- plans
        yield from self._plans(c, plan)
        # --- facts
        if re.search(r"\bI (?:also )?sold (?:my|the|our) car\b", c):
            yield "fact.car", "Sold the car", fact, 0.8
        if m := re.search(r"\bI (cycle|walk|bike|drive|run) everywhere\b", c):
            yield "fact.transport", f"{_third_person(m[1]).capitalize()} everywhere", fact, 0.8
        # --- decisions the user takes (an assistant's suggestion counts only once accepted)
        if m := re.search(r"\b(?:let's|we'll|I'll|I will|we will) go with ([^,.!?]+)", c, re.I):
            yield (
                f"decision.{_slug(m[1]) or 'choice'}",
                f"Decided: {_clean_value(m[1])}",
                UserMemoryType.DECISION,
                0.7,
            )

    def _more(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        """Ways of saying where one lives and works, diets and preferences beyond the first set."""
        profile, pref, plan = UserMemoryType.PROFILE, UserMemoryType.PREFERENCE, UserMemoryType.PLAN
        if (
            m := re.search(r"\b(?:[Ww]e|I)(?:'ve| have)? (?:settled|been living) in " + _NAME, c)
        ) and _is_place(m[1]):
            yield "home.city", f"Lives in {m[1]}", profile, 0.8
        teach = re.search(r"\bI teach ([a-z]+(?: and [a-z]+)?) (?:at " + _ORG + r"|there)", c)
        if teach:
            yield "work.role", f"Works as a {teach[1]} teacher", profile, 0.8
            if teach[2]:
                yield "work.employer", f"Works at {teach[2]}", profile, 0.8
                if (home := re.search(r" at [^,]+? in " + _NAME + r"[\s.!]*$", c)) and _is_place(home[1]):
                    yield "home.city", f"Lives in {home[1]}", profile, 0.7
        if m := re.search(r"^(?:And |So )?" + _ORG + r" (?:took me|hired me|took me on)\b", c):
            yield "work.employer", f"Works at {m[1]}", profile, 0.75
        named = re.search(r"\bI(?:'m| am), an? ([A-Za-z][\w -]+?) (?:at|for) " + _ORG, c)
        accepted = re.search(r"\bI (?:accepted|took|got) an? ([A-Za-z][\w -]+?) (?:at|with) " + _ORG, c)
        for m in (named, accepted):
            if m:
                yield "work.role", f"Works as a {m[1]}", profile, 0.8
                yield "work.employer", f"Works at {m[2].split(' in ')[0]}", profile, 0.8
        if (m := re.search(r"\bI'm calling it " + _NAME, c)) and (
            business := _BUSINESS.search(self.current.get("plan.business", ""))
        ):
            yield "work.employer", f"Runs {m[1]}, a {business[1]}", profile, 0.7
            yield "work.role", f"Owner of a {business[1]}", profile, 0.7
        if re.search(r"\bI(?:'m| am) (?:a )?(?:coeliac|celiac)\b", c):
            yield "constraint.diet", "Gluten-free (coeliac)", UserMemoryType.CONSTRAINT, 0.85
        if m := re.search(r"\b(" + _DIETS + r") (?:recipes|meals|food) please\b", c, re.I):
            yield "diet", f"Diet: {m[1].casefold()}", UserMemoryType.CONSTRAINT, 0.7
        if m := re.search(r"\b(?:please )?use (metric|imperial) units\b", c, re.I):
            yield "preference.units", f"Wants {m[1].casefold()} units", pref, 0.85
        if m := re.search(r"\bI (study|work|sleep|think|write) best ([^,.!?]+)", c):
            yield f"preference.{m[1]}_time", f"{_third_person(m[1]).capitalize()} best {m[2]}", pref, 0.8
        if m := re.search(r"(?:^|(?<=, )|\b(?:and|also|really) )I like ([^,.!?]+)", c):
            what = _clean_value(m[1])
            if not re.match(r"(?:it|that|this|you|the idea|to)\b", what):
                yield f"preference.{_slug(what, 1)}", f"Likes {what}", pref, 0.75
        if m := re.search(r"\bI(?:'m| am) switching from (?:an? )?([\w-]+) to (?:an? )?([\w -]+)", c):
            yield f"preference.{_slug(m[1], 1)}", f"Switched from {m[1]} to {_clean_value(m[2])}", pref, 0.75
        if m := re.search(r"\bI drive an? ([^,.!?]+?)(?: and\b|$)", c):
            yield "fact.car", f"Drives a {_clean_value(m[1])}", UserMemoryType.FACT, 0.8
        car = self.current.get("fact.car", "")
        if (m := re.search(r"\bI (?:also )?sold (?:my|the|our) (\w+)", c)) and m[
            1
        ].casefold() in car.casefold():
            yield "fact.car", "Sold the car", UserMemoryType.FACT, 0.75
        # plans said with "want", "changed … from … to …", "thinking of getting …", "postponed …"
        if m := re.search(
            r"\b(?:is|are|was|were|got|been) (postponed|delayed|pushed back) (?:to|until) ([^,.!?]+)", c
        ):
            words = set(re.findall(r"[a-z]+", c.split(m[0])[0].casefold())) - {"the", "so", "and", "work"}
            subject = next(
                (
                    s
                    for s, t in self.current.items()
                    if s.startswith("plan.") and words & set(re.findall(r"[a-z]+", t.casefold()))
                ),
                "",
            )
            if subject:
                yield subject, f"Plan: {m[1]} to {_clean_value(m[2])}", plan, 0.7
        if not (_first_person(c) or re.search(r"\band I (?:are|am)\b", c)):
            return
        if (m := re.search(r"\b(?:we|I) want (?:to )?([^,.!?]+)", c, re.I)) and (topic := _topic(m[1])):
            yield f"plan.{topic}", f"Plan: {_clean_value(c)}", plan, 0.7
        if (m := re.search(r"\bchanged (?:the |our |my )?([\w ]+?) from (\w+) to (\w+)", c)) and (
            topic := _topic(m[1])
        ):
            yield f"plan.{topic}", f"Plan: {m[1]} to {m[3]}", plan, 0.75
        if (m := re.search(r"\bthinking of (getting|buying|adopting) ([^,.!?]+)", c)) and (
            topic := _topic(m[2])
        ):
            yield f"plan.{topic}", f"Plan: {m[1]} {_clean_value(m[2])}", plan, 0.65
        if m := re.search(r"\b(?:are|am|'re) moving to " + _NAME, c):
            yield "plan.move", f"Plan: moving to {m[1]}", plan, 0.75

    def _pets(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        species_re = "|".join(sorted(_SPECIES, key=len, reverse=True))
        m = (
            re.search(
                r"\b(?:adopted|got|have|bought|rescued|brought home)\b.*?\b(second |another )?(?:[\w-]+ )*?("
                + species_re
                + r")\b(?:[^.]*?\b(?:called|named)\s+|,\s*(?:(?:her|his|its) name is\s+)?)"
                + _NAME,
                c,
            )
            or re.search(r"\bmy (second |new )?(" + species_re + r")\s+" + _NAME, c)
            or re.search(r"\b()(" + species_re + r") (?:called|named) " + _NAME, c)
        )
        if m is None:
            return
        species, name = _SPECIES[m[2].casefold()], m[3]
        if name.casefold() in {"a", "an", "the", "i", "we", "she", "he", "it"}:
            return
        second = re.search(r"\b(?:second|another)\b", c[: m.start(2)])
        slot = f"pet.{species}.2.name" if second else f"pet.{species}.name"
        yield slot, f"Has a {species} called {name}", UserMemoryType.PROFILE, 0.85

    def _preferences(self, c: str, kind: str) -> Iterable[tuple[str, str, str, float]]:
        if m := re.search(r"\b(?:please )?(?:keep|make) (?:your )?answers ([^.!?]+)", c, re.I):
            yield "preference.answer_style", f"Wants answers {_clean_value(m[1])}", kind, 0.85
        if m := re.search(
            r"\b(?:please )?answer(?:s)? in (English|Spanish|French|German|Italian|Portuguese|Norwegian)\b",
            c,
            re.I,
        ):
            yield "preference.language", f"Wants answers in {m[1]}", kind, 0.85
        if m := re.search(r"\bno (emojis?|jargon|bullet points)\b(?: in (?:your )?answers)?", c, re.I):
            yield "preference.answer_style", f"No {m[1]} in answers", kind, 0.8
        if m := re.search(r"\bI (hate|dislike|can't stand|love|adore|enjoy|prefer) ([^,.!?]+)", c, re.I):
            verb, what = m[1].casefold(), _clean_value(m[2])
            if not re.match(r"(?:it|that|this|you|the idea)\b", what):
                yield f"preference.{_slug(what, 1)}", f"{_third_person(verb).capitalize()} {what}", kind, 0.8
        if m := re.search(r"\bI drink ([a-z]+)(?:,? (?:never|not|but not|no) ([a-z]+))?", c):
            text = f"Drinks {m[1]}" + (f", never {m[2]}" if m[2] else "")
            yield "preference.drink", text, kind, 0.8
        if m := re.search(r"\bI use ([^,.!?]+?) everywhere\b", c):
            yield f"preference.{_slug(m[1], 1)}", f"Uses {m[1]} everywhere", kind, 0.8
        if re.search(r"\bmy (?:new )?favou?rite\b", c) and (
            m := re.search(r"\bI (?:started|took up|do) (\w+ing)\b", c)
        ):
            yield f"preference.{m[1].casefold()}", f"Loves {m[1].casefold()}", kind, 0.75

    def _plans(self, c: str, kind: str) -> Iterable[tuple[str, str, str, float]]:
        if not _first_person(c) and not re.search(r"\band I (?:are|am)\b", c):
            return
        if (
            m := re.search(r"\b(?:cancelled|canceled|called off|scrapped) (?:the |our |my )?([^,.!?]*)", c)
        ) and (topic := _topic(m[1])):
            yield f"plan.{topic}", f"Cancelled: {_clean_value(m[1])}", kind, 0.85
            return
        if (m := re.search(r"\bno (\w+) this year\b", c)) and (topic := _topic(m[1])):
            yield f"plan.{topic}", f"Cancelled: {m[1]} this year", kind, 0.75
            return
        if m := re.search(
            r"\bchanged my mind about (\w+)[^,]*?,? I'm (?:doing|taking|going with) (\w+)", c, re.I
        ):
            old, new = m[1], m[2]
            subject = next(
                (
                    s
                    for s, t in self.current.items()
                    if s.startswith("plan.") and old.casefold() in t.casefold()
                ),
                "",
            )
            if subject:
                yield subject, f"Plan: {new} instead", kind, 0.75
                return
        if (m := re.search(r"\b(?:planning|plan|training for|signed up for) (?:to )?([^,.!?]+)", c)) and (
            topic := _topic(m[1])
        ):
            yield f"plan.{topic}", f"Plan: {_clean_value(m[1])}", kind, 0.8
            return
        if (m := re.search(r"\b(?:I'm|I am|we're|we are) going to ([^,.!?]+)", c)) and (
            topic := _topic(m[1])
        ):
            yield f"plan.{topic}", f"Plan: {_clean_value(m[1])}", kind, 0.75
            return
        if m := re.search(r"\b(?:are|am|'re) moving in together(?: in ([A-Z]\w+))?", c):
            when = f" in {m[1]}" if m[1] else ""
            who = re.match(r"^(?:\w+ )?([A-Z]\w+) and I\b", c)
            yield (
                "plan.living",
                f"Plan: moving in{' with ' + who[1] if who else ' together'}{when}",
                kind,
                0.8,
            )


def offline_candidates(turns: list[Turn], *, current: dict[str, str] | None = None) -> list[Candidate]:
    """Candidate memories from a batch of turns, without a model (see the module doc)."""
    known = dict(current or {})
    rules = _Rules(known)
    out: list[Candidate] = []
    for turn in turns:
        if turn.role != MessageRole.USER or is_small_talk(turn.text):
            continue
        for subject, text, memory_type, confidence in rules.turn(turn.text):
            out.append(Candidate(subject, _clean_value(text), memory_type, turn.seq, confidence))
            known[subject] = text
    return out


# --- the model extractor -----------------------------------------------------------------------

_PROMPT = """You extract durable memories about the USER from a conversation between a user and an assistant.
Return ONLY a JSON object:
{"memories": [{"subject": ..., "type": ..., "text": ..., "turn": ..., "confidence": ...}]}.
- subject: a dotted lowercase key naming what the memory is about, so that a later value replaces an
  earlier one: home.city, work.employer, work.role, family.sister.name, partner.name,
  relationship.status, pet.dog.name, diet, constraint.allergy, preference.<topic>, plan.<topic>,
  decision.<topic>, fact.<topic>. Reuse a subject from "Known" when the value changed.
- type: one of profile, preference, decision, constraint, plan, fact.
- text: one short sentence about the user, with the value (e.g. "Lives in Denver").
- turn: the number of the USER turn that says it.
- confidence: 0 to 1.
Only what the user says about themself, or an assistant suggestion the user explicitly accepts.
Never small talk, thanks, acknowledgements, greetings or questions. No memory: {"memories": []}."""


def parse_model_output(reply: str, *, user_seqs: set[int]) -> list[Candidate]:
    """The model's reply as candidates. Raises ValueError naming the first thing wrong."""
    text = reply.strip()
    if text.startswith("```"):
        text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("memories"), list):
        raise ValueError('expected an object with a "memories" list')
    out = []
    for index, item in enumerate(data["memories"]):
        if not isinstance(item, dict):
            raise ValueError(f"memories[{index}] is not an object")
        subject = str(item.get("subject") or "").strip().casefold()
        memory_type = str(item.get("type") or "").strip().casefold()
        body = " ".join(str(item.get("text") or "").split())
        turn, confidence = item.get("turn"), item.get("confidence", 0.7)
        if not _SUBJECT.match(subject):
            raise ValueError(f"memories[{index}].subject {subject!r} is not a dotted lowercase key")
        if memory_type not in UserMemoryType.values:
            raise ValueError(f"memories[{index}].type must be one of {', '.join(UserMemoryType.values)}")
        if not body or len(body) > MAX_MEMORY_CHARS:
            raise ValueError(f"memories[{index}].text must be 1 to {MAX_MEMORY_CHARS} characters")
        if not isinstance(turn, int) or isinstance(turn, bool) or turn not in user_seqs:
            raise ValueError(f"memories[{index}].turn must be the number of a user turn")
        if (
            not isinstance(confidence, int | float)
            or isinstance(confidence, bool)
            or not 0 <= confidence <= 1
        ):
            raise ValueError(f"memories[{index}].confidence must be a number from 0 to 1")
        if is_small_talk(body):
            continue
        out.append(Candidate(subject, body, memory_type, turn, float(confidence)))
    return out


def model_candidates(
    turns: list[Turn], *, current: dict[str, str]
) -> tuple[list[Candidate] | None, list[str]]:
    """One chat call for the whole batch: (candidates, errors); None when no reply was usable."""
    user_seqs = {t.seq for t in turns if t.role == MessageRole.USER}
    known = "\n".join(f"- {s}: {t}" for s, t in sorted(current.items())) or "(none)"
    lines = "\n".join(
        f"[{t.seq} {t.role}] {t.text}" for t in turns if t.role in (MessageRole.USER, MessageRole.ASSISTANT)
    )
    chat = [
        {"role": "system", "content": _PROMPT},
        {"role": "user", "content": f"Known:\n{known}\n\nConversation:\n{lines}"},
    ]
    return chat_parsed(chat, lambda reply: parse_model_output(reply, user_seqs=user_seqs))


def model_configured() -> bool:
    return bool(settings.CTXAPP.summariser_url)


# --- the job ---------------------------------------------------------------------------------


def extraction_queue(*, tenant: Tenant, session: Session) -> None:
    """Queue extraction of `session`'s new turns, in the caller's transaction (coalesced per
    session: while one is queued and not taken, this writes nothing). A session without a user
    has nobody to remember things about: nothing is queued."""
    if not session.user_id:
        return
    jobs.job_enqueue(
        tenant=tenant, kind=EXTRACT_JOB, key=f"session:{session.pk}", payload={"session": session.pk}
    )


@dataclass(frozen=True)
class ExtractionResult:
    turns: int
    covers_up_to_seq: int
    method: str  # "offline" | "model" | "model_fallback" | "none"
    recorded: dict[str, int]
    errors: list[str]
    more: bool


def session_memories_extract(*, session: Session, batch: int = BATCH_TURNS) -> ExtractionResult:
    """Extract and record the memories of the session's turns after its watermark (one batch).

    Runs inside the caller's transaction (the job runner's): the memories and the watermark are
    written together or not at all. Queues the next batch when more turns are waiting.
    """
    tenant = session.tenant
    with transaction.atomic():
        state, _ = UserMemoryExtraction.objects.select_for_update().get_or_create(
            session=session, defaults={"tenant": tenant}
        )
        rows = list(
            Message.objects.filter(session=session, seq__gt=state.covers_up_to_seq)
            .order_by("seq")
            .values_list("seq", "role", "content", "occurred_at")[: batch + 1]
        )
        more = len(rows) > batch
        rows = rows[:batch]
        if not rows:
            return ExtractionResult(0, state.covers_up_to_seq, "none", {}, [], False)
        turns = [Turn(seq, role, content, at) for seq, role, content, at in rows]
        at_of = {t.seq: t.at for t in turns}
        current = {m.subject: m.text for m in memories_of(tenant=tenant, user_id=session.user_id)}
        method, errors = "offline", list[str]()
        candidates: list[Candidate] | None = None
        if model_configured() and any(t.role == MessageRole.USER for t in turns):
            candidates, errors = model_candidates(turns, current=current)
            method = "model" if candidates is not None else "model_fallback"
        if candidates is None:
            candidates = offline_candidates(turns, current=current)
        origin = UserMemoryOrigin.MODEL if method == "model" else UserMemoryOrigin.EXTRACTED
        recorded: dict[str, int] = {}
        for candidate in candidates:
            try:
                outcome = memory_record(
                    tenant=tenant,
                    user_id=session.user_id,
                    subject=candidate.subject,
                    text=candidate.text,
                    memory_type=candidate.memory_type,
                    sources=[{"session": session.public_id, "seq": candidate.seq}],
                    confidence=candidate.confidence,
                    origin=origin,
                    agent=session.agent.external_id,
                    at=at_of.get(candidate.seq),
                ).outcome
            except Conflict:
                outcome = "older"  # a newer value of the subject is already current
            recorded[outcome] = recorded.get(outcome, 0) + 1
        state.covers_up_to_seq = turns[-1].seq
        state.method = method
        state.save(update_fields=["covers_up_to_seq", "method", "updated_at"])
        if more:
            extraction_queue(tenant=tenant, session=session)
    return ExtractionResult(len(turns), state.covers_up_to_seq, method, recorded, errors, more)


def extraction_payload(result: ExtractionResult) -> dict[str, Any]:
    return {
        "turns": result.turns,
        "covers_up_to_seq": result.covers_up_to_seq,
        "method": result.method,
        "recorded": result.recorded,
        "more": result.more,
        **({"errors": result.errors[:3]} if result.errors else {}),
    }
