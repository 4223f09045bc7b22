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

// POST (GET without a body, or `method`) a relative API path; resolves to the parsed JSON (or a Blob
// for images), rejects with an ApiError that carries the API's own {"error": {code, message, field}}.
async function api(path, body, { binary = false, method = null } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers["Authorization"] = "Bearer " + key;
  const init = { method: method || (body === undefined ? "GET" : "POST"), headers };
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

// Set while the API answers 401/403: every panel waits for a key typed into the header's form.
let keyNeeded = false;

function askForKey(error) {
  keyNeeded = true;
  const form = document.getElementById("key-form");
  form.hidden = false;
  document.getElementById("key-message").textContent =
    error.status === 403 ? "That key was refused (" + error.message + ")." : "";
  const status = document.getElementById("model-status");
  status.textContent = "API key needed";
  status.classList.add("needs-key");
  document.getElementById("encoders-status").textContent = "";
  updatePanels();
  document.getElementById("key-input").focus();
}

// An input the page refuses before sending anything: shown like an API error, on the input's field.
class InputError extends Error {
  constructor(message, inputId) {
    super(message);
    this.inputId = inputId;
  }
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
  if (error instanceof InputError) {
    box.append(el("strong", {}, "Not sent"), ": ", el("span", { class: "error-message" }, error.message));
    box.hidden = false;
    const input = error.inputId && document.getElementById(error.inputId);
    if (input) input.classList.add("invalid");
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

// The panels: their button (or buttons), their error box, the results an answer fills. (The
// component a panel needs is its section's data-component.)
const PANELS = {
  pair: { button: "pair-run", error: "pair-error", results: ["pair-result"] },
  classify: { button: "classify-run", error: "classify-error", results: ["classify-standard", "classify-comparative"] },
  dense: { button: "dense-run", error: "dense-error", results: ["dense-result", "heatmap-result"] },
  yukino: { button: "yukino-run", error: "yukino-error", results: ["yukino-result"] },
  collections: {
    buttons: ["collection-create-run", "collection-add-run", "collection-search-run"],
    error: "collections-error",
    results: [],
  },
};
const busy = new Set();

// Runs one panel's request: the earlier answer goes first (so none stays beside a new error), the
// button is disabled meanwhile, and an error is shown as the API (or the input check) words it.
async function run(name, work, results = PANELS[name].results) {
  const panel = PANELS[name];
  results.forEach((id) => show(id, false));
  showError(panel.error, null);
  document.querySelectorAll("#" + name + "-panel .invalid").forEach((n) => n.classList.remove("invalid"));
  busy.add(name);
  updatePanels();
  try {
    await work();
  } catch (error) {
    results.forEach((id) => show(id, false));
    const shown = error instanceof ApiError || error instanceof InputError;
    showError(panel.error, shown ? error : new ApiError(0, "error", String(error), null));
  } finally {
    busy.delete(name);
    updatePanels();
  }
}

// Why a panel cannot be used now (null when it can): no API key yet, or a component the serving
// version lacks (GET /models lists each version's components).
function unavailableReason(section) {
  if (keyNeeded) return "API key needed: enter the server's key above.";
  const component = section.dataset.component;
  const version = servingVersion();
  if (!component || !version || version.components.includes(component)) return null;
  return version.ref + " has no '" + component + "' component: " + section.dataset.what +
    " needs a model version published with one. Pick another model, if the server serves one.";
}

function updatePanels() {
  for (const [name, panel] of Object.entries(PANELS)) {
    const section = document.getElementById(name + "-panel");
    const reason = unavailableReason(section);
    const note = section.querySelector(".unavailable");
    note.textContent = reason || "";
    note.hidden = !reason;
    section.classList.toggle("disabled", Boolean(reason));
    for (const button of panel.buttons || [panel.button]) {
      document.getElementById(button).disabled = Boolean(reason) || busy.has(name);
    }
    // The heatmap under a collection's hits is of that collection's version, not of the picked model.
    const shown = panel.results.filter((id) => id !== "heatmap-result" || heat.place === "dense");
    if (reason && section.dataset.component) shown.forEach((id) => show(id, false));
  }
}

// ------------------------------------------------------------------ input checks
// The limits the server publishes (GET /limits); null until read, then only the page's own checks apply.
let limits = null;

// The texts of input `id` (`noun`s, one per line), checked as the server will check them.
function checkTexts(id, texts, min, max, noun) {
  if (texts.length < min) {
    throw new InputError(min === 1 ? "write a " + noun + " first" : "give at least " + min + " " + noun + "s, one per line", id);
  }
  if (max && texts.length > max) {
    throw new InputError("this server takes at most " + max + " " + noun + "s (" + texts.length + " given)", id);
  }
  const seen = new Set();
  for (const text of texts) {
    if (limits && [...text].length > limits.max_text_chars) {
      throw new InputError("“" + text.slice(0, 40) + "…” is longer than " + limits.max_text_chars + " characters", id);
    }
    if (seen.has(text)) throw new InputError("“" + text + "” is given twice", id);
    seen.add(text);
  }
  return texts;
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
  const label = document.getElementById(slotId).dataset.label;
  if (!data) throw new InputError("choose an image for “" + label + "” first", slotId);
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
    keyNeeded = false;
    show("models-error", false);
    fillModelPicker(info.served || []);
    showModel();
    if (!limits) api("limits").then((found) => (limits = found), () => null);
    if (!coll.loaded) run("collections", () => loadCollections());
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

// The store's entry for the version that answers for the picked model ({ref, components, ...}), or null.
function servingVersion() {
  const entry = servedEntry();
  const serving = entry ? entry.serving : modelsInfo && modelsInfo.serving;
  if (!serving) return null;
  const [name, number] = serving.split("@");
  const model = modelsInfo.models.find((m) => m.name === name);
  const version = model && model.versions.find((v) => v.version === number);
  return version ? { ...version, ref: serving } : null;
}

function showModel() {
  const entry = servedEntry();
  const serving = entry ? entry.serving : modelsInfo && modelsInfo.serving;
  const status = document.getElementById("model-status");
  status.textContent = "Model: " + (serving || "loading…");
  status.classList.remove("needs-key");
  const version = servingVersion();
  const encoders = document.getElementById("encoders-status");
  updatePanels();
  if (!version) {
    encoders.textContent = "";
    return;
  }
  encoders.textContent =
    "· text encoders: " + version.text_encoders.join(", ") + " (default " + version.default_text_encoder + ")" +
    " · components: " + (version.components.join(", ") || "none");
  for (const select of document.querySelectorAll(".encoder-select")) {
    const options = [el("option", { value: "" }, "default (" + version.default_text_encoder + ")")];
    for (const name of version.text_encoders) options.push(el("option", { value: name }, name));
    select.replaceChildren(...options);
  }
}

// ------------------------------------------------------------------ panels
function text(id, noun) {
  const value = document.getElementById(id).value.trim();
  return checkTexts(id, value ? [value] : [], 1, 0, noun)[0];
}

async function rankPair() {
  const body = {
    image_a: image("pair-a"),
    image_b: image("pair-b"),
    difference: text("pair-text", "difference text"),
    ...encoderOf("pair-encoder"),
    ...modelOf(),
  };
  const result = await api("rank-pair", body);
  document.getElementById("pair-answer").textContent = result.first;
  document.getElementById("pair-which").textContent = result.first === "a" ? "A" : "B";
  document.getElementById("pair-score").textContent = result.score.toFixed(4);
  document.getElementById("pair-model").textContent = "answered by " + result.model;
  show("pair-result");
}

function comparativesInput(labels) {
  const given = lines("classify-comparatives");
  if (limits && given.length > limits.max_comparatives) {
    throw new InputError("this server takes at most " + limits.max_comparatives + " comparatives", "classify-comparatives");
  }
  return given.map((line) => {
    const [a, b, ...rest] = line.split("|").map((s) => s.trim());
    const text = rest.join("|").trim();
    if (!a || !b || !text) throw new InputError("write each comparative as “a | b | text”: “" + line + "”", "classify-comparatives");
    for (const label of [a, b]) {
      if (!labels.includes(label)) throw new InputError("“" + label + "” is not one of the labels", "classify-comparatives");
    }
    return { a, b, text };
  });
}

// Points of accuracy with their sign, one decimal ("+0.4", "−0.1").
function points(x) {
  const p = (100 * x).toFixed(1);
  return (x >= 0 ? "+" : "−") + p.replace("-", "");
}

// What the version's evaluation measured of its library (eval.json), so a reader does not take the
// comparative column for a gain the data never showed: the dataset with the request's labels first.
function showMeasured(c) {
  const line = document.querySelector("#classify-comparative .measured");
  const m = (c.measured || [])[0];
  line.hidden = !m;
  if (!m) return;
  const noise = Math.abs(m.change) <= 2 * m.change_stderr ? "within noise" : m.change > 0 ? "a gain" : "a loss";
  const where = m.same_labels ? "these labels" : m.classes + " other labels";
  line.textContent = "Measured on " + m.dataset + " (" + where + ", " + m.seeds + (m.seeds === 1 ? " seed" : " seeds") +
    "): accuracy " + m.accuracy_standard.toFixed(3) + " → " + m.accuracy_comparative.toFixed(3) + " with comparatives, " +
    points(m.change) + " ± " + (100 * m.change_stderr).toFixed(1) + " points: " + noise + ".";
}

// Which comparatives were applied, in one line, and their pairs folded away as compact chips.
function showComparative(c) {
  const info = document.querySelector("#classify-comparative .comparative-info");
  const details = document.querySelector("#classify-comparative .pairs");
  showMeasured(c);
  details.hidden = !c.applied || !c.pairs.length;
  if (!c.applied) {
    info.textContent = "Not applied: no comparative matched these labels (source: " + c.source + ").";
    return;
  }
  const n = c.pairs.length;
  info.textContent = "Applied · " + c.source + " · α " + c.alpha;
  details.querySelector("summary").textContent = n + (n === 1 ? " label pair" : " label pairs");
  details.querySelector("ul").replaceChildren(...c.pairs.map(([a, b]) => el("li", {}, a + " ↔ " + b)));
}

async function classify() {
  const picture = image("classify-image");
  const labels = checkTexts("classify-labels", lines("classify-labels"), 2, limits && limits.max_labels, "label");
  const topK = Number(document.getElementById("classify-topk").value);
  if (!Number.isInteger(topK) || topK < 1) throw new InputError("top k is a whole number from 1", "classify-topk");
  const body = { images: [picture], labels, top_k: topK, ...encoderOf("classify-encoder"), ...modelOf() };
  const comparatives = comparativesInput(labels);
  const [standard, comparative] = await Promise.all([
    api("classify", body),
    api("classify?comparative=true", comparatives.length ? { ...body, comparatives } : body),
  ]);
  bars(document.querySelector("#classify-standard .bars"), standard.results[0].top_k);
  bars(document.querySelector("#classify-comparative .bars"), comparative.results[0].top_k);
  showComparative(comparative.comparative);
  show("classify-standard");
  show("classify-comparative");
}

// ------------------------------------------------------------------ the heatmap
// Drawn here from the maps /score/dense returns: one row per token, one column per image token (the
// class token, then the patches row by row). A diverging scale centred on 0, the same in the legend.
const ROW_HEIGHT = 22; // CSS px per token row: its label is set in the page's own font, never shrunk
const MIN_COLUMN = 4;
const MAX_COLUMN = 40;
const COOL = [59, 76, 192];
const WARM = [180, 4, 38];
const MID = [242, 242, 242];
// The last answer's maps, the caption shown (index), its column width (fit: to the box), the row shown
// over the picture (token) and the picture itself.
// `place`: where the map is shown, under the dense panel's table ("dense") or a collection's hits.
const heat = {
  maps: null, tokens: null, functional: null, texts: null,
  index: 0, column: null, fit: true, token: 0, picture: new Image(), place: "dense",
};

// The page has one map, the last one drawn: its box moves to where it was asked for.
async function useHeatmap(place, answer, texts, picture) {
  const box = document.getElementById("heatmap-result");
  if (place === "dense") document.getElementById("dense-error").before(box);
  else document.getElementById("hit-heatmap").append(box);
  Object.assign(heat, { maps: answer.maps, tokens: answer.tokens, functional: answer.functional_words, texts, place });
  heat.picture.src = picture;
  await heat.picture.decode();
}

function colour(value, extent) {
  const t = Math.max(-1, Math.min(1, value / extent));
  const end = t < 0 ? COOL : WARM;
  const mix = (i) => Math.round(MID[i] + (end[i] - MID[i]) * Math.abs(t));
  return "rgb(" + mix(0) + "," + mix(1) + "," + mix(2) + ")";
}

// The patch grid's side (8 for 1 + 64 columns), or 0 when the patches do not make a square.
function gridSide(columns) {
  const side = Math.round(Math.sqrt(columns - 1));
  return side * side === columns - 1 ? side : 0;
}

function extentOf(map) {
  return Math.max(1e-6, ...map.map((row) => Math.max(...row.map(Math.abs))));
}

function drawHeatmap() {
  const map = heat.maps[heat.index];
  const tokens = heat.tokens[heat.index];
  const columns = map[0].length;
  const scroll = document.getElementById("heatmap-scroll");
  if (heat.fit) heat.column = Math.max(MIN_COLUMN, Math.min(MAX_COLUMN, Math.floor((scroll.clientWidth - 2) / columns)));
  const w = heat.column;
  const extent = extentOf(map);
  const canvas = document.getElementById("heatmap-canvas");
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(columns * w * ratio);
  canvas.height = Math.round(map.length * ROW_HEIGHT * ratio);
  canvas.style.width = columns * w + "px";
  canvas.style.height = map.length * ROW_HEIGHT + "px";
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  map.forEach((row, r) =>
    row.forEach((value, c) => {
      ctx.fillStyle = colour(value, extent);
      ctx.fillRect(c * w, r * ROW_HEIGHT, w, ROW_HEIGHT);
    }),
  );
  // Lines after the class token and between patch rows; between token rows.
  const side = gridSide(columns);
  ctx.fillStyle = "#ffffff";
  for (let c = 1; c < columns; c += side || columns) ctx.fillRect(c * w - 0.5, 0, 1, map.length * ROW_HEIGHT);
  for (let r = 1; r < map.length; r++) ctx.fillRect(0, r * ROW_HEIGHT - 0.5, columns * w, 1);
  document.getElementById("heatmap-grid").textContent = side ? side + " × " + side : String(columns - 1);
  const functional = new Set(heat.functional[heat.index]);
  const labels = tokens.map((token, r) => {
    const label = el("div", { class: functional.has(token) ? "token functional" : "token", title: token }, token);
    label.addEventListener("mouseenter", () => drawToken(r));
    label.addEventListener("click", () => drawToken(r));
    return label;
  });
  document.getElementById("heatmap-labels").replaceChildren(...labels);
  drawLegend(extent);
  document.getElementById("heatmap-text").textContent = heat.texts[heat.index];
  canvas.setAttribute("aria-label", "token × patch map of “" + heat.texts[heat.index] + "”: " + tokens.length +
    " token rows, " + columns + " image-token columns; the legend below gives the colour scale");
  readout(null);
  drawToken(heat.token);
}

// One token's row over the picture's centre square: where in the image the token matches.
function drawToken(r) {
  const map = heat.maps[heat.index];
  const side = gridSide(map[0].length);
  const figure = document.querySelector(".token-map");
  figure.hidden = !side || !heat.picture.complete;
  if (figure.hidden) return;
  heat.token = Math.min(r, map.length - 1);
  const canvas = document.getElementById("token-canvas");
  const ctx = canvas.getContext("2d");
  const { naturalWidth: w, naturalHeight: h } = heat.picture;
  const crop = Math.min(w, h);
  ctx.drawImage(heat.picture, (w - crop) / 2, (h - crop) / 2, crop, crop, 0, 0, canvas.width, canvas.height);
  const cell = canvas.width / side;
  const extent = extentOf(map);
  ctx.globalAlpha = 0.65;
  for (let i = 0; i < side * side; i++) {
    ctx.fillStyle = colour(map[heat.token][i + 1], extent);
    ctx.fillRect((i % side) * cell, Math.floor(i / side) * cell, cell, cell);
  }
  ctx.globalAlpha = 1;
  document.getElementById("token-caption").textContent = "“" + heat.tokens[heat.index][heat.token] + "” over the image";
  document.querySelectorAll("#heatmap-labels .token").forEach((n, i) => n.classList.toggle("picked", i === heat.token));
}

function drawLegend(extent) {
  const canvas = document.getElementById("legend-canvas");
  const ctx = canvas.getContext("2d");
  for (let x = 0; x < canvas.width; x++) {
    ctx.fillStyle = colour(((2 * x) / (canvas.width - 1) - 1) * extent, extent);
    ctx.fillRect(x, 0, 1, canvas.height);
  }
  const ticks = [-1, -0.5, 0, 0.5, 1].map((t) => el("span", {}, (t * extent).toFixed(1)));
  document.getElementById("legend-ticks").replaceChildren(...ticks);
}

// What the pointer is on: the token, the image token, the value.
function readout(event) {
  const box = document.getElementById("heatmap-readout");
  const map = heat.maps[heat.index];
  if (!event) {
    box.textContent = "Point at (or tap) a cell for its value.";
    return;
  }
  const rect = event.target.getBoundingClientRect();
  const c = Math.floor((event.clientX - rect.left) / heat.column);
  const r = Math.floor((event.clientY - rect.top) / ROW_HEIGHT);
  if (r < 0 || r >= map.length || c < 0 || c >= map[0].length) return;
  const side = gridSide(map[0].length);
  const where = c === 0 ? "the class token"
    : side ? "patch row " + (Math.floor((c - 1) / side) + 1) + ", column " + (((c - 1) % side) + 1) : "patch " + c;
  box.textContent = "“" + heat.tokens[heat.index][r] + "” × " + where + ": " + map[r][c].toFixed(2);
  if (r !== heat.token) drawToken(r);
}

function zoom(factor) {
  heat.fit = factor === null;
  if (!heat.fit) heat.column = Math.max(MIN_COLUMN, Math.min(MAX_COLUMN, Math.round(heat.column * factor)));
  drawHeatmap();
}

function showHeatmap(index) {
  heat.index = index;
  // Over the image first: the word (neither <start>/<end> nor a functional word) with the highest value.
  const functional = new Set(heat.functional[index]);
  const words = heat.maps[index].map((row, r) => [r, Math.max(...row)]).slice(1, -1)
    .filter(([r]) => !functional.has(heat.tokens[index][r]));
  heat.token = words.length ? words.reduce((a, b) => (b[1] > a[1] ? b : a))[0] : 0;
  document.querySelectorAll("#dense-result tbody tr")
    .forEach((row, i) => row.classList.toggle("shown", heat.place === "dense" && i === index));
  show("heatmap-result");
  drawHeatmap();
}

async function dense() {
  const picture = image("dense-image");
  const texts = checkTexts("dense-texts", lines("dense-texts"), 1, limits && limits.max_texts, "caption");
  const result = await api("score/dense", { image: picture, texts, return_maps: true, ...modelOf() });
  await useHeatmap("dense", result, texts, picture.data);
  const rows = texts.map((caption, i) => {
    const button = el("button", { type: "button", class: "heatmap-button" }, "map");
    button.addEventListener("click", async () => {
      // The map went to a collection's hit meanwhile: this answer's maps come back with it.
      if (heat.place !== "dense") await useHeatmap("dense", result, texts, picture.data);
      showHeatmap(i);
    });
    return el("tr", { class: i === result.best ? "best" : "" }, el("td", {}, caption),
      el("td", { class: "score" }, result.scores[i].toFixed(3)), el("td", {}, result.cosine[i].toFixed(3)),
      el("td", { class: "functional" }, result.functional_words[i].join(", ") || "—"), el("td", {}, button));
  });
  document.querySelector("#dense-result tbody").replaceChildren(...rows);
  document.getElementById("dense-model").textContent =
    "Best: caption " + (result.best + 1) + " · " + result.model + " · functional words use the scorer's fixed rows";
  show("dense-result");
  showHeatmap(result.best);
}

async function yukino() {
  const picture = image("yukino-image");
  const captions = checkTexts("yukino-texts", lines("yukino-texts"), 2, limits && limits.max_labels, "caption");
  const result = await api("classify", {
    images: [picture],
    labels: captions,
    templates: ["{}"],
    method: "yukino",
    top_k: captions.length,
    ...modelOf(),
  });
  bars(document.querySelector("#yukino-result .bars"), result.results[0].top_k, "score");
  show("yukino-result");
}

// ------------------------------------------------------------------ collections
// The API keeps no way to fetch a stored image: the thumbnails (and the pictures under the maps) are
// the images this page added since it opened, by collection and id; other hits show their id.
const ADD_CHUNK = 16; // items per POST .../images: under the server's default bound (64) and quick to answer
const COLLECTION_NAME = /^[a-z0-9][a-z0-9_-]{0,63}$/; // the API's rule for a name
// The collections GET /collections listed, the images added here, and the search the pages belong to.
const coll = { list: [], loaded: false, added: new Map(), query: null, offset: 0 };

// A collection dropped and created again under its name is another collection: its creation time tells.
function addedKey(info, id) {
  return info.name + "\n" + info.created_at + "\n" + id;
}

function chosenCollection() {
  const name = document.getElementById("collection-select").value;
  return coll.list.find((info) => info.name === name) || null;
}

function requireCollection() {
  const info = chosenCollection();
  if (!info) throw new InputError("create a collection first (or pick one)", "collection-name");
  return info;
}

async function loadCollections(chosen = null) {
  const found = await api("collections");
  coll.list = found.collections;
  coll.loaded = true;
  const select = document.getElementById("collection-select");
  const keep = chosen || select.value;
  const options = coll.list.map((info) => el("option", { value: info.name }, info.name + " · " + info.model));
  if (!options.length) options.push(el("option", { value: "" }, "none yet: create one"));
  select.replaceChildren(...options);
  if (coll.list.some((info) => info.name === keep)) select.value = keep;
  showCollection();
}

function showCollection() {
  const info = chosenCollection();
  const rerank = document.getElementById("search-rerank");
  document.getElementById("collection-info").textContent = info
    ? "bound to " + info.model + " (created on " + info.entry + ") · " + info.count +
      (info.count === 1 ? " item" : " items") + (info.dense ? " · keeps DCSM features" : " · no DCSM features")
    : "";
  // A re-rank needs the DCSM features a collection keeps when its version has a DCSM scorer.
  rerank.disabled = Boolean(info && !info.dense) || document.getElementById("search-mode").value !== "text";
  if (rerank.disabled) rerank.checked = false;
  document.getElementById("search-rerank-label").title =
    info && !info.dense ? info.model + " has no DCSM scorer: this collection keeps no DCSM features" : "";
}

function showSearchMode() {
  const mode = document.getElementById("search-mode").value;
  show("search-image", mode !== "text");
  show("search-text-label", mode === "text");
  show("search-difference-label", mode === "difference");
  showCollection();
}

async function createCollection() {
  const input = document.getElementById("collection-name");
  const name = input.value.trim();
  if (!name) throw new InputError("write the new collection's name first", "collection-name");
  if (!COLLECTION_NAME.test(name)) {
    throw new InputError("a name is 1-64 of a-z, 0-9, _ and -, starting with a letter or digit", "collection-name");
  }
  const info = await api("collections/" + name, modelOf(), { method: "PUT" });
  input.value = "";
  await loadCollections(info.name);
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

// The metadata box: nothing, one object for every file, or one object per file name.
function metadataFor(files) {
  const id = "collection-metadata";
  const raw = document.getElementById(id).value.trim();
  if (!raw) return () => ({});
  let given;
  try {
    given = JSON.parse(raw);
  } catch (error) {
    throw new InputError("the metadata is not JSON (" + error.message + ")", id);
  }
  if (!isObject(given)) throw new InputError("the metadata is one JSON object, {…}", id);
  // Metadata values are strings, numbers or booleans: an object of objects is one per file name.
  const values = Object.values(given);
  if (!values.length || !values.every(isObject)) return () => given;
  const names = new Set(files.map((file) => file.name));
  const unknown = Object.keys(given).filter((name) => !names.has(name));
  if (unknown.length) throw new InputError("the metadata names “" + unknown[0] + "”, which is not a picked file", id);
  return (name) => given[name] || {};
}

async function addImages() {
  const info = requireCollection();
  const files = [...document.getElementById("collection-files").files];
  if (!files.length) throw new InputError("pick one or more image files first", "collection-files");
  const metadata = metadataFor(files);
  const items = await Promise.all(
    files.map(async (file) => ({ id: file.name, image: { data: await readFile(file) }, metadata: metadata(file.name) })),
  );
  const note = document.getElementById("collection-added");
  let count = info.count;
  for (let start = 0; start < items.length; start += ADD_CHUNK) {
    const chunk = items.slice(start, start + ADD_CHUNK);
    const answer = await api("collections/" + info.name + "/images", { items: chunk });
    // An add is all or nothing: its images are the collection's once it answers.
    for (const item of chunk) coll.added.set(addedKey(info, item.id), item.image.data);
    count = answer.count;
    note.textContent = "added " + (start + chunk.length) + " of " + items.length + " · embedded by " + answer.model;
  }
  note.textContent = "added " + items.length + (items.length === 1 ? " image" : " images") +
    " · the collection holds " + count;
  await loadCollections(info.name);
}

// A JSON object of metadata values (or nothing) from input `id`.
function filtersOf(id) {
  const raw = document.getElementById(id).value.trim();
  if (!raw) return {};
  let given;
  try {
    given = JSON.parse(raw);
  } catch (error) {
    throw new InputError("the filter is not JSON (" + error.message + ")", id);
  }
  if (!isObject(given)) throw new InputError("the filter is one JSON object, {\"key\": value, …}", id);
  return given;
}

// The request body of the search the form describes (its page comes later).
function searchBody() {
  const mode = document.getElementById("search-mode").value;
  let body;
  if (mode === "text") {
    body = { text: text("search-text", "search text") };
    if (document.getElementById("search-rerank").checked) body.rerank = "dense";
  } else if (mode === "image") {
    body = { image: image("search-image") };
  } else {
    body = { image: image("search-image"), difference: text("search-difference", "difference text") };
  }
  const filters = filtersOf("search-filters");
  if (Object.keys(filters).length) body.filters = filters;
  return body;
}

async function search() {
  const info = requireCollection();
  const body = searchBody();
  const limit = Number(document.getElementById("search-limit").value);
  if (!Number.isInteger(limit) || limit < 1) throw new InputError("hits per page is a whole number from 1", "search-limit");
  coll.query = { info, body, limit };
  await searchPage(0);
}

// One page of the last search (its collection, query and page size as they were when it was sent).
async function searchPage(offset) {
  const { info, body, limit } = coll.query;
  const answer = await api("collections/" + info.name + "/search", { ...body, limit, offset });
  coll.offset = offset;
  const cards = answer.hits.map((hit, i) => hitCard(hit, offset + i + 1, answer.model));
  if (!cards.length) {
    const why = offset ? "no hits past the last one" : body.filters ? "no item matches the filter" : "the collection is empty";
    cards.push(el("p", { class: "hint no-hits" }, "No hits: " + why + "."));
  }
  document.getElementById("hit-grid").replaceChildren(...cards);
  const last = offset + answer.hits.length;
  document.getElementById("search-summary").textContent = "answered by " + answer.model + " · " + answer.candidates +
    " first-stage candidates · ranked by " + (answer.hits.length ? answer.hits[0].stage : "—");
  document.getElementById("page-shown").textContent = answer.hits.length ? "hits " + (offset + 1) + "–" + last : "";
  // Past a second stage's candidates (or the collection's items) there is nothing more to rank.
  const ranked = body.rerank || body.difference ? answer.candidates : info.count;
  document.getElementById("page-previous").disabled = offset === 0;
  document.getElementById("page-next").disabled = answer.hits.length < limit || last >= ranked;
  document.getElementById("hit-click-hint").textContent = body.text
    ? "Click a hit for the DCSM token × patch map of the search text over its image."
    : "A hit's map is of a search text over its image: search by text to draw one with a click.";
  show("hit-heatmap-note", false);
  show("search-result");
}

// What a new search (or page) replaces: its hits, and the map of a hit when one is shown.
function searchResults() {
  return ["search-result", "hit-heatmap-note", ...(heat.place === "collections" ? ["heatmap-result"] : [])];
}

function hitCard(hit, rank, model) {
  const picture = coll.added.get(addedKey(coll.query.info, hit.id));
  const thumb = picture
    ? el("img", { class: "hit-thumb", src: picture, alt: hit.id })
    : el("span", { class: "hit-thumb no-thumb", title: "added elsewhere: the API gives no way to fetch its image" },
      hit.id);
  const score = hit.scores[hit.stage];
  const scores = hit.stage === "cosine" ? "" : " · cosine " + hit.scores.cosine.toFixed(3);
  const card = el("button", { type: "button", class: "hit", "data-id": hit.id },
    thumb, el("span", { class: "hit-id", title: hit.id }, rank + ". " + hit.id),
    el("span", { class: "hit-score" }, hit.stage + " " + score.toFixed(3) + scores),
    el("span", { class: "hit-version" }, model));
  card.addEventListener("click", () => run("collections", () => hitHeatmap(hit, card), ["heatmap-result"]));
  return card;
}

// The DCSM map of the search text over a hit's image, from /score/dense on the collection's version.
async function hitHeatmap(hit, card) {
  const { info, body } = coll.query;
  if (!body.text) throw new InputError("a map is of a search text over a hit: search by text to draw one", null);
  const picture = coll.added.get(addedKey(info, hit.id));
  if (!picture) {
    throw new InputError("“" + hit.id + "” was not added from this page since it opened, and the API gives no way " +
      "to fetch a stored image: its map cannot be drawn here", null);
  }
  const result = await api("score/dense", { image: { data: picture }, texts: [body.text], return_maps: true, model: info.model });
  await useHeatmap("collections", result, [body.text], picture);
  document.querySelectorAll("#hit-grid .hit").forEach((node) => node.classList.toggle("shown", node === card));
  const note = document.getElementById("hit-heatmap-note");
  note.textContent = "“" + hit.id + "”: DCSM " + result.scores[0].toFixed(3) + " · cosine " +
    result.cosine[0].toFixed(3) + " · " + result.model;
  show("hit-heatmap-note");
  showHeatmap(0);
}

// ------------------------------------------------------------------ tabs
function showTab({ load = true } = {}) {
  const collections = location.hash === "#collections";
  show("scoring-tab", !collections);
  show("collections-tab", collections);
  for (const [id, selected] of [["tab-scoring", !collections], ["tab-collections", collections]]) {
    document.getElementById(id).setAttribute("aria-selected", String(selected));
  }
  if (collections && load && !keyNeeded) run("collections", () => loadCollections());
  // A map drawn while its tab was hidden had no width to fit: drawn again now.
  if (heat.maps && heat.fit && !document.getElementById("heatmap-result").hidden) drawHeatmap();
}

// ------------------------------------------------------------------ start
document.querySelectorAll(".slot").forEach(setupSlot);
const WORK = { pair: rankPair, classify, dense, yukino };
for (const [name, work] of Object.entries(WORK)) {
  document.getElementById(PANELS[name].button).addEventListener("click", () => run(name, work));
}
const heatCanvas = document.getElementById("heatmap-canvas");
heatCanvas.addEventListener("mousemove", readout);
heatCanvas.addEventListener("click", readout);
heatCanvas.addEventListener("mouseleave", () => readout(null));
document.getElementById("zoom-in").addEventListener("click", () => zoom(1.5));
document.getElementById("zoom-out").addEventListener("click", () => zoom(1 / 1.5));
document.getElementById("zoom-fit").addEventListener("click", () => zoom(null));
window.addEventListener("resize", () => heat.fit && heat.maps && !document.getElementById("heatmap-result").hidden && drawHeatmap());
// Another model: its version and text encoders (GET /models again: it may have loaded meanwhile).
document.getElementById("model-select").addEventListener("change", () => {
  showModel();
  loadModels();
});
document.getElementById("collection-select").addEventListener("change", showCollection);
document.getElementById("search-mode").addEventListener("change", showSearchMode);
document.getElementById("collection-create").addEventListener("submit", (event) => {
  event.preventDefault();
  run("collections", createCollection);
});
document.getElementById("collection-add-run").addEventListener("click", () => run("collections", addImages));
document.getElementById("collection-search-run").addEventListener("click", () => run("collections", search, searchResults()));
for (const [id, step] of [["page-previous", -1], ["page-next", 1]]) {
  document.getElementById(id).addEventListener("click", () =>
    run("collections", () => searchPage(Math.max(0, coll.offset + step * coll.query.limit)), searchResults()));
}
window.addEventListener("hashchange", () => showTab());
document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, document.getElementById("key-input").value.trim());
  document.getElementById("key-form").hidden = true;
  loadModels();
});
updatePanels();
showSearchMode();
showTab({ load: false }); // the list comes with the models (GET /models tells whether a key is needed)
loadModels();
