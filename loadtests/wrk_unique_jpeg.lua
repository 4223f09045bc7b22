-- wrk script of loadtests/bench_host_path.py: POSTs JSON bodies in which every image is a JPEG
-- never sent before, without encoding a JPEG per request.
--
--   wrk -t1 -c8 -d10s --latency --timeout 60s -s loadtests/wrk_unique_jpeg.lua \
--       http://127.0.0.1:8000/embed -- BASES TEMPLATE CELL
--
-- BASES: one line per base JPEG, "<base64 of its first 6 bytes> <base64 of the rest after the
-- counter>": each JPEG carries a comment segment right after SOI whose 15 bytes, from byte 6 on,
-- are a decimal counter. 6 and 15 are multiples of 3, so the base64 of the whole file is the
-- three parts' base64 joined, and only the 15 counter bytes are encoded here, per image.
-- TEMPLATE: the request body, one line, with @IMG@ where each image's base64 goes.
-- CELL: a number below 10000, different for every wrk run against one server; the counter is
-- CELL (4 digits), the wrk thread (2 digits), the thread's image number (9 digits), so no two
-- images of a whole benchmark share bytes.
--
-- done() prints one line: "HOSTBENCH {json}" with the statuses counted (2xx, 503, other), wrk's
-- socket errors and latency percentiles (microseconds), completed requests and duration.

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local CHARS = {}
for i = 1, 64 do
  CHARS[i - 1] = ALPHABET:sub(i, i)
end

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

-- base64 of a string whose length is a multiple of 3 (no padding)
local function b64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = a * 65536 + b * 256 + c
    out[#out + 1] = CHARS[math.floor(n / 262144)] .. CHARS[math.floor(n / 4096) % 64]
      .. CHARS[math.floor(n / 64) % 64] .. CHARS[n % 64]
  end
  return table.concat(out)
end

local heads, tails, pieces = {}, {}, {}
local cell = 0
n, ok, unavailable, other = 0, 0, 0, 0 -- globals: done() reads them with thread:get

function init(args)
  for line in io.lines(args[1]) do
    local head, tail = line:match("^(%S+) (%S+)$")
    if head then
      heads[#heads + 1] = head
      tails[#tails + 1] = tail
    end
  end
  local f = assert(io.open(args[2], "rb"))
  local template = f:read("*a"):gsub("[\r\n]+$", "")
  f:close()
  local start = 1
  while true do
    local i, j = template:find("@IMG@", start, true)
    if not i then break end
    pieces[#pieces + 1] = template:sub(start, i - 1)
    start = j + 1
  end
  pieces[#pieces + 1] = template:sub(start)
  cell = tonumber(args[3])
  assert(#heads > 0 and #pieces > 1 and cell >= 0 and cell < 10000 and id < 100, "bad arguments")
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  local parts = { pieces[1] }
  for k = 2, #pieces do
    local base = n % #heads + 1
    local counter = string.format("%04d%02d%09d", cell, id, n)
    n = n + 1
    parts[#parts + 1] = heads[base] .. b64(counter) .. tails[base]
    parts[#parts + 1] = pieces[k]
  end
  return wrk.format(nil, nil, nil, table.concat(parts))
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    ok = ok + 1
  elseif status == 503 then
    unavailable = unavailable + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local counts = { ok = 0, unavailable = 0, other = 0, images = 0 }
  for _, thread in ipairs(threads) do
    counts.ok = counts.ok + thread:get("ok")
    counts.unavailable = counts.unavailable + thread:get("unavailable")
    counts.other = counts.other + thread:get("other")
    counts.images = counts.images + thread:get("n")
  end
  local e = summary.errors
  io.write(string.format(
    'HOSTBENCH {"ok": %d, "status_503": %d, "status_other": %d, "images_sent": %d, "requests": %d, '
      .. '"duration_us": %d, "errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, '
      .. '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "max": %d, "mean": %.1f}}\n',
    counts.ok, counts.unavailable, counts.other, counts.images, summary.requests, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
