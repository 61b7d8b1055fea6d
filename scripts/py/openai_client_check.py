"""The official OpenAI Python client, pointed at a Headroom router, streams and not.

Usage: python openai_client_check.py BASE_URL MODEL
Exits non-zero with a message on the first thing that is wrong.
"""
import sys

from openai import OpenAI


def main() -> None:
    base, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base, api_key="not-needed", max_retries=0, timeout=30)

    # Streaming chat: deltas arrive, the stream ends, the router named the replica.
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=12,
        stream=True,
    )
    replica = raw.headers.get("x-headroom-replica")
    assert replica, "no x-headroom-replica header"
    pieces = []
    usage_chunks = 0
    for chunk in raw.parse():
        if chunk.usage is not None:
            usage_chunks += 1
        for c in chunk.choices:
            if c.delta and c.delta.content:
                pieces.append(c.delta.content)
    text = "".join(pieces)
    assert text.strip(), "streamed chat produced no text"
    assert usage_chunks == 0, "a usage chunk the client did not ask for leaked through"

    # Streaming chat with usage: exactly one usage chunk with sane counts.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert len(usage) == 1, f"expected one usage chunk, got {len(usage)}"
    assert 1 <= usage[0].completion_tokens <= 8, usage[0]

    # Non-streaming completion.
    done = client.completions.create(model=model, prompt="Once upon a time", max_tokens=5)
    assert done.choices and done.choices[0].text, "empty completion"
    assert done.usage.completion_tokens == 5 or done.choices[0].finish_reason == "stop"

    # An unknown model is a clean OpenAI error.
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        raise AssertionError("unknown model was accepted")
    except Exception as e:  # openai.NotFoundError
        assert getattr(e, "status_code", None) == 404, repr(e)

    print(f"openai client OK via {replica}: streamed {len(text)} chars; usage {usage[0].completion_tokens} tokens")


if __name__ == "__main__":
    main()
