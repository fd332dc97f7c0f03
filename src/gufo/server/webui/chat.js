// gufo's chat page: a conversation streamed from /v1/chat/completions (server-sent events read with
// fetch), stopped with an AbortController. Plain browser JavaScript, no dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const history = []; // the conversation as OpenAI messages (the system prompt is added per request)
let controller = null; // the running request's AbortController

function headers() {
  const key = $("api-key").value.trim();
  return { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) };
}

function show(role, text) {
  const node = document.createElement("div");
  node.className = `message ${role}`;
  node.dataset.role = role;
  node.textContent = text;
  $("conversation").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

async function loadModel() {
  try {
    const answer = await fetch("/v1/models", { headers: headers() });
    const body = await answer.json();
    $("model").textContent = answer.ok ? body.data[0].id : body.error.message;
  } catch (err) {
    $("model").textContent = `unreachable: ${err}`;
  }
}

// Each server-sent event's data lines, as they arrive; a partial line waits for the next chunk.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim());
      if (data.length) yield data.join("\n");
    }
  }
}

function setRunning(running) {
  $("send").disabled = running;
  $("stop").disabled = !running;
}

async function send(text) {
  history.push({ role: "user", content: text });
  show("user", text);
  const reply = show("assistant", "");
  const system = $("system").value.trim();
  const request = {
    messages: [...(system ? [{ role: "system", content: system }] : []), ...history],
    stream: true,
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  controller = new AbortController();
  setRunning(true);
  $("status").textContent = "generating…";
  let first = null;
  let pieces = 0;
  let rate = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(request),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error((await response.json()).error.message);
    for await (const data of events(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices[0]?.delta?.content;
      if (delta) {
        first ??= performance.now();
        pieces += 1;
        reply.textContent += delta;
        reply.scrollIntoView({ block: "end" });
      }
      if (chunk.timings) rate = chunk.timings.predicted_per_second;
    }
    $("status").textContent = `${(rate ?? 0).toFixed(1)} tokens/s`;
  } catch (err) {
    if (err.name === "AbortError") {
      const seconds = first === null ? 0 : (performance.now() - first) / 1000;
      const measured = seconds > 0 ? (pieces - 1) / seconds : 0;
      $("status").textContent = `stopped (${measured.toFixed(1)} tokens/s)`;
    } else {
      reply.classList.add("error");
      reply.textContent += `\n[error: ${err.message}]`;
      $("status").textContent = "error";
    }
  } finally {
    history.push({ role: "assistant", content: reply.textContent });
    controller = null;
    setRunning(false);
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller?.abort());
$("clear").addEventListener("click", () => {
  history.length = 0;
  $("conversation").replaceChildren();
  $("status").textContent = "";
});
$("api-key").addEventListener("change", loadModel);
loadModel();
