"""Option scoring (the OptionScorer capability): next-token log-probabilities of option letters after a prompt."""

from __future__ import annotations

import math
import types

import pytest
import torch

from knowtrace_train.generation import GenerationError, GenerationRequest, GeneratorClosedError, GeneratorConfig, OptionScorer
from knowtrace_train.generation.hf import TransformersGenerator
from knowtrace_train.generation.prepare import combine_option_logprobs, option_token_ids

from test_generation_close import FakeLLM, fake_vllm  # noqa: F401  (the vllm stand-in fixture)

HEAD = ("Pick the triple that helps most to answer the question. Reply with the option's letter only.\n"
        "Question: Who founded Brindle Mills, and where was that person born?\n")
PROMPTS = [HEAD + f"Options:\nA. none\nB. <Brindle Mills; founded by; Oskar Venn>\nC. <Oskar Venn; born in; {c}>\nAnswer:"
           for c in ("Teslin", "Varna", "Marovia City", "Ostrava")]
OPTIONS = ["A", "B", "C"]


def make(model_dir, **kw) -> TransformersGenerator:
    kw.setdefault("prompt_format", "plain")
    return TransformersGenerator(GeneratorConfig(model=str(model_dir), progress=False, dtype="float32", device="cpu", **kw))


@pytest.fixture(scope="module")
def gen(tiny_model_dir):
    with make(tiny_model_dir, batch_size=3, prefill_chunk_tokens=128) as g:
        yield g


def reference(g: TransformersGenerator, model, prompt: str, options, prefix: str = "") -> dict[str, float]:
    """The slow, obvious way: the plain model over the whole prompt, log-softmax of the last position."""
    ids = g.preparer.encode(prompt, prefix=prefix)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    logp = torch.log_softmax(logits, -1)
    tids = option_token_ids(g.tokenizer, options)
    return combine_option_logprobs(options, tids, {t: float(logp[t]) for ids_ in tids for t in ids_})


@pytest.fixture(scope="module")
def plain_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def test_scores_match_a_plain_forward_batched_or_alone(gen, plain_model):
    assert isinstance(gen, OptionScorer)
    reqs = [GenerationRequest(prompt=p) for p in PROMPTS]
    got = gen.score_options(reqs, [OPTIONS] * len(reqs))
    for r, s in zip(reqs, got):
        want = reference(gen, plain_model, r.prompt, OPTIONS)
        assert s.logprobs == pytest.approx(want, abs=1e-4)
        assert s.prompt_tokens == len(gen.preparer.encode(r.prompt)) and all(v < 0 for v in s.logprobs.values())
    # shared prefix computed once and the rest in chunks: the same as one request at a time
    alone = gen.score_options(reqs[2:3], [OPTIONS])[0]
    assert alone.logprobs == pytest.approx(got[2].logprobs, abs=1e-4)
    # a response prefix is fed after the prompt; the chat format renders the template
    pre = gen.score_options([GenerationRequest(prompt=PROMPTS[0], prefix=" (")], [OPTIONS])[0]
    assert pre.logprobs == pytest.approx(reference(gen, plain_model, PROMPTS[0], OPTIONS, prefix=" ("), abs=1e-4)


def test_chat_format_and_per_request_options(tiny_model_dir, plain_model):
    with make(tiny_model_dir, prompt_format="chat") as g:
        reqs = [GenerationRequest(prompt=PROMPTS[0]), GenerationRequest(prompt=PROMPTS[1])]
        got = g.score_options(reqs, [["A", "B"], ["A", "B", "C", "D"]])
        assert list(got[0].logprobs) == ["A", "B"] and list(got[1].logprobs) == ["A", "B", "C", "D"]
        assert got[1].logprobs == pytest.approx(reference(g, plain_model, PROMPTS[1], ["A", "B", "C", "D"]), abs=1e-4)


def test_option_tokens_cover_the_letter_with_and_without_a_space(gen):
    (a, b) = option_token_ids(gen.tokenizer, ["A", "B"])
    tok = gen.tokenizer
    assert tok("A", add_special_tokens=False)["input_ids"][0] in a and tok(" A", add_special_tokens=False)["input_ids"][0] in a
    assert not set(a) & set(b)
    with pytest.raises(GenerationError, match="start with the same token"):
        option_token_ids(tok, ["A", "A."])
    with pytest.raises(GenerationError, match="non-empty"):
        option_token_ids(tok, ["A", " "])
    assert combine_option_logprobs(["A", "B"], [(1, 2), (3,)], {1: math.log(0.2), 2: math.log(0.3)}) == {
        "A": pytest.approx(math.log(0.5)), "B": None}


def test_errors_name_the_request(gen, tiny_model_dir):
    with pytest.raises(GenerationError, match="2 requests but 1 option lists"):
        gen.score_options([GenerationRequest(prompt="x"), GenerationRequest(prompt="y")], [["A"]])
    with pytest.raises(GenerationError, match="request 0: option .A. is given twice"):
        gen.score_options([GenerationRequest(prompt="x")], [["A", "A"]])
    g = make(tiny_model_dir)
    g.close()
    with pytest.raises(GeneratorClosedError):
        g.score_options([GenerationRequest(prompt="x")], [["A"]])


def test_the_role_picks_the_adapter(tiny_model_dir, tmp_path, gen):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    get_peft_model(model, LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"],
                                     init_lora_weights=False)).save_pretrained(tmp_path / "select")
    with make(tiny_model_dir, adapters={"select": str(tmp_path / "select")}, base_roles=("answer",)) as g:
        adapted, base = g.score_options([GenerationRequest(prompt=PROMPTS[0], role="select"),
                                         GenerationRequest(prompt=PROMPTS[0], role="answer")], [OPTIONS, OPTIONS])
        plain = gen.score_options([GenerationRequest(prompt=PROMPTS[0])], [OPTIONS])[0]
        assert base.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
        assert adapted.logprobs != pytest.approx(plain.logprobs, abs=1e-3)
        with pytest.raises(GenerationError, match="no adapter for role 'judge'"):
            g.score_options([GenerationRequest(prompt=PROMPTS[0], role="judge")], [OPTIONS])


def test_vllm_scores_options_from_its_top_logprobs(tiny_model_dir, fake_vllm, monkeypatch):  # noqa: F811
    from knowtrace_train.generation import build_generator

    seen = []

    def generate(self, prompts, params, lora_request=None, use_tqdm=False):
        seen.append(params)
        tok = self.tok
        a, b = (tok(x, add_special_tokens=False)["input_ids"][0] for x in (" A", " B"))
        top = {a: types.SimpleNamespace(logprob=math.log(0.6)), b: types.SimpleNamespace(logprob=math.log(0.1)),
               7: types.SimpleNamespace(logprob=math.log(0.05))}
        out = types.SimpleNamespace(text="", token_ids=[a], finish_reason="length", stop_reason=None, logprobs=[top])
        return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

    monkeypatch.setattr(FakeLLM, "generate", generate)
    g = build_generator(GeneratorConfig(model=str(tiny_model_dir), backend="vllm", device="cpu", prompt_format="plain",
                                        progress=False))
    FakeLLM.tok = g.tokenizer
    assert isinstance(g, OptionScorer)
    (s,) = g.score_options([GenerationRequest(prompt=PROMPTS[0])], [["A", "B", "C"]])
    assert s.logprobs["A"] == pytest.approx(math.log(0.6)) and s.logprobs["B"] == pytest.approx(math.log(0.1))
    assert s.logprobs["C"] is None  # not among the top log-probabilities vLLM reported
    assert seen[0][0].max_tokens == 1 and seen[0][0].logprobs == g.option_logprobs and seen[0][0].temperature == 0.0
    g.close()
