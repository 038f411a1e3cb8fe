"""The prompt set `pdserve predictor record` runs: templates x topics, written for pdserve.

The remaining output length has to depend on the request for a length predictor to have
anything to learn, so the templates range from one-word answers to multi-paragraph essays
and numbered lists of a stated size. Each template carries a `kind` (the length it asks
for) so results can be broken down by it. The text is pdserve's own; nothing is
downloaded. `prompt_set()` is deterministic: the same (template, topic) pairs in the same
order for a given seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    name: str
    kind: str  # "short", "medium" or "long": the answer length the request asks for
    text: str  # with {topic}


@dataclass(frozen=True, slots=True)
class Prompt:
    index: int
    template: str
    kind: str
    topic: str
    text: str


TEMPLATES: tuple[PromptTemplate, ...] = (
    PromptTemplate("one-word", "short", "Answer in one word only: what is the single most "
                   "important idea behind {topic}?"),
    PromptTemplate("yes-no", "short", "Reply with just yes or no: is {topic} something a "
                   "ten-year-old could understand?"),
    PromptTemplate("one-sentence", "short", "In exactly one short sentence, what is {topic}?"),
    PromptTemplate("name-three", "short", "Name three words related to {topic}, separated by "
                   "commas, and nothing else."),
    PromptTemplate("define", "medium", "Define {topic} in two or three sentences."),
    PromptTemplate("list-5", "medium", "List 5 facts about {topic}, one per line, numbered."),
    PromptTemplate("pros-cons", "medium", "Give two advantages and two disadvantages of "
                   "{topic} as a short bulleted list."),
    PromptTemplate("explain-child", "medium", "Explain {topic} to a child in one short "
                   "paragraph."),
    PromptTemplate("list-15", "long", "List 15 interesting facts about {topic}. Number them "
                   "and write a full sentence for each."),
    PromptTemplate("essay", "long", "Write a detailed multi-paragraph essay about {topic}, "
                   "with an introduction, at least four body paragraphs and a conclusion."),
    PromptTemplate("step-by-step", "long", "Explain step by step, in great detail, how "
                   "{topic} works. Cover the history, the main ideas, examples and common "
                   "mistakes."),
    PromptTemplate("story", "long", "Write a long story, several paragraphs, in which a "
                   "young student discovers {topic} for the first time."),
)

TOPICS: tuple[str, ...] = (
    "photosynthesis", "the water cycle", "volcanoes", "black holes", "the printing press",
    "the Roman Empire", "machine learning", "compound interest", "the human heart",
    "plate tectonics", "vaccines", "the internet", "solar panels", "honey bees",
    "the French Revolution", "prime numbers", "climate change", "electric cars",
    "the moon landing", "chess", "coffee", "the immune system", "rainbows", "bicycles",
    "recycling", "the Great Wall of China", "gravity", "music theory", "dinosaurs",
    "democracy", "sourdough bread", "earthquakes", "the stock market", "sleep",
    "the Olympic Games", "ocean tides", "batteries", "friendship", "public libraries",
    "the periodic table",
)


def prompt_set(count: int | None = None, seed: int = 0) -> list[Prompt]:
    """Every (template, topic) pair (480), shuffled by `seed`; the first `count` if given.
    A prefix of the shuffle keeps the kinds mixed."""
    pairs = [(template, topic) for template in TEMPLATES for topic in TOPICS]
    random.Random(seed).shuffle(pairs)
    if count is not None:
        if count < 1:
            raise ValueError(f"prompt count must be at least 1, got {count}")
        pairs = pairs[:count]
    return [Prompt(i, template.name, template.kind, topic, template.text.format(topic=topic))
            for i, (template, topic) in enumerate(pairs)]
