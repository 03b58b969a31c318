"""Realistic KnowTrace exploration prompts for the generation benchmark (invented fictional world).

The template is the paper's knowledge-exploration prompt (Appendix D) with four short invented
exemplars; the questions and triplets are invented so that no benchmark data leaks into timing runs.
"""

from __future__ import annotations

INSTRUCTION = """Given a question that requires multi-step retrieval to collect necessary knowledge triplets and offer the final answer, you are an advanced knowledge reasoner and retrieval facilitator. The knowledge triplets that you collected in previous steps take the form of (subject entity; relation; object entity).

In this step, you should first carefully determine whether the collected knowledge triplets are sufficient for you to offer the final answer. Don't answer with uncertainty. Please strictly use the following judgment template:
Whether the given knowledge triplets are sufficient for answering: Yes or No

If Yes, then think and offer the final answer based on the collected knowledge triplets. Please strictly use the following inference template:
Thought: think step by step to reason out the final answer
Answer: the final answer

If No, then provide a high-quality concrete guidance for the retrieval step to collect more necessary knowledge triplets. You should first provide a set of entities that need further retrieval in the retrieval step, and then propose a detailed and concrete relation guidance for each entity to reflect which aspect of knowledge related to this entity you want to retrieve. Be sure to only provide the relation guidance for necessary knowledge. Please strictly use the following template:
Retrieval Guidance:
- Entity name 1: propose a detailed and concrete retrieval guidance for this entity
- Entity name 2: propose a detailed and concrete retrieval guidance for this entity
- ..."""

EXEMPLARS = """Question: In which city was the founder of Brindle Mills born?
Knowledge triplets collected in previous steps: None
Whether the given knowledge triplets are sufficient for answering: No
Retrieval Guidance:
- Brindle Mills: find out who founded Brindle Mills

Question: In which city was the founder of Brindle Mills born?
Knowledge triplets collected in previous steps: (Brindle Mills; founded by; Oskar Venn)
Whether the given knowledge triplets are sufficient for answering: No
Retrieval Guidance:
- Oskar Venn: find out the city where Oskar Venn was born

Question: Which river flows through the capital of Marovia?
Knowledge triplets collected in previous steps: (Marovia; capital; Teslin); (Teslin; located on; Ardel River)
Whether the given knowledge triplets are sufficient for answering: Yes
Thought: The capital of Marovia is Teslin, and Teslin is located on the Ardel River.
Answer: Ardel River

Question: Who is older, the author of The Glass Orchard or the director of Night Ferry?
Knowledge triplets collected in previous steps: None
Whether the given knowledge triplets are sufficient for answering: No
Retrieval Guidance:
- The Glass Orchard: find out who wrote The Glass Orchard
- Night Ferry: find out who directed the film Night Ferry"""

#: (question, triplets already collected) — 32 invented multi-hop questions, some with triplets.
QUESTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("Who founded the company that makes the Zephyr kettle?", ()),
    ("What is the nationality of the director of the film Silver Harbor?", ()),
    ("In which year was the university attended by Lena Markov founded?", ("(Lena Markov; educated at; Halden University)",)),
    ("Which country is the birthplace of the composer of the opera Red Lanterns?", ()),
    ("Who is the spouse of the mayor of Port Elsin?", ("(Port Elsin; mayor; Dara Quill)",)),
    ("What language is spoken in the country where Mount Keral is located?", ()),
    ("Which team did the coach of the Varna Hawks play for before coaching?", ()),
    ("When did the band that recorded Blue Meridian form?", ("(Blue Meridian; recorded by; The Tidewalkers)", "(The Tidewalkers; origin; Calder)")),
    ("Who wrote the novel that the film Ashen Road is based on?", ()),
    ("Are the founders of Orla Foods and Kestrel Motors from the same country?", ()),
    ("Which river runs through the hometown of the painter Ivo Brandt?", ("(Ivo Brandt; born in; Selm)",)),
    ("What is the capital of the country that borders both Ostria and Velland?", ()),
    ("Who was the first president of the organization that awards the Harrow Medal?", ()),
    ("In which city is the headquarters of the publisher of The Quiet Atlas?", ("(The Quiet Atlas; published by; Fenwick Press)",)),
    ("Which instrument did the teacher of the violinist Mara Solt play?", ()),
    ("Who directed the sequel to the film Copper Sky?", ()),
    ("What is the population of the town where the Aldine Bridge was built?", ()),
    ("Which school did the architect of the Meridian Tower attend?", ("(Meridian Tower; architect; Paulo Renn)", "(Paulo Renn; born in; Astra)")),
    ("Who succeeded the king who built Castle Dunmere?", ()),
    ("What sport does the brother of the athlete Kai Lorne play?", ()),
    ("In which year did the ship named after the explorer Ines Varga sink?", ()),
    ("Which company acquired the maker of the Lumen phone?", ("(Lumen phone; manufacturer; Brightwave Labs)",)),
    ("Who is the mother of the singer who performed Northern Lights Waltz?", ()),
    ("Which language did the author of Stone Psalms write in?", ()),
    ("What is the currency of the country where the Tovar Festival takes place?", ()),
    ("Who discovered the element named after the city of Belmora?", ()),
    ("When was the stadium of the football club Rosen FC opened?", ("(Rosen FC; home stadium; Kellen Park)",)),
    ("Which university employs the supervisor of the chemist Ada Firth?", ()),
    ("Who played the lead role in the film directed by Sora Minet in 1998?", ()),
    ("What is the official religion of the kingdom ruled by Queen Aveline?", ()),
    ("Which ocean does the river flowing through Port Calder drain into?", ("(Port Calder; located on; Lune River)", "(Lune River; length; 412 km)")),
    ("Who designed the flag of the republic founded by General Orsk?", ()),
]


def exploration_prompt(question: str, triplets: tuple[str, ...]) -> str:
    collected = "; ".join(triplets) if triplets else "None"
    return (
        f"{INSTRUCTION}\n\n{EXEMPLARS}\n\n"
        f"Question: {question}\nKnowledge triplets collected in previous steps: {collected}\n"
    )


def exploration_prompts() -> list[str]:
    return [exploration_prompt(q, t) for q, t in QUESTIONS]
