"""Drives Peregrine's web UI (served at `/`) in headless Chromium with Playwright's sync API.

Usage: web_ui_check.py <base_url> <api_key> <screenshot_path>

Run by crates/peregrine-server/tests/web_ui.rs against the hello-world-weather agent on the
scripted LLM server (which answers every weather question with San Francisco's weather). The
flow: the key field after a 401 (a wrong key first, then the right one), a new thread, a
question whose plan and streamed answer show up, the same question in planning mode with the
plan approval (steps shown, the plan JSON in the editor) approved, the thread in the list, a
stream cut after its second token (the page reconnects with Last-Event-ID and shows the same
answer, no token lost or repeated), and after a reload the key from localStorage and the thread's messages from its state. Every wait
is one of Playwright's auto-waiting `expect`s with a timeout. Saves a full-page screenshot
(also when a check fails), and one at the approval beside it (`<name>_approval.png`), and exits non-zero with the failing step on failure.
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

    step("approve: the plan runs and the answer streams in")
    page.click("#approve")
    expect(approval).to_be_hidden(timeout=STEP_TIMEOUT_MS)
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
    step("a stream that breaks is followed again from Last-Event-ID")
    cut = {}
    reconnects = []

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

    page.on("request", on_request)
    page.route("**/runs/stream", cut_stream)
    page.uncheck("#planning-mode")
    page.fill("#message-input", QUESTION)
    page.click("#send")
    runs_finished(page, 4)
    page.unroute("**/runs/stream")
    page.remove_listener("request", on_request)
    check("problem" not in cut, cut.get("problem", ""))
    check("id" in cut, "the run's stream was not cut (no POST …/runs/stream seen)")
    check(reconnects == [cut["id"]], f"reconnects sent Last-Event-ID {reconnects}, expected one with {cut['id']}")
    expect(page.locator("body")).to_have_attribute("data-last-run-status", "success")
    answer = streamed_answer(page, "the answer after the reconnect")
    check(answer == first_answer, f"after the reconnect the answer is {answer}, not {first_answer} (lost or repeated tokens)")
    expect(page.locator('#plan-steps .plan-step[data-status="done"]')).to_have_count(2)
    no_error_banner(page, "after the reconnect")


def check_reload(page, thread_id):
    step("reload: the key comes from localStorage, the thread's messages from its state")
    page.reload()
    expect(page.locator("#status")).not_to_have_text("Connecting…", timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#key-panel")).to_be_hidden()
    expect(page.locator("#thread-list .thread.selected")).to_have_attribute("data-thread-id", thread_id, timeout=STEP_TIMEOUT_MS)
    expect(page.locator(".message.assistant").last).to_contain_text(ANSWER_START, timeout=STEP_TIMEOUT_MS)
    expect(page.locator("#approval")).to_be_hidden()
    no_error_banner(page, "after the reload")


def main():
    if len(sys.argv) != 4:
        print("usage: web_ui_check.py <base_url> <api_key> <screenshot_path>", file=sys.stderr)
        return 2
    base_url, key, screenshot = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
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
            page = context.new_page()
            page.set_default_timeout(STEP_TIMEOUT_MS)
            page.on("pageerror", lambda error: problems.append(f"uncaught exception: {error}"))

            events = []

            def on_console(message):
                if message.type == "debug" and message.text.startswith("event "):
                    events.append(message.text[:1500])  # the page logs each SSE event it handles
                # A refused request (the 401 before the key) is logged by Chromium as a failed load;
                # anything else at error level (a CSP refusal, the page's console.error) counts.
                if message.type == "error" and "Failed to load resource" not in message.text:
                    problems.append(f"console error: {message.text}")

            page.on("console", on_console)
            try:
                thread_id, first_answer = run_flow(page, base_url, key, approval_screenshot)
                check_reconnect(page, first_answer)
                page.screenshot(path=screenshot, full_page=True)
                print(f"screenshot: {screenshot}", flush=True)
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
