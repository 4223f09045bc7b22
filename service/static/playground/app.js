// The playground: plain JavaScript over the public JSON API, nothing else. Images are read in the
// browser (FileReader) and sent as base64 data URIs, exactly as any other client sends them.
"use strict";

// Example images from the shapes world (scripts/render_examples.py renders them).
const EXAMPLES = [
  ["big_circle.png", "a large red circle"],
  ["small_circle.png", "a small red circle"],
  ["red.png", "a red circle"],
  ["blue.png", "a blue square"],
  ["scene.png", "a red circle left of a blue square"],
  ["large.png", "a large yellow square"],
  ["small.png", "a small yellow square"],
];
const KEY_STORAGE = "clip-playground-api-key";

// ------------------------------------------------------------------ API calls
class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

// POST or GET a relative API path; resolves to the parsed JSON (or a Blob for images), rejects with
// an ApiError that carries the API's own {"error": {code, message, field}}.
async function api(path, body, { binary = false } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers["Authorization"] = "Bearer " + key;
  const init = { method: body === undefined ? "GET" : "POST", headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "network_error", "the server could not be reached: " + err.message, null);
  }
  if (response.ok) return binary ? response.blob() : response.json();
  let detail = null;
  try {
    detail = (await response.json()).error;
  } catch (_) {
    // not the JSON envelope (a proxy in between, for example): the status line says what we know
  }
  const error = detail
    ? new ApiError(response.status, detail.code, detail.message, detail.field)
    : new ApiError(response.status, "http_" + response.status, response.statusText || "request failed", null);
  if (response.status === 401 || response.status === 403) askForKey(error);
  throw error;
}

function askForKey(error) {
  const form = document.getElementById("key-form");
  form.hidden = false;
  document.getElementById("key-message").textContent =
    error.status === 403 ? "That key was refused (" + error.message + ")." : "";
  document.getElementById("key-input").focus();
}

// ------------------------------------------------------------------ small DOM helpers
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function show(id, visible = true) {
  document.getElementById(id).hidden = !visible;
}

function showError(id, error) {
  const box = document.getElementById(id);
  box.replaceChildren();
  if (!error) {
    box.hidden = true;
    return;
  }
  const status = error.status ? " (" + error.status + ")" : "";
  box.append(el("strong", { class: "error-code" }, (error.code || "error") + status), ": ",
    el("span", { class: "error-message" }, error.message));
  if (error.field) box.append(" ", el("span", { class: "error-field" }, "field: " + error.field));
  box.hidden = false;
}

function lines(id) {
  return document.getElementById(id).value.split("\n").map((s) => s.trim()).filter((s) => s.length > 0);
}

function encoderOf(id) {
  const value = document.getElementById(id).value;
  return value ? { encoder: value } : {};
}

// The model the picker names ({} for the server's default: requests then leave `model` out).
function modelOf() {
  const value = document.getElementById("model-select").value;
  return value ? { model: value } : {};
}

// Runs one panel's request: disables its button meanwhile and shows the API's error if any.
async function run(buttonId, errorId, work) {
  const button = document.getElementById(buttonId);
  button.disabled = true;
  showError(errorId, null);
  try {
    await work();
  } catch (error) {
    showError(errorId, error instanceof ApiError ? error : new ApiError(0, "error", String(error), null));
  } finally {
    button.disabled = false;
  }
}

// ------------------------------------------------------------------ image slots
// Each slot holds one image as a data URI: dropped, picked with the file input, or an example.
const slots = {};

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function setupSlot(node) {
  const preview = el("img", { class: "preview", alt: node.dataset.label });
  const name = el("span", { class: "file-name" });
  const picker = el("input", { type: "file", accept: "image/*", class: "file-input" });
  const examples = el("select", { class: "example-select" }, el("option", { value: "" }, "example…"));
  for (const [file, title] of EXAMPLES) examples.append(el("option", { value: file }, title));
  node.replaceChildren(el("div", { class: "slot-label" }, node.dataset.label), preview, name,
    el("div", { class: "slot-inputs" }, picker, examples));
  const slot = { data: null };
  slots[node.id] = slot;

  async function use(dataUri, label) {
    slot.data = dataUri;
    preview.src = dataUri;
    name.textContent = label;
    node.classList.add("filled");
  }
  async function useFile(file) {
    if (!file) return;
    await use(await readFile(file), file.name);
    examples.value = "";
  }
  async function useExample(file) {
    const response = await fetch("playground/examples/" + file);
    if (!response.ok) throw new Error("example " + file + " is missing (" + response.status + ")");
    await use(await readFile(await response.blob()), file);
    examples.value = file;
  }
  picker.addEventListener("change", () => useFile(picker.files[0]));
  examples.addEventListener("change", () => examples.value && useExample(examples.value));
  node.addEventListener("dragover", (event) => {
    event.preventDefault();
    node.classList.add("dragging");
  });
  node.addEventListener("dragleave", () => node.classList.remove("dragging"));
  node.addEventListener("drop", (event) => {
    event.preventDefault();
    node.classList.remove("dragging");
    useFile(event.dataTransfer.files[0]);
  });
  if (node.dataset.example) useExample(node.dataset.example);
}

function image(slotId) {
  const data = slots[slotId].data;
  if (!data) throw new ApiError(0, "no_image", "choose an image first", slotId);
  return { data };
}

// ------------------------------------------------------------------ results
function bars(container, topK, valueName = "cos") {
  container.replaceChildren();
  for (const item of topK) {
    const percent = (100 * item.probability).toFixed(1);
    const bar = el("div", { class: "bar-fill" });
    bar.style.width = percent + "%";
    container.append(el("div", { class: "bar", "data-label": item.label },
      el("span", { class: "bar-label", title: item.label }, item.label), el("div", { class: "bar-track" }, bar),
      el("span", { class: "bar-value" }, percent + "% · " + valueName + " " + item.cosine.toFixed(3))));
  }
}

// What GET /models said last: the served set and the store's versions (for their text encoders).
let modelsInfo = null;

async function loadModels() {
  try {
    const info = await api("models");
    modelsInfo = info;
    show("models-error", false);
    fillModelPicker(info.served || []);
    showModel();
    // The server is still loading the model the page uses: ask again until it serves. (One held out
    // of memory by the server's budget loads when a request names it.)
    const entry = servedEntry();
    if (entry ? !entry.serving && entry.state !== "unloaded" : !info.serving) setTimeout(loadModels, 2000);
  } catch (error) {
    showError("models-error", error);
    // 503 while the server loads its model: ask again until it serves.
    if (error.status === 503) setTimeout(loadModels, 2000);
  }
}

// One option per model the server serves; the first (its default) is sent as no `model` at all.
function fillModelPicker(served) {
  const select = document.getElementById("model-select");
  const chosen = select.value;
  const options = served.map((entry, i) => {
    const what = entry.serving ? entry.serving : entry.state === "unloaded" ? "loads on first use" : entry.state;
    const label = entry.ref + " · " + what + (entry.default ? " (default)" : "");
    return el("option", { value: i === 0 ? "" : entry.ref }, label);
  });
  select.replaceChildren(...options);
  if (options.some((option) => option.value === chosen)) select.value = chosen;
  show("model-picker", served.length > 1);
}

// The served entry the picker names (the default one when nothing else is chosen).
function servedEntry() {
  const served = (modelsInfo && modelsInfo.served) || [];
  const value = document.getElementById("model-select").value;
  return served.find((entry) => entry.ref === value) || served[0] || null;
}

function showModel() {
  const entry = servedEntry();
  const serving = entry ? entry.serving : modelsInfo && modelsInfo.serving;
  document.getElementById("model-status").textContent = "Model: " + (serving || "loading…");
  let version = null;
  if (serving) {
    const [name, number] = serving.split("@");
    const model = modelsInfo.models.find((m) => m.name === name);
    version = model ? model.versions.find((v) => v.version === number) : null;
  }
  const encoders = document.getElementById("encoders-status");
  if (!version) {
    encoders.textContent = "";
    return;
  }
  encoders.textContent =
    "· text encoders: " + version.text_encoders.join(", ") + " (default " + version.default_text_encoder + ")" +
    (version.components.length ? " · components: " + version.components.join(", ") : "");
  for (const select of document.querySelectorAll(".encoder-select")) {
    const options = [el("option", { value: "" }, "default (" + version.default_text_encoder + ")")];
    for (const name of version.text_encoders) options.push(el("option", { value: name }, name));
    select.replaceChildren(...options);
  }
}

// ------------------------------------------------------------------ panels
async function rankPair() {
  const body = {
    image_a: image("pair-a"),
    image_b: image("pair-b"),
    difference: document.getElementById("pair-text").value,
    ...encoderOf("pair-encoder"),
    ...modelOf(),
  };
  show("pair-result", false);
  const result = await api("rank-pair", body);
  document.getElementById("pair-answer").textContent = result.first;
  document.getElementById("pair-which").textContent = result.first === "a" ? "A" : "B";
  document.getElementById("pair-score").textContent = result.score.toFixed(4);
  document.getElementById("pair-model").textContent = "answered by " + result.model;
  show("pair-result");
}

function comparativesInput() {
  return lines("classify-comparatives").map((line) => {
    const [a, b, ...text] = line.split("|").map((s) => s.trim());
    return { a, b, text: text.join("|") };
  });
}

async function classify() {
  const labels = lines("classify-labels");
  const body = {
    images: [image("classify-image")],
    labels,
    top_k: Number(document.getElementById("classify-topk").value) || labels.length,
    ...encoderOf("classify-encoder"),
    ...modelOf(),
  };
  const comparatives = comparativesInput();
  show("classify-standard", false);
  show("classify-comparative", false);
  const [standard, comparative] = await Promise.all([
    api("classify", body),
    api("classify?comparative=true", comparatives.length ? { ...body, comparatives } : body),
  ]);
  bars(document.querySelector("#classify-standard .bars"), standard.results[0].top_k);
  bars(document.querySelector("#classify-comparative .bars"), comparative.results[0].top_k);
  const c = comparative.comparative;
  document.querySelector("#classify-comparative .comparative-info").textContent = c.applied
    ? "Applied (" + c.source + ", alpha " + c.alpha + "): " + c.pairs.map(([a, b]) => a + " vs " + b).join("; ")
    : "Not applied: no comparative matched these labels (source: " + c.source + "); standard prompts were used.";
  show("classify-standard");
  show("classify-comparative");
}

async function heatmap(imageObject, text) {
  show("heatmap-result", false);
  const png = await api("score/dense/heatmap", { image: imageObject, text, ...modelOf() }, { binary: true });
  const img = document.getElementById("heatmap-image");
  if (img.src.startsWith("blob:")) URL.revokeObjectURL(img.src);
  img.src = URL.createObjectURL(png);
  await img.decode();
  document.getElementById("heatmap-text").textContent = text;
  show("heatmap-result");
}

async function dense() {
  const picture = image("dense-image");
  const texts = lines("dense-texts");
  show("dense-result", false);
  const result = await api("score/dense", { image: picture, texts, ...modelOf() });
  const rows = texts.map((text, i) => {
    const button = el("button", { type: "button", class: "heatmap-button" }, "heatmap");
    button.addEventListener("click", () => run("dense-run", "dense-error", () => heatmap(picture, text)));
    return el("tr", { class: i === result.best ? "best" : "" }, el("td", {}, text),
      el("td", { class: "score" }, result.scores[i].toFixed(3)), el("td", {}, result.cosine[i].toFixed(3)),
      el("td", { class: "functional" }, result.functional_words[i].join(", ") || "—"), el("td", {}, button));
  });
  document.querySelector("#dense-result tbody").replaceChildren(...rows);
  document.getElementById("dense-model").textContent =
    "Best: caption " + (result.best + 1) + " · " + result.model + " · functional words use the scorer's fixed rows";
  show("dense-result");
  await heatmap(picture, texts[result.best]);
}

async function yukino() {
  const captions = lines("yukino-texts");
  show("yukino-result", false);
  const result = await api("classify", {
    images: [image("yukino-image")],
    labels: captions,
    templates: ["{}"],
    method: "yukino",
    top_k: captions.length,
    ...modelOf(),
  });
  bars(document.querySelector("#yukino-result .bars"), result.results[0].top_k, "score");
  show("yukino-result");
}

// ------------------------------------------------------------------ start
document.querySelectorAll(".slot").forEach(setupSlot);
document.getElementById("pair-run").addEventListener("click", () => run("pair-run", "pair-error", rankPair));
document.getElementById("classify-run").addEventListener("click", () => run("classify-run", "classify-error", classify));
document.getElementById("dense-run").addEventListener("click", () => run("dense-run", "dense-error", dense));
document.getElementById("yukino-run").addEventListener("click", () => run("yukino-run", "yukino-error", yukino));
// Another model: its version and text encoders (GET /models again: it may have loaded meanwhile).
document.getElementById("model-select").addEventListener("change", () => {
  showModel();
  loadModels();
});
document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, document.getElementById("key-input").value.trim());
  document.getElementById("key-form").hidden = true;
  loadModels();
});
loadModels();
