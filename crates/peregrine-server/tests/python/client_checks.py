#!/usr/bin/env python3
"""Checks Peregrine's OpenAI-compatible API with the official `openai` Python client.

Usage: client_checks.py BASE_URL API_KEY CHECK
  BASE_URL  the API root, e.g. http://127.0.0.1:8080/v1
  API_KEY   a key the server accepts
  CHECK     one of: models, nonstream, stream, approval, approval_stream, two_chats, task, errors, busy

Each check prints one JSON line with what it observed and exits 0, or prints
`client_checks.py CHECK: what went wrong` to stderr and exits 1 (2 for a usage error).
The model is the first one the server lists, as a client picking from /v1/models would.
Driven by crates/peregrine-server/tests/openai_python.rs; install the client with
scripts/install-python-deps.sh.
"""

import json
import sys

import openai

QUESTION = "What's the weather in Prague?"
PLANNING = "/planning What's the weather in Prague?"
APPROVAL_MARKER = "HUMAN APPROVAL REQUIRED"
# The characters of a conversation's invisible mark: U+2060, then 64 bits as U+200B / U+200C.
MARK_CHARACTERS = "\u2060\u200b\u200c"
# The conversation whose turn the test holds running during the `busy` check.
BUSY_SESSION = "python-client-busy"


class CheckFailed(Exception):
    """A check observed something the API must not do."""


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def client_for(base_url, api_key):
    # No retries: a refused request must surface as the error the server sent, once.
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60.0)


def served_model(client):
    ids = [model.id for model in client.models.list()]
    expect(ids, "GET /models listed no model")
    return ids[0]


def usage_of(usage):
    expect(usage is not None, "no usage in the answer")
    observed = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens, "total_tokens": usage.total_tokens}
    expect(usage.prompt_tokens > 0 and usage.completion_tokens > 0, f"usage without tokens: {observed}")
    expect(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"total_tokens is not prompt + completion: {observed}")
    return observed


def check_models(client, _api_key):
    models = list(client.models.list())
    expect(models, "GET /models listed no model")
    for model in models:
        expect(model.object == "model", f"model {model.id!r} has object {model.object!r}")
    retrieved = client.models.retrieve(models[0].id)
    expect(retrieved.id == models[0].id, f"GET /models/{models[0].id} answered {retrieved.id!r}")
    unknown = expect_error(openai.NotFoundError, lambda: client.models.retrieve(models[0].id + "-unknown"))
    return {
        "ids": [model.id for model in models],
        "owned_by": [model.owned_by for model in models],
        "retrieved": retrieved.id,
        "unknown": unknown,
    }


def check_nonstream(client, _api_key):
    model = served_model(client)
    completion = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}])
    expect(completion.object == "chat.completion", f"object is {completion.object!r}")
    expect(len(completion.choices) == 1, f"{len(completion.choices)} choices")
    choice = completion.choices[0]
    expect(choice.message.role == "assistant", f"role is {choice.message.role!r}")
    expect(choice.message.content, "the answer has no content")
    return {
        "id": completion.id,
        "model": completion.model,
        "content": choice.message.content,
        "finish_reason": choice.finish_reason,
        "usage": usage_of(completion.usage),
    }


def check_stream(client, _api_key):
    model = served_model(client)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    expect(chunks, "the stream had no chunks")
    ids = {chunk.id for chunk in chunks}
    expect(len(ids) == 1, f"chunks have {len(ids)} different ids: {sorted(ids)}")
    last = chunks[-1]
    expect(last.choices == [], f"the last chunk has choices {last.choices!r}, not [] (the usage chunk)")
    usage = usage_of(last.usage)
    finish_reasons = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason is not None]
    expect(finish_reasons == ["stop"], f"finish reasons {finish_reasons!r}, not 'stop' once")
    content = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    expect(content, "the stream carried no content")
    # Progress comes as `reasoning_content`, a field the client does not know: kept as an extra.
    reasoning = "".join(getattr(choice.delta, "reasoning_content", None) or "" for chunk in chunks for choice in chunk.choices)
    return {
        "id": chunks[0].id,
        "chunks": len(chunks),
        "first_role": chunks[0].choices[0].delta.role if chunks[0].choices else None,
        # The chunk right after the role's: a new conversation's invisible mark and a blank line.
        "second_content": chunks[1].choices[0].delta.content if len(chunks) > 1 and chunks[1].choices else None,
        "content": content,
        "reasoning": reasoning,
        "finish_reasons": finish_reasons,
        "usage": usage,
    }


def check_approval(client, _api_key):
    model = served_model(client)
    history = [{"role": "user", "content": PLANNING}]
    asked = client.chat.completions.create(model=model, messages=history)
    prompt = asked.choices[0].message.content or ""
    expect(APPROVAL_MARKER in prompt, f"the first answer is not an approval prompt: {prompt!r}")
    history += [{"role": "assistant", "content": prompt}, {"role": "user", "content": "yes"}]
    done = client.chat.completions.create(model=model, messages=history)
    answer = done.choices[0].message.content or ""
    expect(answer, "the approved turn answered nothing")
    expect(APPROVAL_MARKER not in answer, f"the approval was asked again: {answer!r}")
    return {"prompt": prompt, "answer": answer, "finish_reason": done.choices[0].finish_reason}


def check_approval_stream(client, _api_key):
    """The approval prompt streamed (progress as reasoning), then answered with the history as streamed."""
    model = served_model(client)
    history = [{"role": "user", "content": PLANNING}]
    stream = client.chat.completions.create(model=model, messages=history, stream=True)
    prompt = "".join(choice.delta.content or "" for chunk in stream for choice in chunk.choices)
    expect(APPROVAL_MARKER in prompt, f"the first answer is not an approval prompt: {prompt!r}")
    # The conversation's invisible mark and a blank line open the answer, then the prompt itself.
    expect(prompt.lstrip(MARK_CHARACTERS).startswith("\n\n"), f"the streamed prompt has no mark and blank line first: {prompt!r}")
    expect("…" not in prompt, f"progress in the streamed prompt's text: {prompt!r}")
    history += [{"role": "assistant", "content": prompt}, {"role": "user", "content": "yes"}]
    done = client.chat.completions.create(model=model, messages=history)
    answer = done.choices[0].message.content or ""
    expect(APPROVAL_MARKER not in answer, f"the approval was asked again: {answer!r}")
    return {"prompt": prompt, "answer": answer}


def check_two_chats(client, _api_key):
    """Two chats that start with the same message, each continued with its own history."""
    model = served_model(client)
    first = [{"role": "user", "content": QUESTION}]
    answers = [client.chat.completions.create(model=model, messages=first).choices[0].message.content or "" for _ in range(2)]
    expect(answers[0] != answers[1], f"two chats got the same first answer, so they cannot be told apart: {answers!r}")
    follow_ups = []
    for answer in answers:
        history = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": QUESTION}]
        follow_ups.append(client.chat.completions.create(model=model, messages=history).choices[0].message.content or "")
    return {"first_answers": answers, "follow_ups": follow_ups}


def check_task(client, _api_key):
    """An Open WebUI title request: answered by one model call, in the usual shape."""
    model = served_model(client)
    prompt = "### Task:\nGenerate a concise, 3-5 word title summarizing the chat history.\n<chat_history>\nUSER: hi\n</chat_history>"
    completion = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}])
    expect(completion.object == "chat.completion", f"object is {completion.object!r}")
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    streamed = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    return {
        "content": completion.choices[0].message.content,
        "finish_reason": completion.choices[0].finish_reason,
        "streamed": streamed,
        "stream_usage": usage_of(chunks[-1].usage) if chunks and chunks[-1].usage else None,
    }


def expect_error(kind, request, secret=None):
    """Runs `request`, which must raise `kind`; returns what the error carried."""
    try:
        request()
    except kind as error:
        text = str(error)
        if secret is not None:
            expect(secret not in text, f"the error echoes the presented key: {text!r}")
        return {"error": type(error).__name__, "status_code": error.status_code, "code": error.code, "param": error.param, "message": error.message}
    except openai.APIError as error:
        raise CheckFailed(f"expected {kind.__name__}, got {type(error).__name__}: {error}") from error
    raise CheckFailed(f"expected {kind.__name__}, the request succeeded")


def check_errors(client, api_key):
    model = served_model(client)
    question = [{"role": "user", "content": QUESTION}]
    wrong_key = api_key + "-wrong"
    wrong = client_for(str(client.base_url), wrong_key)
    observed = {
        "wrong_key": expect_error(
            openai.AuthenticationError, lambda: wrong.chat.completions.create(model=model, messages=question), secret=wrong_key
        ),
        "unknown_model": expect_error(
            openai.NotFoundError, lambda: client.chat.completions.create(model=model + "-unknown", messages=question)
        ),
        # A history that ends with an answer asks to continue it: this conversation has no cut-off turn.
        "assistant_last": expect_error(
            openai.ConflictError,
            lambda: client.chat.completions.create(model=model, messages=question + [{"role": "assistant", "content": "It is sunny."}]),
        ),
        "two_choices": expect_error(openai.BadRequestError, lambda: client.chat.completions.create(model=model, messages=question, n=2)),
        "json_output": expect_error(
            openai.BadRequestError,
            lambda: client.chat.completions.create(model=model, messages=question, response_format={"type": "json_object"}),
        ),
        "forced_tool": expect_error(
            openai.BadRequestError,
            lambda: client.chat.completions.create(
                model=model,
                messages=question,
                tools=[{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}],
                tool_choice="required",
            ),
        ),
    }
    for name, status in [
        ("wrong_key", 401),
        ("unknown_model", 404),
        ("assistant_last", 409),
        ("two_choices", 400),
        ("json_output", 400),
        ("forced_tool", 400),
    ]:
        expect(observed[name]["status_code"] == status, f"{name}: status {observed[name]['status_code']}, not {status}")
    return observed


def check_busy(client, api_key):
    """A message for a conversation whose turn still runs (the test holds it): a 409 that the
    client, which retries 409s by default, does not send again (the server says x-should-retry: false)."""
    model = served_model(client)
    sent = []
    http_client = openai.DefaultHttpxClient(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    retrying = openai.OpenAI(base_url=str(client.base_url), api_key=api_key, max_retries=2, timeout=60.0, http_client=http_client)
    busy = expect_error(
        openai.ConflictError,
        lambda: retrying.chat.completions.create(
            model=model, messages=[{"role": "user", "content": QUESTION}], extra_headers={"X-Session-Id": BUSY_SESSION}
        ),
    )
    posts = [path for path in sent if path.endswith("/chat/completions")]
    expect(len(posts) == 1, f"the client sent the refused request {len(posts)} times, not once")
    return {"busy": busy, "max_retries": retrying.max_retries, "requests": len(posts)}


CHECKS = {
    "models": check_models,
    "nonstream": check_nonstream,
    "stream": check_stream,
    "approval": check_approval,
    "approval_stream": check_approval_stream,
    "two_chats": check_two_chats,
    "task": check_task,
    "errors": check_errors,
    "busy": check_busy,
}


def main(argv):
    if len(argv) != 4 or argv[3] not in CHECKS:
        print(f"usage: {argv[0]} BASE_URL API_KEY {{{','.join(CHECKS)}}}", file=sys.stderr)
        return 2
    base_url, api_key, check = argv[1:]
    try:
        observed = CHECKS[check](client_for(base_url, api_key), api_key)
    except CheckFailed as failure:
        print(f"client_checks.py {check}: {failure}", file=sys.stderr)
        return 1
    except openai.OpenAIError as error:
        print(f"client_checks.py {check}: the client raised {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"check": check, "openai_version": openai.__version__, **observed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
