"""The offline extractor: patterns over a user's own sentences, no model.

Each rule reads one clause of a USER turn and proposes (subject, text, type, confidence).
Assistant turns are never read as facts about the user; acknowledgements and small talk match no
pattern (`is_small_talk`, also used by distillation), and questions only count for a statement
made in the same sentence. What these rules will not extract is listed in docs/memory.md
("Extraction").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from memory.models import MessageRole, UserMemoryType

MAX_MEMORY_CHARS = 300


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
        """Every rule, on one clause of a user turn, in the order the first said value wins."""
        yield from self._home_and_work(c)
        yield from self._family(c)
        yield from self._more(c)
        yield from self._pets(c)
        yield from self._diet(c)
        yield from self._preferences(c, UserMemoryType.PREFERENCE)
        yield from self._plans(c, UserMemoryType.PLAN)
        yield from self._facts_and_decisions(c)

    def _home_and_work(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        profile = UserMemoryType.PROFILE
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

    def _family(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        profile = UserMemoryType.PROFILE
        for found in re.finditer(r"\bmy (\w+) " + _NAME, c):
            relation = found[1].casefold()
            if relation in _PARTNERS:
                yield "partner.name", f"Partner: {found[2]}", profile, 0.85
            elif relation in _FAMILY:
                yield f"family.{relation}.name", f"{relation.capitalize()}: {found[2]}", profile, 0.85
        if m := re.search(r"\bseeing someone(?: new)?,? (?:(?:her|his|their) name is )?" + _NAME, c):
            yield "partner.name", f"Partner: {m[1]}", profile, 0.8
            yield "relationship.status", "Relationship: dating", profile, 0.75
        if re.search(r"\b(?:we're|we are|we got|I got|I'm|I am) (?:now )?engaged\b", c):
            yield "relationship.status", "Relationship: engaged", profile, 0.9
        if re.search(r"\b(?:and I|we) (?:have )?broke(?:n)? up\b", c):
            yield "relationship.status", "Relationship: single (broke up)", profile, 0.85
        if re.search(r"\b(?:we|I) got married\b", c):
            yield "relationship.status", "Relationship: married", profile, 0.9

    def _diet(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        constraint = UserMemoryType.CONSTRAINT
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

    def _facts_and_decisions(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        fact = UserMemoryType.FACT
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
        profile, pref = UserMemoryType.PROFILE, UserMemoryType.PREFERENCE
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
        yield from self._more_plans(c)

    def _more_plans(self, c: str) -> Iterable[tuple[str, str, str, float]]:
        """Plans said with "want", "changed … from … to …", "thinking of getting …", "postponed …"."""
        plan = UserMemoryType.PLAN
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
