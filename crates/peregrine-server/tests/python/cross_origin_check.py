"""Attacks a keyless Peregrine server from web pages of other origins in headless Chromium.

Usage: cross_origin_check.py <base_url> <pending_thread> <pending_interrupt> <victim_thread> <control_thread> <control_interrupt> <attacker_origin>...

Run by crates/peregrine-server/tests/web_ui.rs. Pages at other origins (a server of the test on
loopback, opened as http://localhost:<port> and http://127.0.0.1:<port>: Chromium lets such
pages reach loopback, where it blocks public sites; other browsers do not) try every
state-changing route of the server at <base_url> with every request a
page can make: `no-cors` fetches with `text/plain` bodies, CORS fetches with JSON bodies, HTML
forms (url-encoded and text/plain), `navigator.sendBeacon`, and CORS reads of the state. The
plan of <pending_thread> is the one they try to approve, <victim_thread> the one they try to
delete or write to. Then a control: the server's own origin sends the approval of the plan of
<control_thread> the same way, which must work (so the attack requests are real ones). Prints one
JSON object: for each origin, each attempt's outcome.
"""

import json
import sys

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"]

# Every request is made, then its outcome recorded: "opaque" (sent, unreadable), "status N"
# (readable), "error: ..." (the browser did not send it or refused the answer), "submitted".
ATTACK = r"""
async ({base, targets}) => {
  const results = [];
  const approve = JSON.stringify({resume: {approved: true}});
  const record = async (name, attempt) => {
    try { results.push([name, await attempt()]); }
    catch (error) { results.push([name, "error: " + String(error).slice(0, 120)]); }
  };
  const noCors = (method, url, body) => fetch(url, {method, mode: "no-cors", body, credentials: "include"})
    .then((response) => response.type === "opaque" ? "opaque" : "status " + response.status);
  const cors = (method, url, body) => fetch(url, {method, mode: "cors", body, headers: body ? {"Content-Type": "application/json"} : {}})
    .then(async (response) => "status " + response.status + " " + (await response.text()).slice(0, 80));
  const form = (url, enctype, fields) => new Promise((resolve) => {
    const frame = document.createElement("iframe");
    frame.name = "f" + Math.random().toString(16).slice(2);
    document.body.appendChild(frame);
    const element = document.createElement("form");
    element.method = "POST"; element.action = url; element.enctype = enctype; element.target = frame.name;
    for (const [name, value] of Object.entries(fields)) {
      const input = document.createElement("input");
      input.name = name; input.value = value; element.appendChild(input);
    }
    document.body.appendChild(element);
    frame.addEventListener("load", () => resolve("submitted"), {once: true});
    setTimeout(() => resolve("submitted (no load)"), 3000);
    element.submit();
  });
  for (const target of targets) {
    const url = base + target.path;
    const body = target.body === undefined ? undefined : JSON.stringify(target.body);
    await record(target.method + " " + target.path + " no-cors text/plain", () => noCors(target.method, url, body));
    await record(target.method + " " + target.path + " cors json", () => cors(target.method, url, body));
    if (target.method === "POST") {
      // text/plain form: name={"resume":..., value "}" closes a JSON object a lenient parser might read.
      await record("POST " + target.path + " form text/plain", () => form(url, "text/plain", {[approve.slice(0, -1)]: "}"}));
      await record("POST " + target.path + " form urlencoded", () => form(url, "application/x-www-form-urlencoded", {input: "hello"}));
      await record("POST " + target.path + " beacon", async () =>
        navigator.sendBeacon(url, new Blob([body || approve], {type: "text/plain"})) ? "queued" : "refused");
    }
  }
  for (const path of ["/threads", "/threads/" + targets[0].thread + "/state"]) {
    await record("GET " + path + " cors read", () => cors("GET", base + path));
  }
  return results;
}
"""


def targets(pending, pending_interrupt, victim):
    # The attacker is assumed to know the question's id: the guard alone must stop it.
    approve = {"resume": {"approved": True, "interrupt_id": pending_interrupt}}
    return [
        {"method": "POST", "path": f"/threads/{pending}/runs", "body": approve, "thread": pending},
        {"method": "POST", "path": f"/threads/{pending}/runs/wait", "body": approve, "thread": pending},
        {"method": "POST", "path": f"/threads/{pending}/runs/stream", "body": approve, "thread": pending},
        {"method": "POST", "path": f"/threads/{victim}/runs", "body": {"input": "written by another site"}, "thread": victim},
        {"method": "POST", "path": f"/threads/{pending}/runs/unknown-run/cancel", "thread": pending},
        {"method": "POST", "path": "/threads", "body": {}, "thread": pending},
        {"method": "DELETE", "path": f"/threads/{victim}", "thread": victim},
        {
            "method": "POST",
            "path": "/v1/chat/completions",
            "body": {"model": "peregrine-weather", "messages": [{"role": "user", "content": "written by another site"}]},
            "thread": pending,
        },
    ]


def main():
    base, pending, pending_interrupt, victim, control, control_interrupt = sys.argv[1:7]
    attacker_origins = sys.argv[7:]
    results = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for origin in attacker_origins:
            context = browser.new_context()
            page = context.new_page()
            page.goto(origin + "/attack")
            results[origin] = page.evaluate(ATTACK, {"base": base, "targets": targets(pending, pending_interrupt, victim)})
            context.close()
        context = browser.new_context()
        page = context.new_page()
        page.goto(base + "/info")
        control_target = [{"method": "POST", "path": f"/threads/{control}/runs/wait", "body": {"resume": {"approved": True, "interrupt_id": control_interrupt}}, "thread": control}]
        results["same-origin"] = page.evaluate(ATTACK, {"base": base, "targets": control_target})
        context.close()
        browser.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
