-- wrk script: POST the file named by env BODY with the binary tensor extension's header
-- (Inference-Header-Content-Length from env HLEN); prints one RESULT line at the end.
wrk.method = "POST"
local f = io.open(os.getenv("BODY"), "rb"); wrk.body = f:read("*all"); f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = os.getenv("HLEN")
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
