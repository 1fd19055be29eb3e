#!/usr/bin/env python3
"""Random mutations of valid OpenAI requests against a running ruda-serve.

Every answer must be JSON, or a stream that ends with `data: [DONE]` and has no error event,
with a status below 500, and the server must keep answering. Run two at once so that bad requests meet good ones in the same batch:

    target/release/ruda-serve llm/models/tiny-qwen3 --bind 127.0.0.1:8123 --max-model-len 128 &
    python3 scripts/fuzz-http.py --port 8123 --requests 1500 --seed 1 &
    python3 scripts/fuzz-http.py --port 8123 --requests 1500 --seed 2

Prints each bad answer and a last line `done N bad B {status: count}`; exits 1 when B > 0.
"""
import argparse
import http.client
import json
import random
import sys
import time

WEIRD = [4, 0.9, "stop", ["a", "b"], True, 7, None, True, False, 0, -1, 1, 2**31, 2**63, -2**63, 1e308, -1e308,
         float("nan"), 0.5, -0.5, "", "x", "\u0000", "\ud7ff" * 3, [], [1], [[]], {}, {"a": 1}, [None], ["a", 1],
         "9" * 400, [0] * 50, -0.0, 3.0, 1e-300]
KEYS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "stream", "logprobs",
        "echo", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "ignore_eos",
        "response_format", "stream_options", "best_of", "suffix", "user", "model", "max_completion_tokens",
        "top_logprobs", "tools", "tool_choice", "messages", "chat_template_kwargs", "min_tokens"]


def mutate(rnd, body):
    b = json.loads(json.dumps(body))
    for _ in range(rnd.choice([1, 1, 1, 2, 3])):
        k = rnd.choice(KEYS)
        r = rnd.random()
        if r < 0.15:
            b.pop(k, None)
        elif r < 0.3 and k == "messages":
            b[k] = [{"role": rnd.choice(["user", "system", "assistant", "tool", "bogus", 1, None]),
                     "content": rnd.choice(WEIRD + ["hey"]),
                     **({"tool_calls": rnd.choice(WEIRD)} if rnd.random() < 0.3 else {})}
                    for _ in range(rnd.randint(0, 3))]
        elif r < 0.4 and k == "response_format":
            schema = rnd.choice(WEIRD + [{"type": "object"}, {"type": "integer", "minimum": 5}])
            b[k] = rnd.choice([{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                               {"type": rnd.choice(WEIRD)}])
        elif r < 0.5 and k == "logit_bias":
            b[k] = {rnd.choice(["1", "-1", "999999999", "x", "0"]): rnd.choice(WEIRD)}
        elif r < 0.6 and k == "tools":
            b[k] = [{"type": "function", "function": {"name": rnd.choice(WEIRD + ["f"]),
                                                      "parameters": rnd.choice(WEIRD + [{"type": "object"}])}}]
        else:
            b[k] = rnd.choice(WEIRD)
    return b


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rnd = random.Random(a.seed)

    def send(method, path, raw=None):
        c = http.client.HTTPConnection(a.host, a.port, timeout=120)
        c.request(method, path, body=raw, headers={"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, r.getheader("content-type") or "", data

    model = json.loads(send("GET", "/v1/models")[2])["data"][0]["id"]
    completion = {"model": model, "prompt": "Hello", "max_tokens": 3, "temperature": 0}
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    bad, statuses = 0, {}
    for _ in range(a.requests):
        path = rnd.choice(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
        body = mutate(rnd, chat if "chat" in path else completion)
        if path == "/detokenize":
            body["tokens"] = rnd.choice(WEIRD + [[1, 2, 3], [999999]])
        raw = json.dumps(body, allow_nan=True)
        if rnd.random() < 0.05:
            raw = raw[:rnd.randint(0, len(raw))]
        raw = raw.encode("utf-8", "surrogatepass")
        if rnd.random() < 0.03:
            raw = raw.replace(b"H", b"\xff")
        try:
            status, ctype, data = send("POST", path, raw)
        except Exception as e:  # no answer at all: the worst finding
            print("NO ANSWER", path, raw[:300], e)
            bad += 1
            time.sleep(1)
            continue
        statuses[status] = statuses.get(status, 0) + 1
        ok = status < 500
        # A stream must end with [DONE] and carry no error event.
        if "event-stream" in ctype and (b'"error"' in data or not data.rstrip().endswith(b"data: [DONE]")):
            ok = False
        if "event-stream" not in ctype:
            try:
                json.loads(data)
            except ValueError:
                ok = False
        if not ok:
            bad += 1
            print("BAD", status, path, raw[:400], data[:300])
    print("done", a.requests, "bad", bad, statuses)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
