"""vLLM's sampling and chat extensions (issue 27, part 3), implemented: `stop_token_ids`,
`include_stop_str_in_output`, `skip_special_tokens`, `spaces_between_special_tokens`,
`add_special_tokens`, `add_generation_prompt`, `continue_final_message`,
`chat_template_kwargs` (and `documents`, `reasoning_effort`), on the engine, the text stream
and the live server (loopback only)."""

from __future__ import annotations

import httpx
import pytest
from engine_helpers import tiny_greedy_engine
from server_helpers import running_server

from pdserve.engine.chat_template import ChatTemplate, TemplateRefusal
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.server.chat_template import chat_options
from pdserve.server.errors import APIError

PROMPT = "The quick brown fox"
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% if shout %}!{% endif %}"
            "{{ '\\n' }}{% endfor %}{% if documents %}[{{ documents | length }} docs]{% endif %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer.shipped()


def greedy_tokens(tokens: int = 16) -> list[int]:
    engine, _ = tiny_greedy_engine(PROMPT, tokens)
    return engine.sequences[0].generated


def first_unrepeated(tokens: list[int], start: int = 3) -> int:
    """An index from `start` on whose token does not occur before it."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


# ---- the text stream ----

def test_a_stop_token_ends_the_stream_without_its_text_unless_asked(tokenizer):
    ids = tokenizer.encode("one two three four")
    plain = TextStream(tokenizer, stop_token_ids={ids[2]})
    text = "".join(plain.push(t) for t in ids)
    assert plain.stopped and text == tokenizer.decode(ids[:2])
    kept = TextStream(tokenizer, stop_token_ids={ids[2]}, include_stop=True)
    assert "".join(kept.push(t) for t in ids) == tokenizer.decode(ids[:3])
    late = TextStream(tokenizer, min_tokens=4, stop_token_ids={ids[2]})
    "".join(late.push(t) for t in ids)
    assert not late.stopped  # before min_tokens a stop token does not count


def test_include_stop_str_in_output_keeps_the_stop_string(tokenizer):
    ids = tokenizer.encode("alpha beta gamma delta")
    cut = TextStream(tokenizer, (" gam",))
    kept = TextStream(tokenizer, (" gam",), include_stop=True)
    assert "".join(cut.push(t) for t in ids) + cut.finish() == "alpha beta"
    assert "".join(kept.push(t) for t in ids) + kept.finish() == "alpha beta gam"


def test_special_tokens_are_skipped_unless_asked(tokenizer):
    ids = [*tokenizer.encode("hi"), 3, 4, *tokenizer.encode(" there")]
    assert tokenizer.decode(ids) == "hi there"
    kept = tokenizer.decode(ids, skip_special_tokens=False)
    assert kept == "hi<|user|><|assistant|> there"
    # byte-level BPE puts nothing between special tokens: the same text either way
    assert tokenizer.decode(ids, False, spaces_between_special_tokens=False) == kept
    stream = TextStream(tokenizer, skip_special_tokens=False)
    assert "".join(stream.push(t) for t in ids) + stream.finish() == kept


# ---- the engine ----

def test_stop_token_ids_end_a_sequence_after_min_tokens():
    tokens = greedy_tokens()
    k = first_unrepeated(tokens)
    model, tokenizer = load_model("tiny", seed=0)
    engine = Engine(model, tokenizer, 64)
    prompt = tokenizer.encode(PROMPT)
    for rid, params, expected in (
            (1, SamplingParams(max_tokens=16, stop_token_ids=(tokens[k],)), k + 1),
            (2, SamplingParams(max_tokens=16, stop_token_ids=(tokens[k],), ignore_eos=True),
             k + 1),  # ignore_eos leaves stop_token_ids in force (vLLM)
            (3, SamplingParams(max_tokens=16, stop_token_ids=(tokens[0],), min_tokens=2),
             None)):
        engine.add(rid, prompt, params)
        engine.run([], [(rid, len(prompt))])
        while not engine.sequences[rid].finish_reason:
            engine.run([rid], [])
        generated = engine.sequences[rid].generated
        if expected is not None:
            assert generated == tokens[:expected]
            assert engine.sequences[rid].finish_reason == "stop"
        else:  # masked before min_tokens: the first token differs from the greedy one
            assert generated[0] != tokens[0]


# ---- the chat template's inputs ----

def test_continue_final_message_leaves_the_last_message_open():
    template = ChatTemplate(TEMPLATE)
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "The answer is "}]
    text = template.render(messages, add_generation_prompt=False, continue_final_message=True)
    assert text == "<|user|>Hi\n<|assistant|>The answer is "  # its own space kept (HF)
    generic = ChatTemplate().render(messages, False, True)
    assert generic.endswith("<|assistant|>\nThe answer is ")
    with pytest.raises(TemplateRefusal):
        template.render(messages, add_generation_prompt=True, continue_final_message=True)


def test_chat_options_follow_vllm():
    assert chat_options(None, None, None).add_generation_prompt
    assert not chat_options(None, True, None).add_generation_prompt
    options = chat_options(None, None, {"shout": 1, "add_generation_prompt": False},
                           documents=[{"title": "a"}], reasoning_effort=None)
    assert not options.add_generation_prompt
    assert options.variables == {"shout": 1, "documents": [{"title": "a"}]}
    for args, param in (((True, True, None), "continue_final_message"),
                        ((True, None, {"add_generation_prompt": False}),
                         "chat_template_kwargs.add_generation_prompt"),
                        ((None, None, {"eos_token": "x"}), "chat_template_kwargs.eos_token"),
                        ((None, None, {"continue_final_message": "yes"}),
                         "chat_template_kwargs.continue_final_message")):
        with pytest.raises(APIError) as refused:
            chat_options(*args)
        assert refused.value.param == param


# ---- the server ----

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("extensions")
    template = directory / "template.jinja"
    template.write_text(TEMPLATE)
    with running_server(directory, {"cluster.instances": 1,
                                    "server.chat_template": str(template)}) as (base, driver):
        yield base, driver


def post(base: str, route: str, **body) -> dict:
    response = httpx.post(f"{base}{route}", timeout=60, json={"model": "tiny", **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_served_stop_token_ids_and_include_stop_str_in_output(server, tokenizer):
    base, _ = server
    tokens = greedy_tokens()
    k = first_unrepeated(tokens)
    common = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    for stream in (False, True):
        if stream:
            texts = []
            with httpx.stream("POST", f"{base}/v1/completions", timeout=60, json={
                    "model": "tiny", **common, "stop_token_ids": [tokens[k]],
                    "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        texts.append(httpx.Response(200, content=line[6:]).json()[
                            "choices"][0]["text"])
            assert "".join(texts) == tokenizer.decode(tokens[:k])
            continue
        plain = post(base, "/v1/completions", **common, stop_token_ids=[tokens[k]])
        assert plain["choices"][0]["text"] == tokenizer.decode(tokens[:k])
        assert plain["choices"][0]["finish_reason"] == "stop"
        assert plain["usage"]["completion_tokens"] == k + 1
        kept = post(base, "/v1/completions", **common, stop_token_ids=[tokens[k]],
                    include_stop_str_in_output=True)
        assert kept["choices"][0]["text"] == tokenizer.decode(tokens[:k + 1])
    whole = tokenizer.decode(tokens)
    stop = whole[len(whole) // 2:len(whole) // 2 + 3]
    kept = post(base, "/v1/completions", **common, stop=[stop], include_stop_str_in_output=True)
    text = kept["choices"][0]["text"]
    assert text.endswith(stop) and text == whole[:whole.index(stop) + len(stop)]


def test_served_special_tokens_kept_when_asked(server):
    base, _ = server
    forced = {"prompt": PROMPT, "max_tokens": 3, "logit_bias": {"3": 100}, "temperature": 0}
    assert post(base, "/v1/completions", **forced)["choices"][0]["text"] == ""
    kept = post(base, "/v1/completions", **forced, skip_special_tokens=False)
    assert kept["choices"][0]["text"] == "<|user|>" * 3
    joined = post(base, "/v1/completions", **forced, skip_special_tokens=False,
                  spaces_between_special_tokens=False)
    assert joined["choices"][0]["text"] == "<|user|>" * 3


def test_served_chat_template_inputs(server, tokenizer):
    base, _ = server
    user = [{"role": "user", "content": "Hi"}]
    prefill = [*user, {"role": "assistant", "content": "Sure:"}]

    def rendered(**fields) -> str:
        ids = post(base, "/tokenize", **fields)["tokens"]
        return post(base, "/detokenize", tokens=ids)["prompt"]

    assert rendered(messages=user) == "<|user|>Hi\n<|assistant|>\n"
    assert rendered(messages=user, add_generation_prompt=False) == "<|user|>Hi\n"
    assert rendered(messages=user, chat_template_kwargs={"shout": True}) == (
        "<|user|>Hi!\n<|assistant|>\n")
    assert rendered(messages=prefill, continue_final_message=True) == (
        "<|user|>Hi\n<|assistant|>Sure:")
    counts = {}
    for name, fields in (("plain", {}), ("no prompt", {"add_generation_prompt": False}),
                         ("kwargs", {"chat_template_kwargs": {"shout": True}}),
                         ("documents", {"documents": [{"title": "a", "text": "b"}]})):
        result = post(base, "/v1/chat/completions", messages=user, max_tokens=2,
                      temperature=0, **fields)
        counts[name] = result["usage"]["prompt_tokens"]
    expected = {name: len(tokenizer.encode(text)) for name, text in (
        ("plain", "<|user|>Hi\n<|assistant|>\n"), ("no prompt", "<|user|>Hi\n"),
        ("kwargs", "<|user|>Hi!\n<|assistant|>\n"),
        ("documents", "<|user|>Hi\n[1 docs]<|assistant|>\n"))}
    assert counts == expected
    cont = post(base, "/v1/chat/completions", messages=prefill, max_tokens=2, temperature=0,
                continue_final_message=True)
    assert cont["usage"]["prompt_tokens"] == len(tokenizer.encode(
        "<|user|>Hi\n<|assistant|>Sure:"))
    both = httpx.post(f"{base}/v1/chat/completions", timeout=30, json={
        "model": "tiny", "messages": prefill, "continue_final_message": True,
        "add_generation_prompt": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"


@pytest.mark.parametrize(("fields", "accepted"), [
    ({"priority": 3, "request_id": "r1", "cache_salt": "s", "vllm_xargs": {"a": 1},
      "kv_transfer_params": {"x": 1}, "length_penalty": 2.0, "guided_decoding_backend": "xgrammar",
      "user": "u"}, True),
])
def test_output_neutral_vllm_fields_are_accepted(server, fields, accepted):
    base, driver = server
    result = post(base, "/v1/completions", prompt=PROMPT, max_tokens=2, temperature=0,
                  **fields)
    assert result["usage"]["completion_tokens"] == 2 and accepted
