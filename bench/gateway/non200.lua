-- Counting the answers that were not 200, for the wrk scripts here (dofile'd by post.lua and
-- soak.lua): done() prints "non200 N", which the shell scripts read.
-- response() runs in each thread's own Lua state and done() in the main one, so the count
-- is a global of each thread's state, summed through the threads setup() was given.
threads = {}
function setup(thread) table.insert(threads, thread) end

errors = 0
function response(status, headers, body)
  if status ~= 200 then errors = errors + 1 end
end

function done(summary, latency, requests)
  local n = 0
  for _, t in ipairs(threads) do n = n + t:get("errors") end
  io.write(string.format("non200 %d\n", n))
end
