"""Drives Peregrine's web UI (served at `/`) in headless Chromium with Playwright's sync API.

Usage: web_ui_check.py <base_url> <api_key> <screenshot_path> <long_answer_pieces> <long_answer_end>

Run by crates/peregrine-server/tests/web_ui.rs against the hello-world-weather agent on the
scripted LLM server (which answers every weather question with San Francisco's weather, and a
question asking for a "long report" with <long_answer_pieces> streamed pieces ending in
<long_answer_end>). The flow: the key field after a 401 (a wrong key first, then the right one),
a new thread, a question whose plan and streamed answer show up, the same question in planning
mode with the plan approval (steps shown, the plan JSON in the editor) approved with the button
(the focus goes back to the composer), again in planning mode answered by typing "yes" (sent as
"yes", not "/planning yes"), the thread in the list, a stream cut after its second token (the
page reconnects with Last-Event-ID and shows the same answer, no token lost or repeated), the
long answer in a new thread (all of it shown, once, and the page still answers), a message sent
right after picking a thread whose state is slow to come (the composer waits, nothing is
wiped), runs the page sees through routed responses (a step that asks for approval shown
waiting, a refused run whose text goes back into the composer, a thread busy with a run the page
does not follow, polled until it is idle), keyboard access to the thread list, and after a reload
the key from localStorage and the thread's messages from its state. Every wait is one of
Playwright's auto-waiting `expect`s with a timeout. Saves a full-page screenshot (also when a
check fails), and one at the approval beside it (`<name>_approval.png`), and exits non-zero with
the failing step on failure, printing the last SSE events the page handled.
"""

import json
import re
import sys
import traceback

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
QUESTION = "What's the weather in San Francisco?"
# The scripted server answers this one with the long answer (its prompt says "long report").
LONG_QUESTION = "Give me a long report on the weather in San Francisco."
# Shortens the page's poll of a busy thread (2 s) for the busy-thread check.
PAGE_OPTIONS = "window.PEREGRINE_UI_OPTIONS = { busyPollMs: 200 };"
# What the scripted respond call answers: the summary the weather step stored, after this.
ANSWER_START = "Here is the current weather. Weather in San Francisco"
# A whole turn against the scripted server takes well under a second; this only bounds a hang.
TURN_TIMEOUT_MS = 60_000
STEP_TIMEOUT_MS = 15_000


class CheckFailed(Exception):
    """A check of the flow failed."""


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def step(name):
    print(f"step: {name}", flush=True)


def runs_finished(page, count):
    """Waits until the page has shown the end of its `count`-th run (body[data-runs-finished])."""
    expect(page.locator("body")).to_have_attribute("data-runs-finished", str(count), timeout=TURN_TIMEOUT_MS)


def no_error_banner(page, when):
    banner = page.locator("#error")
    if banner.is_visible():
        raise CheckFailed(f"{when}: the page shows an error: {page.locator('#error-text').text_content()!r}")


def run_flow(page, base_url, key, approval_screenshot):
    info = page.request.get(f"{base_url}/info")
    check(info.ok, f"GET /info answered {info.status}: {info.text()}")
    info = info.json()
    check(info.get("auth") is True, f"/info says auth={info.get('auth')!r} for a server started with a key: {info}")

    step("open the page; the key field appears")
    page.goto(f"{base_url}/")
    expect(page.locator("#app-title")).to_have_text(info["name"], timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#key-panel")).to_be_visible(timeout=STEP_TIMEOUT_MS)

    step("a wrong key is refused with the API's message")
    page.fill("#api-key", "sk-not-the-key")
    page.click("#save-key")
    expect(page.locator("#key-panel")).to_be_visible(timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#key-error")).to_contain_text("Incorrect API key", timeout=STEP_TIMEOUT_MS)

    step("the right key is accepted and kept in localStorage")
    page.fill("#api-key", key)
    page.click("#save-key")
    expect(page.locator("#key-panel")).to_be_hidden(timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#status")).to_have_text("Ready", timeout=STEP_TIMEOUT_MS)
    stored = page.evaluate("() => localStorage.getItem('peregrine.apiKey')")
    check(stored == key, f"localStorage holds {stored!r}, not the key")

    step("a new thread is created and selected")
    page.click("#new-thread")
    selected = page.locator("#thread-list .thread.selected")
    expect(selected).to_have_count(1, timeout=STEP_TIMEOUT_MS)
    thread_id = selected.get_attribute("data-thread-id") or ""
    check(thread_id.startswith("t-"), f"the new thread's id is {thread_id!r}, not t-…")

    step("a question: the plan runs and the answer streams in")
    page.fill("#message-input", QUESTION)
    page.click("#send")
    expect(page.locator(".message.user").first).to_have_text(QUESTION, timeout=STEP_TIMEOUT_MS)
    steps = page.locator("#plan-steps .plan-step")
    expect(steps).to_have_count(2, timeout=TURN_TIMEOUT_MS)
    expect(steps.nth(0)).to_have_attribute("data-capability", "current_weather")
    expect(steps.nth(1)).to_have_attribute("data-capability", "respond")
    expect(steps.nth(0)).to_contain_text("San Francisco")
    answer = page.locator(".message.assistant").last
    expect(answer).to_contain_text(ANSWER_START, timeout=TURN_TIMEOUT_MS)
    runs_finished(page, 1)
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    first_answer = streamed_answer(page, "the first answer")
    expect(page.locator('#plan-steps .plan-step[data-status="done"]')).to_have_count(2)
    expect(page.locator("#status")).to_have_attribute("data-state", "done")
    expect(page.locator(".message.assistant")).to_have_count(1)
    expect(page.locator("#approval")).to_be_hidden()
    no_error_banner(page, "after the first answer")

    step("planning mode: the plan waits for approval")
    page.check("#planning-mode")
    page.fill("#message-input", QUESTION)
    page.click("#send")
    expect(page.locator(".message.user").last).to_contain_text(QUESTION, timeout=STEP_TIMEOUT_MS)
    approval = page.locator("#approval")
    expect(approval).to_be_visible(timeout=TURN_TIMEOUT_MS)
    expect(approval).to_have_attribute("data-approval-type", "orchestrator_plan")
    runs_finished(page, 2)
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "interrupted")
    message = (page.locator("#approval-message").text_content() or "").strip()
    check(message, "the approval shows no prompt text")
    expect(steps).to_have_count(2)
    expect(page.locator('#plan-steps .plan-step[data-status="pending"]')).to_have_count(2)
    expect(steps.nth(0)).to_have_attribute("data-capability", "current_weather")
    expect(page.locator("#status")).to_have_attribute("data-state", "waiting")
    expect(page.locator("#approve")).to_be_enabled()
    expect(page.locator("#reject")).to_be_enabled()

    step("the plan editor holds the plan JSON")
    page.click("#plan-edit summary")
    expect(page.locator("#plan-editor")).to_be_visible(timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#approve-edited")).to_be_visible()
    try:
        plan = json.loads(page.input_value("#plan-editor"))
    except json.JSONDecodeError as error:
        raise CheckFailed(f"the plan editor does not hold JSON: {error}") from error
    capabilities = [planned.get("capability") for planned in plan.get("steps", [])]
    check(capabilities == ["current_weather", "respond"], f"the edited plan's steps are {capabilities}")
    check("San Francisco" in plan["steps"][0].get("task_objective", ""), f"the plan's first step: {plan['steps'][0]}")
    no_error_banner(page, "at the approval")
    page.screenshot(path=approval_screenshot, full_page=True)
    print(f"screenshot at the approval: {approval_screenshot}", flush=True)

    step("approve: the plan runs and the answer streams in; the focus goes back to the composer")
    page.click("#approve")
    expect(approval).to_be_hidden(timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#message-input")).to_be_focused()
    runs_finished(page, 3)
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    expect(page.locator(".message.assistant").last).to_contain_text(ANSWER_START, timeout=STEP_TIMEOUT_MS)
    expect(page.locator(".message.assistant").nth(1)).to_be_visible()
    expect(page.locator('#plan-steps .plan-step[data-status="done"]')).to_have_count(2)
    streamed_answer(page, "the approved answer")
    expect(approval).to_be_hidden()
    no_error_banner(page, "after the approved answer")

    step("the thread list shows the thread with its title")
    item = page.locator(f'#thread-list .thread[data-thread-id="{thread_id}"]')
    expect(item).to_have_count(1, timeout=STEP_TIMEOUT_MS)
    expect(item.locator(".thread-title")).to_contain_text("San Francisco")
    expect(item).to_have_class(re.compile(r"\bselected\b"))
    return thread_id, first_answer


def check_typed_approval(page):
    step("planning mode still ticked: typing yes answers the plan approval")
    check(page.is_checked("#planning-mode"), "planning mode is no longer ticked")
    done = int(page.locator("body").get_attribute("data-runs-finished") or "0")
    page.fill("#message-input", QUESTION)
    page.press("#message-input", "Enter")
    expect(page.locator("#approval")).to_be_visible(timeout=TURN_TIMEOUT_MS)
    runs_finished(page, done + 1)
    expect(page.locator("#composer-hint")).to_be_visible()
    expect(page.locator("#composer-hint")).to_contain_text("answers the approval")
    expect(page.locator("#message-input")).to_have_attribute("placeholder", re.compile(r"yes / no"))
    page.fill("#message-input", "yes")
    page.press("#message-input", "Enter")
    expect(page.locator(".message.user").last).to_have_text("yes", timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#approval")).to_be_hidden()
    runs_finished(page, done + 2)
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    expect(page.locator(".message.assistant").last).to_contain_text(ANSWER_START)
    expect(page.locator('#plan-steps .plan-step[data-status="done"]')).to_have_count(2)
    expect(page.locator("#approval")).to_be_hidden()
    expect(page.locator("#composer-hint")).to_be_hidden()
    streamed_answer(page, "the answer after typing yes")
    no_error_banner(page, "after the typed approval")


def check_cancelled_approval(page):
    step("planning mode still ticked: Cancel withdraws the plan; nothing runs and the thread is idle")
    check(page.is_checked("#planning-mode"), "planning mode is no longer ticked")
    done = int(page.locator("body").get_attribute("data-runs-finished") or "0")
    answers = page.locator(".message.assistant").count()
    page.fill("#message-input", QUESTION)
    page.press("#message-input", "Enter")
    expect(page.locator("#approval")).to_be_visible(timeout=TURN_TIMEOUT_MS)
    runs_finished(page, done + 1)
    expect(page.locator("#abandon")).to_be_enabled()
    page.click("#abandon")
    expect(page.locator("#approval")).to_be_hidden(timeout=STEP_TIMEOUT_MS)
    expect(page.locator(".message.user").last).to_have_text("Cancelled", timeout=STEP_TIMEOUT_MS)
    runs_finished(page, done + 2)
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    expect(page.locator(".message.assistant")).to_have_count(answers + 1)
    expect(page.locator(".message.assistant").last).to_contain_text("Cancelled: the execution plan was not run")
    expect(page.locator("#composer-hint")).to_be_hidden()
    expect(page.locator("#status")).not_to_have_attribute("data-state", "waiting")
    no_error_banner(page, "after the cancelled approval")


def check_long_answer(page, pieces, end):
    step(f"a long answer ({pieces} token events) is shown whole, once, and the page still answers")
    done = int(page.locator("body").get_attribute("data-runs-finished") or "0")
    page.click("#new-thread")
    expect(page.locator("#message-input")).to_be_enabled()
    expect(page.locator(".message")).to_have_count(0)
    # Counts what the page does per token (not how long it takes): nodes added to the answer while
    # it streams (one Text node grows instead) and writes of the list's scrollTop (once a frame).
    page.evaluate(
        """() => {
            const box = document.getElementById("messages");
            const scrollTop = Object.getOwnPropertyDescriptor(Element.prototype, "scrollTop");
            window.__scrollWrites = 0;
            Object.defineProperty(box, "scrollTop", {
                configurable: true,
                get() { return scrollTop.get.call(this); },
                set(value) { window.__scrollWrites += 1; scrollTop.set.call(this, value); },
            });
            window.__answerNodes = 0;
            window.__answerObserver = new MutationObserver((records) => {
                for (const record of records) {
                    const target = record.target;
                    if (target.classList && target.classList.contains("assistant") && target.dataset.streaming === "true") {
                        window.__answerNodes += record.addedNodes.length;
                    }
                }
            });
            window.__answerObserver.observe(box, { childList: true, subtree: true });
        }"""
    )
    page.fill("#message-input", LONG_QUESTION)
    page.press("#message-input", "Enter")
    runs_finished(page, done + 1)
    work = page.evaluate(
        """() => {
            window.__answerObserver.disconnect();
            delete document.getElementById("messages").scrollTop;
            return { nodes: window.__answerNodes, scrolls: window.__scrollWrites };
        }"""
    )
    print(f"  the long answer: {work['nodes']} nodes added while streaming, {work['scrolls']} scrollTop writes", flush=True)
    check(work["nodes"] <= 1, f"{work['nodes']} nodes were added to the answer while it streamed (one per token?)")
    check(work["scrolls"] < pieces // 4, f"the message list was scrolled {work['scrolls']} times for {pieces} tokens (once per token?)")
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    answer = page.locator(".message.assistant")
    expect(answer).to_have_count(1)
    expect(answer).to_have_attribute("data-token-count", str(pieces))
    expect(page.locator("body")).to_have_attribute("data-last-run-tokens", str(pieces))
    text = answer.text_content() or ""
    words = text.split()
    expected = [f"w{index}" for index in range(1, pieces)] + [end]
    check(words == expected, f"the long answer shows {len(words)} words, not the {len(expected)} sent in order "
          f"(first difference at {next((i for i, (a, b) in enumerate(zip(words, expected)) if a != b), min(len(words), len(expected)))})")
    check(text.count("\n") == (pieces - 1) // 40, f"the long answer has {text.count(chr(10))} line breaks")
    at_bottom = page.evaluate("() => { const box = document.getElementById('messages'); return box.scrollHeight - box.scrollTop - box.clientHeight < 4; }")
    check(at_bottom, "the message list did not follow the long answer to its end")
    # Still answers input: the composer takes text, and another thread opens.
    page.fill("#message-input", "still here")
    expect(page.locator("#message-input")).to_have_value("still here")
    page.fill("#message-input", "")
    no_error_banner(page, "after the long answer")


def install_slow_state(page, delay_ms):
    """Delays every answer to GET …/state by `delay_ms` in the page (fetch wrapped)."""
    page.evaluate(
        """(delay) => {
            if (!window.__realFetch) window.__realFetch = window.fetch;
            window.fetch = async (...args) => {
                const response = await window.__realFetch(...args);
                if (String(args[0]).endsWith("/state")) await new Promise((resolve) => setTimeout(resolve, delay));
                return response;
            };
        }""",
        delay_ms,
    )


def remove_slow_state(page):
    page.evaluate("() => { if (window.__realFetch) window.fetch = window.__realFetch; }")


def check_send_after_select(page, thread_id):
    step("a message sent right after picking a thread: the composer waits for its state, nothing is wiped")
    state = page.evaluate(
        """async (id) => {
            const key = localStorage.getItem("peregrine.apiKey");
            const response = await fetch(`threads/${encodeURIComponent(id)}/state`, { headers: { Authorization: "Bearer " + key } });
            return response.json();
        }""",
        thread_id,
    )
    users_before = sum(1 for message in state.get("messages", []) if message.get("role") == "user" and (message.get("content") or "").strip())
    check(users_before >= 3, f"the thread's state has {users_before} user messages: {state.get('messages')}")
    done = int(page.locator("body").get_attribute("data-runs-finished") or "0")
    install_slow_state(page, 600)
    try:
        page.locator(f'#thread-list .thread[data-thread-id="{thread_id}"] .thread-open').click()
        expect(page.locator("#message-input")).to_be_disabled()
        expect(page.locator("#send")).to_be_disabled()
        page.fill("#message-input", QUESTION)  # waits until the composer is enabled again
        page.press("#message-input", "Enter")
        expect(page.locator(".message.user").last).to_have_text(QUESTION)
        runs_finished(page, done + 1)
    finally:
        remove_slow_state(page)
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    expect(page.locator(".message.user")).to_have_count(users_before + 1)
    expect(page.locator(".message.assistant").last).to_contain_text(ANSWER_START)
    streamed_answer(page, "the answer sent right after picking the thread")
    no_error_banner(page, "after sending right after picking a thread")


def sse(events):
    return "".join(f"id: {index}\nevent: {name}\ndata: {json.dumps(data)}\n\n" for index, (name, data) in enumerate(events, 1))


def check_routed_runs(page, thread_id):
    """Runs the page sees through routed responses (no LLM call): what the weather agent never does."""
    step("a step that asks for approval is shown waiting for it")
    done = int(page.locator("body").get_attribute("data-runs-finished") or "0")
    steps = [{"capability": "python", "task_objective": "run code"}, {"capability": "respond", "task_objective": "answer"}]
    interrupt = {"id": "i-1", "node": "python", "approval_type": "python_executor", "message": "Run this code?", "payload": {}}
    body = sse([
        ("metadata", {"run_id": "run-routed", "thread_id": thread_id}),
        ("plan_created", {"steps": steps}),
        ("capability_start", {"capability_name": "python", "step_number": 1, "total_steps": 2, "description": "run code"}),
        ("interrupt", interrupt),
        ("end", {"run_id": "run-routed", "status": "interrupted", "result": {"status": "interrupted", "response": None, "interrupt": interrupt}, "error": None}),
    ])
    page.route("**/runs/stream", lambda route: route.fulfill(status=200, content_type="text/event-stream", body=body))
    try:
        page.fill("#message-input", "run some code")
        page.press("#message-input", "Enter")
        runs_finished(page, done + 1)
    finally:
        page.unroute("**/runs/stream")
    first = page.locator("#plan-steps .plan-step").nth(0)
    expect(first).to_have_attribute("data-status", "waiting")
    expect(first.locator(".step-state")).to_have_text("waiting for approval")
    expect(page.locator("#plan-steps .plan-step").nth(1)).to_have_attribute("data-status", "pending")

    step("a refused run: its text goes back into the composer, the error is shown")
    refusal = {"error": {"message": "Thread is busy with another run.", "type": "invalid_request_error", "param": None, "code": "thread_busy"}}
    page.route("**/runs/stream", lambda route: route.fulfill(status=409, content_type="application/json", body=json.dumps(refusal)))
    users = page.locator(".message.user").count()
    try:
        page.fill("#message-input", "refused words")
        page.press("#message-input", "Enter")
        runs_finished(page, done + 2)
    finally:
        page.unroute("**/runs/stream")
    expect(page.locator("#message-input")).to_have_value("refused words")
    expect(page.locator("#error-text")).to_contain_text("Thread is busy")
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "refused")
    expect(page.locator(".message.user")).to_have_count(users)
    page.click("#error-close")
    page.fill("#message-input", "")

    step("after a reload the plan shows the state's step results (a failed step with its error)")
    state_url = re.compile(r"/threads/[^/]+/state$")

    def failed_first_step(route):
        response = route.fetch()
        state = response.json()
        plan = state.get("plan") or {}
        check(len(plan.get("steps") or []) == 2, f"the thread's state has no two-step plan: {plan}")
        plan["current_step"] = 2
        plan["results"] = [
            {"step_index": 0, "capability": "current_weather", "success": False, "error": "the weather service timed out"},
            {"step_index": 1, "capability": "respond", "success": True, "error": None},
        ]
        route.fulfill(response=response, body=json.dumps(state))

    page.route(state_url, failed_first_step)
    try:
        page.reload()
        first = page.locator("#plan-steps .plan-step").nth(0)
        expect(first).to_have_attribute("data-status", "failed", timeout=STEP_TIMEOUT_MS)
        expect(first.locator(".step-error")).to_have_text("the weather service timed out")
        expect(page.locator("#plan-steps .plan-step").nth(1)).to_have_attribute("data-status", "done")
    finally:
        page.unroute(state_url)

    step("a thread busy with a run the page does not follow: said so, polled until idle")
    polls = []
    runs_url = re.compile(r"/threads/[^/]+/runs$")
    thread_url = re.compile(r"/threads/[^/?]+$")

    def busy_state(route):
        response = route.fetch()
        state = response.json()
        state["status"] = "busy"
        route.fulfill(response=response, body=json.dumps(state))

    def no_runs(route):
        if route.request.method == "GET":
            route.fulfill(status=200, content_type="application/json", body="[]")
        else:
            route.fallback()

    def thread_polled(route):
        if route.request.method != "GET":
            route.fallback()
            return
        polls.append(route.request.url)
        response = route.fetch()
        thread = response.json()
        if len(polls) < 3:
            thread["status"] = "busy"
        route.fulfill(response=response, body=json.dumps(thread))

    page.route(state_url, busy_state)
    page.route(runs_url, no_runs)
    page.route(thread_url, thread_polled)
    try:
        page.reload()
        expect(page.locator("#status")).to_have_text("A run is active on this thread", timeout=STEP_TIMEOUT_MS)
        expect(page.locator("body")).to_have_attribute("data-busy-poll", "true")
        page.unroute(state_url)
        expect(page.locator("body")).to_have_attribute("data-busy-poll", "false", timeout=STEP_TIMEOUT_MS)
        expect(page.locator("#status")).not_to_have_text("A run is active on this thread")
    finally:
        page.unroute(runs_url)
        page.unroute(thread_url)
    check(len(polls) >= 3, f"the busy thread was polled {len(polls)} times")
    expect(page.locator("#thread-list .thread.selected")).to_have_attribute("data-status", re.compile(r"^(idle|interrupted)$"))
    no_error_banner(page, "after the busy thread")


def check_keyboard(page):
    step("keyboard: the labelled composer, the log, a thread's Delete reachable with Tab")
    expect(page.locator("#message-input")).to_have_attribute("aria-label", "Message")
    expect(page.locator("#messages")).to_have_attribute("role", "log")
    other = page.locator("#thread-list .thread:not(.selected)").first
    other_id = other.get_attribute("data-thread-id")
    other.locator(".thread-open").focus()
    page.keyboard.press("Tab")
    expect(other.locator(".delete-thread")).to_be_focused()
    check(page.evaluate("() => getComputedStyle(document.activeElement).opacity") == "1", "the focused Delete button is not visible")
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    check(outline not in ("none", ""), f"the focused Delete button has no focus ring (outline {outline!r})")
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    selected = page.locator("#thread-list .thread.selected")
    expect(selected).to_have_attribute("data-thread-id", other_id)
    expect(page.locator("#message-input")).to_be_enabled()
    expect(selected.locator(".thread-open")).to_be_focused()  # kept through the list's re-renders


def streamed_answer(page, what):
    """The last answer's (text, token count): streamed in several `token` events, and what the
    thread's state holds (the page replaces a streamed answer that differs from the state's)."""
    answer = page.locator(".message.assistant").last
    tokens = int(answer.get_attribute("data-token-count") or "0")
    check(tokens > 1, f"{what} came as {tokens} token event(s), not streamed piece by piece (or differs from the thread's state)")
    body_tokens = int(page.locator("body").get_attribute("data-last-run-tokens") or "0")
    check(body_tokens == tokens, f"{what}: the run had {body_tokens} token events, the message shows {tokens}")
    return answer.text_content(), tokens


def check_reconnect(page, first_answer):
    step("a stream that breaks is followed again from Last-Event-ID (after a proxy's 503)")
    cut = {}
    reconnects = []
    unavailable = []

    def first_reconnect_unavailable(route):
        # A proxy that answers the first reconnect 503: the page tries again, later.
        if unavailable:
            route.fallback()
            return
        unavailable.append(route.request.url)
        error = {"error": {"message": "Service Unavailable", "type": "server_error", "param": None, "code": None}}
        route.fulfill(status=503, content_type="application/json", body=json.dumps(error))

    def cut_stream(route):
        # The run's whole stream, handed to the page only up to its second token event: the page
        # sees the connection end without `end` and must reconnect with that event's id.
        if route.request.method != "POST" or cut:
            route.fallback()
            return
        body = route.fetch().text()
        blocks = body.split("\n\n")
        tokens = [index for index, block in enumerate(blocks) if re.search(r"^event: token$", block, re.M)]
        if len(tokens) < 2 or "event: end" not in body:
            cut["problem"] = f"the run's stream has {len(tokens)} token event(s) and end={'event: end' in body}: {body[:2000]!r}"
            route.fulfill(status=200, content_type="text/event-stream", body=body)
            return
        kept = blocks[: tokens[1] + 1]
        cut["id"] = re.search(r"^id: *(\d+)$", kept[-1], re.M).group(1)
        route.fulfill(status=200, content_type="text/event-stream", body="\n\n".join(kept) + "\n\n")

    def on_request(request):
        if request.method == "GET" and re.search(r"/runs/[^/]+/stream", request.url):
            reconnects.append(request.headers.get("last-event-id"))

    reconnect_url = re.compile(r"/runs/[^/]+/stream")
    page.on("request", on_request)
    page.route("**/runs/stream", cut_stream)
    page.route(reconnect_url, first_reconnect_unavailable)
    page.uncheck("#planning-mode")
    done = int(page.locator("body").get_attribute("data-runs-finished") or "0")
    page.fill("#message-input", QUESTION)
    page.click("#send")
    runs_finished(page, done + 1)
    page.unroute("**/runs/stream")
    page.unroute(reconnect_url)
    page.remove_listener("request", on_request)
    check("problem" not in cut, cut.get("problem", ""))
    check("id" in cut, "the run's stream was not cut (no POST …/runs/stream seen)")
    check(reconnects == [cut["id"], cut["id"]], f"reconnects sent Last-Event-ID {reconnects}, expected two (503, then the stream) with {cut['id']}")
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    answer = streamed_answer(page, "the answer after the reconnect")
    check(answer == first_answer, f"after the reconnect the answer is {answer}, not {first_answer} (lost or repeated tokens)")
    expect(page.locator('#plan-steps .plan-step[data-status="done"]')).to_have_count(2)
    no_error_banner(page, "after the reconnect")


def check_reload(page, thread_id):
    step("reload: the key comes from localStorage, the thread's messages from its state")
    page.goto(page.url.split("#")[0] + "#thread=" + thread_id)
    page.reload()
    expect(page.locator("#status")).not_to_have_text("Connecting…", timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#key-panel")).to_be_hidden()
    expect(page.locator("#thread-list .thread.selected")).to_have_attribute("data-thread-id", thread_id, timeout=STEP_TIMEOUT_MS)
    expect(page.locator(".message.assistant").last).to_contain_text(ANSWER_START, timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#approval")).to_be_hidden()
    no_error_banner(page, "after the reload")


def main():
    if len(sys.argv) != 6:
        print("usage: web_ui_check.py <base_url> <api_key> <screenshot_path> <long_answer_pieces> <long_answer_end>", file=sys.stderr)
        return 2
    base_url, key, screenshot = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    long_pieces, long_end = int(sys.argv[4]), sys.argv[5]
    stem, dot, suffix = screenshot.rpartition(".")
    approval_screenshot = f"{stem}_approval.{suffix}" if dot else f"{screenshot}_approval"
    problems = []
    failure = None
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        except PlaywrightError as error:
            print(f"web_ui_check.py FAILED: {CHROMIUM} does not start ({error}); run bash scripts/install-browser-deps.sh", file=sys.stderr)
            return 1
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 860})
            context.add_init_script(PAGE_OPTIONS)
            page = context.new_page()
            page.set_default_timeout(STEP_TIMEOUT_MS)
            page.on("pageerror", lambda error: problems.append(f"uncaught exception: {error}"))

            def on_console(message):
                # A refused request (the 401 before the key) is logged by Chromium as a failed load;
                # anything else at error level (a CSP refusal, the page's console.error) counts.
                # The refused run (409) is one too.
                if message.type == "error" and "Failed to load resource" not in message.text:
                    problems.append(f"console error: {message.text}")

            page.on("console", on_console)
            try:
                thread_id, first_answer = run_flow(page, base_url, key, approval_screenshot)
                check_typed_approval(page)
                check_cancelled_approval(page)
                check_reconnect(page, first_answer)
                check_long_answer(page, long_pieces, long_end)
                page.screenshot(path=screenshot, full_page=True)
                print(f"screenshot: {screenshot}", flush=True)
                check_send_after_select(page, thread_id)
                check_routed_runs(page, thread_id)
                check_keyboard(page)
                check_reload(page, thread_id)
            except (CheckFailed, PlaywrightError, AssertionError) as error:
                failure = error
                try:
                    page.screenshot(path=screenshot, full_page=True)
                    print(f"screenshot (at the failure): {screenshot}", file=sys.stderr)
                except PlaywrightError as shot_error:
                    print(f"no screenshot: {shot_error}", file=sys.stderr)
                banner = page.locator("#error-text").text_content(timeout=1000) if page.locator("#error").is_visible() else None
                if banner:
                    print(f"the page's error banner: {banner}", file=sys.stderr)
                print(f"the page's status line: {page.locator('#status').text_content(timeout=1000)!r}", file=sys.stderr)
                print("the last SSE events the page handled:", file=sys.stderr)
                try:
                    events = page.evaluate("() => (window.peregrineEvents ? window.peregrineEvents() : [])")
                except PlaywrightError as events_error:
                    events = [f"(not available: {events_error})"]
                for line in events[-40:]:
                    print(f"  {line}", file=sys.stderr)
        finally:
            browser.close()
    if failure is not None:
        print(f"web_ui_check.py FAILED: {type(failure).__name__}: {failure}", file=sys.stderr)
        if not isinstance(failure, CheckFailed):
            traceback.print_exception(failure, file=sys.stderr)
        for problem in problems:
            print(f"  also: {problem}", file=sys.stderr)
        return 1
    if problems:
        print("web_ui_check.py FAILED: the page logged errors:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print("web_ui_check.py: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
